//! The message codec: the only module that knows the payload encoding (bincode 2, serde API).
//!
//! Encoding is bincode's standard configuration (little endian, variable-length integers) with
//! a byte limit of [`FRAME_PAYLOAD_BYTES_MAX`], so neither side ever produces or accepts a
//! payload that does not fit in one frame, and a decoder never allocates more than the limit
//! because of a length claimed inside the payload.

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use bincode::enc::write::Writer;
use bincode::error::EncodeError;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::WireError;

/// Largest payload a frame may carry, in bytes: 4 MiB. The codec's limit, so that every
/// encoding fits in one frame; the frame reader refuses longer frames with the same limit.
///
/// Frames carry metadata only (KV bytes move through shared memory or pool transfers), and
/// the largest metadata message is a batch of a few thousand object ids with their locations,
/// well under 1 MiB. 4 MiB leaves headroom for batches while bounding what one peer can make
/// the other buffer per frame: the reader allocates at most this much per frame in flight.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 4 * 1024 * 1024;

type CodecConfig = Configuration<LittleEndian, Varint, Limit<FRAME_PAYLOAD_BYTES_MAX>>;

/// The one configuration both directions use; changing it changes the protocol version.
const CONFIG: CodecConfig = bincode::config::standard().with_limit::<FRAME_PAYLOAD_BYTES_MAX>();

/// Encodes `value` and returns its bytes.
///
/// Promises: the result is at most [`FRAME_PAYLOAD_BYTES_MAX`] bytes and
/// `decode::<T>(&encode(v)?)` returns a value equal to `v`. Errors: [`WireError::Oversized`]
/// when the encoding would exceed the limit (encoding stops there, nothing larger is
/// buffered), [`WireError::Encode`] when serde refuses the value.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let mut buffer = Vec::new();
    encode_append(value, &mut buffer)?;
    Ok(buffer)
}

/// Appends the encoding of `value` to `buffer` and returns how many bytes it added.
///
/// Same limits and errors as [`encode`]; on error `buffer` may hold a partial encoding after
/// its original contents, and the caller discards it. Lets the frame writer put header and
/// payload in one buffer.
pub(crate) fn encode_append<T: Serialize>(
    value: &T,
    buffer: &mut Vec<u8>,
) -> Result<usize, WireError> {
    let mut writer = BoundedWriter {
        buffer,
        written_bytes: 0,
        overflow_bytes: None,
    };
    match bincode::serde::encode_into_writer(value, &mut writer, CONFIG) {
        Ok(()) => Ok(writer.written_bytes),
        Err(error) => match writer.overflow_bytes {
            Some(length) => Err(WireError::Oversized {
                length,
                max: FRAME_PAYLOAD_BYTES_MAX,
            }),
            None => Err(WireError::Encode {
                reason: error.to_string(),
            }),
        },
    }
}

/// Decodes exactly one `T` from `bytes`.
///
/// Errors: [`WireError::Decode`] when the bytes are not a valid encoding of `T`, when a length
/// inside them claims more than [`FRAME_PAYLOAD_BYTES_MAX`] bytes, or when bytes remain after
/// the value (a sender and receiver disagreeing on the type must not pass silently).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    let (value, consumed_bytes) = bincode::serde::decode_from_slice::<T, _>(bytes, CONFIG)
        .map_err(|error| WireError::Decode {
            reason: error.to_string(),
        })?;
    if consumed_bytes != bytes.len() {
        return Err(WireError::Decode {
            reason: format!(
                "{} trailing bytes after the value",
                bytes.len() - consumed_bytes
            ),
        });
    }
    Ok(value)
}

/// A bincode writer that appends to a `Vec` and refuses to grow past the payload limit.
struct BoundedWriter<'a> {
    buffer: &'a mut Vec<u8>,
    written_bytes: usize,
    /// Set to the attempted total length when a write would cross the limit.
    overflow_bytes: Option<usize>,
}

impl Writer for BoundedWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        let total_bytes = self.written_bytes.saturating_add(bytes.len());
        if total_bytes > FRAME_PAYLOAD_BYTES_MAX {
            self.overflow_bytes = Some(total_bytes);
            return Err(EncodeError::Other("frame payload limit reached"));
        }
        self.buffer.extend_from_slice(bytes);
        self.written_bytes = total_bytes;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    /// A message shaped like the protocol's: an enum with unit, tuple and struct variants.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub(crate) enum Sample {
        Empty,
        Number(u64),
        Named {
            id: u32,
            label: String,
            bytes: Vec<u8>,
            delta: Option<i64>,
        },
    }

    pub(crate) fn sample_strategy() -> impl Strategy<Value = Sample> {
        prop_oneof![
            Just(Sample::Empty),
            any::<u64>().prop_map(Sample::Number),
            (
                any::<u32>(),
                ".{0,40}",
                proptest::collection::vec(any::<u8>(), 0..512),
                any::<Option<i64>>()
            )
                .prop_map(|(id, label, bytes, delta)| Sample::Named {
                    id,
                    label,
                    bytes,
                    delta
                }),
        ]
    }

    proptest! {
        #[test]
        fn encode_then_decode_gives_the_same_value(sample in sample_strategy()) {
            let bytes = encode(&sample).unwrap();
            prop_assert!(bytes.len() <= FRAME_PAYLOAD_BYTES_MAX);
            prop_assert_eq!(decode::<Sample>(&bytes).unwrap(), sample);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<Sample>(&bytes);
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = encode(&Sample::Number(7)).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<Sample>(&bytes),
            Err(WireError::Decode { .. })
        ));
    }

    #[test]
    fn oversized_value_is_refused_at_the_limit() {
        let value = vec![0u8; FRAME_PAYLOAD_BYTES_MAX];
        match encode(&value) {
            Err(WireError::Oversized { length, max }) => {
                assert!(length > max);
                assert_eq!(max, FRAME_PAYLOAD_BYTES_MAX);
            }
            other => panic!("expected Oversized, got {other:?}"),
        }
    }

    #[test]
    fn claimed_length_past_the_limit_is_refused_without_allocating() {
        // A Vec<u8> whose varint length prefix claims u64::MAX elements.
        let bytes = [253u8, 255, 255, 255, 255, 255, 255, 255, 255];
        assert!(matches!(
            decode::<Vec<u8>>(&bytes),
            Err(WireError::Decode { .. })
        ));
    }
}
