//! Decoding a message whose repeated field may hold more elements than any receiver accepts,
//! without holding more of them than the receiver's limit.
//!
//! An element of a repeated message or string field costs two bytes on the wire when empty,
//! but a whole struct (a `Finding` is about 200 bytes) once decoded: a 1 MiB payload of empty
//! findings would decode into some 100 MB before the findings limit refuses it. [`decode_counted`]
//! decodes every field exactly as `prost::Message::decode` does (so it fails exactly when that
//! fails, with the same error), keeps at most `kept_max` elements of the counted field and
//! drops the others one by one after decoding them, and says how many there were.

use prost::bytes::Buf as _;
use prost::encoding::{DecodeContext, decode_key};

/// A decoded message with at most `kept_max` elements of its counted field, and how many
/// elements the bytes held.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted<M> {
    pub message: M,
    pub count: usize,
}

impl<M> Counted<M> {
    /// Whether every element of the counted field was kept (the message is the whole message).
    pub fn is_whole(&self, kept_max: usize) -> bool {
        self.count <= kept_max
    }
}

/// Decodes `bytes` as `M`, keeping at most `kept_max` elements of the repeated field numbered
/// `tag`; `count` is the number the bytes held. Memory stays within what the kept message and
/// one more element need. Fails exactly when `M::decode(bytes)` fails.
pub fn decode_counted<M: prost::Message + Default>(
    bytes: &[u8],
    tag: u32,
    kept_max: usize,
) -> Result<Counted<M>, prost::DecodeError> {
    decode_counted_among(bytes, &[tag], kept_max)
}

/// [`decode_counted`] for several repeated fields that share one limit (a batch's findings and
/// evaluations): `count` is the number of elements of all of them together, and at most
/// `kept_max` of them, the first on the wire, are kept.
///
/// The loop is `prost::Message::merge`'s own, over `prost::encoding` (public, though hidden
/// from prost's documentation: the generated code calls it); `tests::agrees_with_decode` and
/// the property tests pin that the two agree.
pub fn decode_counted_among<M: prost::Message + Default>(
    bytes: &[u8],
    tags: &[u32],
    kept_max: usize,
) -> Result<Counted<M>, prost::DecodeError> {
    let mut buf = bytes;
    let mut message = M::default();
    let mut dropped = M::default();
    let mut count = 0usize;
    let context = DecodeContext::default();
    while buf.has_remaining() {
        let (field, wire_type) = decode_key(&mut buf)?;
        if tags.contains(&field) {
            count += 1;
            if count > kept_max {
                dropped.merge_field(field, wire_type, &mut buf, context.clone())?;
                dropped.clear();
                continue;
            }
        }
        message.merge_field(field, wire_type, &mut buf, context.clone())?;
    }
    Ok(Counted { message, count })
}

/// How many elements of the repeated field numbered `tag` `bytes` hold, without decoding any
/// field: every field is skipped as `prost` skips an unknown one. For a message with two
/// repeated fields under different limits, check one with this before [`decode_counted`]
/// bounds the other. Fails when the bytes are not a well-formed sequence of fields.
pub fn count_elements(bytes: &[u8], tag: u32) -> Result<usize, prost::DecodeError> {
    let mut buf = bytes;
    let mut count = 0usize;
    while buf.has_remaining() {
        let (field, wire_type) = decode_key(&mut buf)?;
        count += usize::from(field == tag);
        prost::encoding::skip_field(wire_type, field, &mut buf, DecodeContext::default())?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;
    use prost::Message as _;

    const CAPABILITIES_TAG: u32 = 5;

    fn hello(capabilities: usize) -> v1::HelloRequest {
        v1::HelloRequest {
            schema_version: 1,
            worker_id: "w".into(),
            capabilities: (0..capabilities).map(|i| format!("c{i}")).collect(),
            capacity: 2,
            ..Default::default()
        }
    }

    #[test]
    fn agrees_with_decode() {
        let bytes = hello(3).encode_to_vec();
        let counted = decode_counted::<v1::HelloRequest>(&bytes, CAPABILITIES_TAG, 3).unwrap();
        assert_eq!(counted.message, v1::HelloRequest::decode(&*bytes).unwrap());
        assert_eq!(counted.count, 3);
        assert!(counted.is_whole(3));
    }

    #[test]
    fn keeps_at_most_the_limit_and_counts_the_rest() {
        let bytes = hello(10).encode_to_vec();
        let counted = decode_counted::<v1::HelloRequest>(&bytes, CAPABILITIES_TAG, 4).unwrap();
        assert_eq!(counted.count, 10);
        assert!(!counted.is_whole(4));
        assert_eq!(counted.message.capabilities, hello(4).capabilities);
        assert_eq!(
            counted.message.capacity, 2,
            "fields after the dropped ones are kept"
        );
    }

    #[test]
    fn elements_are_counted_without_decoding() {
        let bytes = hello(7).encode_to_vec();
        assert_eq!(count_elements(&bytes, CAPABILITIES_TAG).unwrap(), 7);
        assert_eq!(count_elements(&bytes, 99).unwrap(), 0);
        assert!(count_elements(&[0xff], CAPABILITIES_TAG).is_err());
    }

    #[test]
    fn fields_that_share_a_limit_are_counted_together() {
        let payload = v1::BatchPayload {
            findings: vec![v1::Finding::default(); 3],
            evaluations: vec![v1::Evaluation::default(); 4],
            ..Default::default()
        };
        let bytes = payload.encode_to_vec();
        let counted = decode_counted_among::<v1::BatchPayload>(&bytes, &[1, 3], 5).unwrap();
        assert_eq!(counted.count, 7);
        assert!(!counted.is_whole(5));
        assert_eq!(
            counted.message.findings.len() + counted.message.evaluations.len(),
            5,
            "at most the limit is kept, of both fields together"
        );
        let whole = decode_counted_among::<v1::BatchPayload>(&bytes, &[1, 3], 7).unwrap();
        assert_eq!(whole.message, payload);
    }

    #[test]
    fn a_malformed_dropped_element_still_fails() {
        let mut bytes = hello(2).encode_to_vec();
        // One more capability whose bytes are not UTF-8.
        bytes.extend_from_slice(&[(CAPABILITIES_TAG << 3 | 2) as u8, 1, 0xff]);
        assert!(v1::HelloRequest::decode(&*bytes).is_err());
        assert!(decode_counted::<v1::HelloRequest>(&bytes, CAPABILITIES_TAG, 1).is_err());
    }

    mod hostile {
        use super::*;
        use crate::testing::{any_bytes, batch_payload, cases};
        use proptest::prelude::*;

        const FINDINGS_TAG: u32 = 1;

        /// A batch payload's bytes, some with junk or more empty findings appended.
        fn payload_bytes() -> impl Strategy<Value = Vec<u8>> {
            (batch_payload(), any_bytes(), 0..64usize, any::<bool>()).prop_map(
                |(payload, junk, empty_findings, append_junk)| {
                    let mut bytes = payload.encode_to_vec();
                    for _ in 0..empty_findings {
                        bytes.extend_from_slice(&[(FINDINGS_TAG << 3 | 2) as u8, 0]);
                    }
                    if append_junk {
                        bytes.extend_from_slice(&junk);
                    }
                    bytes
                },
            )
        }

        proptest! {
            #![proptest_config(cases(512))]

            /// Counting decodes exactly what `decode` decodes, keeps at most the limit, and
            /// never holds much more than it keeps.
            #[test]
            fn hostile_decode_counted_agrees_with_decode(
                bytes in prop_oneof![payload_bytes(), any_bytes()],
                kept_max in 0..16usize,
            ) {
                let whole = v1::BatchPayload::decode(&*bytes);
                let counted = decode_counted::<v1::BatchPayload>(&bytes, FINDINGS_TAG, kept_max);
                match (whole, counted) {
                    (Ok(whole), Ok(counted)) => {
                        prop_assert_eq!(counted.count, whole.findings.len());
                        prop_assert!(counted.message.findings.len() <= kept_max);
                        prop_assert!(counted.message.findings.capacity() <= kept_max.max(4) * 2);
                        prop_assert_eq!(&counted.message.findings[..], &whole.findings[..counted.message.findings.len()]);
                        prop_assert_eq!(&counted.message.assets, &whole.assets);
                        if counted.is_whole(kept_max) {
                            prop_assert_eq!(counted.message, whole);
                        }
                    }
                    (Err(_), Err(_)) => {}
                    (whole, counted) => prop_assert!(false, "decode {whole:?}, counted {counted:?}"),
                }
            }
        }

        /// A field claiming far more bytes than the message has is refused before anything
        /// is allocated for it.
        #[test]
        fn hostile_a_field_claiming_a_huge_length_is_refused() {
            let mut bytes = vec![(FINDINGS_TAG << 3 | 2) as u8];
            prost::encoding::encode_varint(u64::MAX >> 2, &mut bytes);
            assert!(decode_counted::<v1::BatchPayload>(&bytes, FINDINGS_TAG, 1).is_err());
            assert!(v1::BatchPayload::decode(&*bytes).is_err());
        }

        /// A million empty findings (2 MB on the wire, some 200 MB decoded) are counted while
        /// only the kept ones are held.
        #[test]
        fn hostile_a_huge_repeated_field_is_counted_not_held() {
            let bytes: Vec<u8> = [(FINDINGS_TAG << 3 | 2) as u8, 0].repeat(1_000_000);
            let counted = decode_counted::<v1::BatchPayload>(&bytes, FINDINGS_TAG, 1_000).unwrap();
            assert_eq!(counted.count, 1_000_000);
            assert_eq!(counted.message.findings.len(), 1_000);
            assert!(counted.message.findings.capacity() <= 2_048);
        }
    }
}
