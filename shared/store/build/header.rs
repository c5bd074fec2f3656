//! The parameter lines of a statement file's leading comment, read by `build.rs` and unit-tested
//! from `src/base/sql.rs` (a build script's own tests never run).
//!
//! A parameter line is `$<n> <name>: <type>`, optionally followed by ` — what it is`: `<n>`
//! counts 1, 2, … in order, `<name>` is snake_case and unique in the file (it becomes a field of
//! the statement's binder), `<type>` is the parameter's type as PostgreSQL's describe names it,
//! in lower case (`uuid`, `text[]`, `int8`, …; [`PG_TYPES`] lists those a binder knows).
//! Any other comment line is prose and may continue a parameter's description.

/// One declared parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    /// As PostgreSQL's describe names it, lower case: `uuid`, `text[]`.
    pub pg_type: String,
    /// What follows ` — ` on its line, if anything.
    pub description: String,
}

/// PostgreSQL's name of each type a parameter may declare, with the marker type in
/// `sql::pg` its binder's field is bounded by (`T: sql::Binds<sql::pg::Uuid>`). An array
/// is its element's name with `[]` and binds `sql::pg::Array<element marker>`.
pub const PG_TYPES: &[(&str, &str)] = &[
    ("bool", "Bool"),
    ("bytea", "Bytea"),
    ("float8", "Float8"),
    ("int4", "Int4"),
    ("int8", "Int8"),
    ("jsonb", "Jsonb"),
    ("name", "Name"),
    ("text", "Text"),
    ("timestamptz", "Timestamptz"),
    ("uuid", "Uuid"),
];

/// The marker a parameter of `pg_type` binds, as a path from `sql::pg`'s parent
/// (`uuid[]` → `pg::Array<pg::Uuid>`), if there is one.
pub fn marker(pg_type: &str) -> Option<String> {
    if let Some(element) = pg_type.strip_suffix("[]") {
        return marker(element)
            .filter(|element| !element.starts_with("pg::Array"))
            .map(|element| format!("pg::Array<{element}>"));
    }
    PG_TYPES
        .iter()
        .find(|(name, _)| *name == pg_type)
        .map(|(_, marker)| format!("pg::{marker}"))
}

/// The declared parameters of a comment (its lines without the `--`), in `$n` order; an error
/// says what to write instead.
pub fn parameters(comment: &[String]) -> Result<Vec<Parameter>, String> {
    let mut declared: Vec<Parameter> = Vec::new();
    for line in comment {
        let Some(rest) = line.trim_start().strip_prefix('$') else {
            continue;
        };
        if !is_parameter_line(rest) {
            continue; // prose that begins with a parameter's number (`$2, of one …`)
        }
        let expected = declared.len() + 1;
        let parsed = parse_line(rest).ok_or_else(|| {
            format!(
                "`--{line}`: write each parameter as `-- ${expected} <name>: <type> — what it is`, \
                 the type as PostgreSQL's describe names it (`uuid`, `text[]`, `int8`)"
            )
        })?;
        let (number, parameter) = parsed;
        if number != expected {
            return Err(format!(
                "`--{line}`: parameter ${number} is declared where ${expected} belongs; declare \
                 $1…$n once each, in order, one line per parameter (a value the SQL uses twice \
                 is one parameter)"
            ));
        }
        if let Some(first) = declared.iter().position(|p| p.name == parameter.name) {
            return Err(format!(
                "`--{line}`: ${} is already named `{}`; give each parameter a name of its own \
                 (it becomes a field of the statement's binder)",
                first + 1,
                parameter.name
            ));
        }
        if marker(&parameter.pg_type).is_none() {
            let known: Vec<&str> = PG_TYPES.iter().map(|(name, _)| *name).collect();
            return Err(format!(
                "`--{line}`: no binder knows the type `{}`; name it as PostgreSQL's describe \
                 does, in lower case ({} or an array of one, `uuid[]`), or add it to `PG_TYPES` \
                 in build/header.rs and a marker with its `Binds` impls in src/base/sql.rs",
                parameter.pg_type,
                known.join(", ")
            ));
        }
        declared.push(parameter);
    }
    Ok(declared)
}

/// Whether a comment line that begins with `$` (taken off) declares a parameter: `<n>:` (the
/// untyped form, refused) or `<n> <word>:`. Any other, `$2, of one organization`, is prose.
fn is_parameter_line(rest: &str) -> bool {
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let rest = &rest[digits..];
    if rest.starts_with(':') {
        return true;
    }
    rest.strip_prefix(' ').is_some_and(|rest| {
        let word = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .count();
        word > 0 && rest[word..].starts_with(':')
    })
}

/// `<n> <name>: <type>[ — what it is]` (the `$` already taken off).
fn parse_line(rest: &str) -> Option<(usize, Parameter)> {
    let (number, rest) = rest.split_once(' ')?;
    let number: usize = number.parse().ok()?;
    let (name, rest) = rest.split_once(':')?;
    let rest = rest.strip_prefix(' ')?;
    let (pg_type, description) = rest.split_once(" — ").unwrap_or((rest, ""));
    let snake = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let typed = !pg_type.is_empty()
        && pg_type
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '[' || c == ']');
    (snake && typed).then(|| {
        (
            number,
            Parameter {
                name: name.to_owned(),
                pg_type: pg_type.to_owned(),
                description: description.trim().to_owned(),
            },
        )
    })
}
