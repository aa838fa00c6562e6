//! The wire form of the 128-bit identities ([`super::NamespaceId`], [`super::PrefixDigest`],
//! [`super::SaltGroup`]): one byte string of 16 bytes, not a tuple of 16 numbers.
//!
//! serde writes a `[u8; 16]` as a tuple, which the codec encodes and decodes one byte at a
//! time: a batch of 64 object ids cost 2,048 calls each way, a third of the node's time on
//! a batch of local probes. As bytes it is one length and one copy. Decoding accepts the
//! byte string (the codec) and a sequence of 16 numbers (self-describing formats such as
//! JSON, where both forms read the same); any other length is an error, never a truncation.

use serde::de::{Error, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;

const LENGTH: usize = 16;

/// Serializes `bytes` as one byte string (`#[serde(with = "digest_bytes")]`).
pub(crate) fn serialize<S: Serializer>(
    bytes: &[u8; LENGTH],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_bytes(bytes)
}

/// Reads what [`serialize`] wrote, or a sequence of 16 numbers; anything else is an error.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<[u8; LENGTH], D::Error> {
    deserializer.deserialize_bytes(SixteenBytes)
}

struct SixteenBytes;

impl<'de> Visitor<'de> for SixteenBytes {
    type Value = [u8; LENGTH];

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{LENGTH} bytes")
    }

    fn visit_bytes<E: Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
        <[u8; LENGTH]>::try_from(bytes).map_err(|_| E::invalid_length(bytes.len(), &self))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut bytes = [0u8; LENGTH];
        for (index, byte) in bytes.iter_mut().enumerate() {
            *byte = seq
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(index, &self))?;
        }
        if seq.next_element::<u8>()?.is_some() {
            return Err(A::Error::invalid_length(LENGTH + 1, &self));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{NamespaceId, ObjectId, PrefixDigest};
    use crate::wire::codec;

    fn object() -> ObjectId {
        ObjectId {
            namespace: NamespaceId(*b"0123456789abcdef"),
            prefix: PrefixDigest([0xa5; 16]),
            shard: 3,
            part: 300,
        }
    }

    #[test]
    fn an_object_id_is_two_byte_strings_and_two_numbers_on_the_wire() {
        let bytes = codec::encode(&object()).unwrap();
        // 1 + 16, 1 + 16, a one-byte varint, a three-byte varint.
        assert_eq!(bytes.len(), 17 + 17 + 1 + 3);
        assert_eq!(&bytes[..17], b"\x100123456789abcdef");
        assert_eq!(codec::decode::<ObjectId>(&bytes).unwrap(), object());
    }

    #[test]
    fn a_digest_of_another_length_is_refused() {
        let mut bytes = codec::encode(&object()).unwrap();
        bytes[0] = 15; // the namespace claims 15 bytes
        assert!(codec::decode::<ObjectId>(&bytes).is_err());
        let short = codec::encode(&(&[1u8; 15][..], PrefixDigest::ROOT, 0u16, 0u16)).unwrap();
        assert!(codec::decode::<ObjectId>(&short).is_err());
    }

    #[test]
    fn json_reads_and_writes_sixteen_numbers() {
        let text = serde_json::to_string(&PrefixDigest([7; 16])).unwrap();
        assert_eq!(text, format!("[{}]", ["7"; 16].join(",")));
        assert_eq!(
            serde_json::from_str::<PrefixDigest>(&text).unwrap(),
            PrefixDigest([7; 16])
        );
        assert!(serde_json::from_str::<PrefixDigest>("[1,2,3]").is_err());
        let long = format!("[{}]", ["7"; 17].join(","));
        assert!(serde_json::from_str::<PrefixDigest>(&long).is_err());
    }
}
