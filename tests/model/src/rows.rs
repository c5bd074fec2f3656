//! A table's rows in a fixed-capacity array, so that a whole database is `Copy`: the checker
//! copies a state for every step it tries, and a copy without allocation is what keeps an
//! exhaustive run within seconds.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};

/// Up to `N` rows, in the order they were inserted. Equality, ordering and hashing are the
/// rows' alone (a slice's), whatever the unused slots hold.
#[derive(Clone, Copy, Debug)]
pub struct Rows<T: Copy + Default, const N: usize> {
    len: u8,
    items: [T; N],
}

impl<T: Copy + Default + PartialEq, const N: usize> PartialEq for Rows<T, N> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + Eq, const N: usize> Eq for Rows<T, N> {}

impl<T: Copy + Default + Hash, const N: usize> Hash for Rows<T, N> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl<T: Copy + Default + Ord, const N: usize> PartialOrd for Rows<T, N> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: Copy + Default + Ord, const N: usize> Ord for Rows<T, N> {
    fn cmp(&self, other: &Self) -> Ordering {
        (**self).cmp(&**other)
    }
}

impl<T: Copy + Default, const N: usize> Rows<T, N> {
    pub fn new() -> Self {
        Self {
            len: 0,
            items: [T::default(); N],
        }
    }

    /// Appends a row. Exceeding `N` is a bug in the bounds, not an operating condition.
    pub fn push(&mut self, item: T) {
        let index = usize::from(self.len);
        assert!(
            index < N,
            "more than {N} rows: raise the capacity or lower the bounds"
        );
        self.items[index] = item;
        self.len += 1;
    }
}

impl<T: Copy + Default, const N: usize> Default for Rows<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy + Default, const N: usize> Deref for Rows<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items[..usize::from(self.len)]
    }
}

impl<T: Copy + Default, const N: usize> DerefMut for Rows<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..usize::from(self.len)]
    }
}

impl<T: Copy + Default, const N: usize> FromIterator<T> for Rows<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut rows = Self::new();
        for item in iter {
            rows.push(item);
        }
        rows
    }
}

impl<'a, T: Copy + Default, const N: usize> IntoIterator for &'a Rows<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, T: Copy + Default, const N: usize> IntoIterator for &'a mut Rows<T, N> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_compare_by_content() {
        let mut one: Rows<u8, 3> = Rows::new();
        one.push(2);
        one.push(1);
        let two: Rows<u8, 3> = [2, 1].into_iter().collect();
        assert_eq!(one, two);
        assert_eq!(&*one, &[2, 1]);
        one.sort_unstable();
        assert_eq!(&*one, &[1, 2]);
        assert_ne!(one, two);
    }

    #[test]
    #[should_panic(expected = "more than 2 rows")]
    fn rows_refuse_more_than_their_capacity() {
        let mut rows: Rows<u8, 2> = Rows::new();
        for item in 0..3 {
            rows.push(item);
        }
    }
}
