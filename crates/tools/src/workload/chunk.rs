//! The content of every chunk a tool stores, derived from the chunk's object id alone, and
//! the checks of what a load left in its destination: [`fill`] writes the content,
//! [`poison`] makes a destination differ from it in every byte before a load, [`verify`]
//! finds the first byte that differs after.
//!
//! The content is a keyed stream: a 128-bit key hashed from every field of the id (BLAKE3
//! derived key) seeds two SplitMix64 streams whose outputs alternate, word by word. Nothing
//! repeats inside a chunk (each stream has period 2^64), and a chunk swapped for another,
//! or a destination the load never wrote, is seen at its first word.

use blake3::Hasher;

use kvtier_core::model::ObjectId;
use kvtier_core::rng::SplitMix64;

/// Chunks at least this long have different content whenever their ids differ (up to a
/// collision of the 128-bit content key): the first two words are the first outputs of the
/// two streams, each a bijection of one half of the key.
pub const CONTENT_DISTINCT_BYTES_MIN: usize = BLOCK_BYTES;

/// The first byte of a loaded chunk that is not its object's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("byte {offset_bytes} is {found:#04x}, its object's content has {expected:#04x}")]
pub struct ContentMismatch {
    /// Offset of the byte in the chunk.
    pub offset_bytes: usize,
    /// The byte the content has there.
    pub expected: u8,
    /// The byte the buffer holds.
    pub found: u8,
}

/// Bytes of content one step of [`ContentStream`] yields: one word of each stream.
const BLOCK_BYTES: usize = 16;

/// The content of one object, [`BLOCK_BYTES`] at a time.
struct ContentStream {
    even: SplitMix64,
    odd: SplitMix64,
}

impl ContentStream {
    /// The stream of `object`'s content, keyed by a hash of all its fields.
    fn new(object: &ObjectId) -> Self {
        let mut hasher = Hasher::new_derive_key("kvtier chunk content v1");
        hasher.update(&object.namespace.0);
        hasher.update(&object.prefix.0);
        hasher.update(&object.shard.to_le_bytes());
        hasher.update(&object.part.to_le_bytes());
        let key = hasher.finalize();
        let [even, odd] = [0, 8].map(|start| {
            let mut half = [0u8; 8];
            half.copy_from_slice(&key.as_bytes()[start..start + 8]);
            SplitMix64::new(u64::from_le_bytes(half))
        });
        Self { even, odd }
    }

    /// The next [`BLOCK_BYTES`] of content.
    fn next_block(&mut self) -> [u8; BLOCK_BYTES] {
        let mut block = [0u8; BLOCK_BYTES];
        block[..8].copy_from_slice(&self.even.next_u64().to_le_bytes());
        block[8..].copy_from_slice(&self.odd.next_u64().to_le_bytes());
        block
    }
}

/// Writes `object`'s content into `buffer` (its first `buffer.len()` bytes). Pure and
/// repeatable: the same id and length give the same bytes on every machine and build, and a
/// shorter buffer gets a prefix of a longer one's content.
pub fn fill(object: &ObjectId, buffer: &mut [u8]) {
    let mut stream = ContentStream::new(object);
    for bytes in buffer.chunks_mut(BLOCK_BYTES) {
        bytes.copy_from_slice(&stream.next_block()[..bytes.len()]);
    }
}

/// Writes the complement of `object`'s content into `buffer`: every byte then differs from
/// what [`fill`] writes, so [`verify`] fails at any byte a load leaves untouched, whatever
/// the buffer held before. Call it on each destination before each load.
pub fn poison(object: &ObjectId, buffer: &mut [u8]) {
    let mut stream = ContentStream::new(object);
    for bytes in buffer.chunks_mut(BLOCK_BYTES) {
        let block = stream.next_block().map(|byte| !byte);
        bytes.copy_from_slice(&block[..bytes.len()]);
    }
}

/// Checks that `buffer` holds `object`'s content; on a difference returns the first byte
/// that differs. Allocates nothing.
pub fn verify(object: &ObjectId, buffer: &[u8]) -> Result<(), ContentMismatch> {
    let mut stream = ContentStream::new(object);
    for (block_index, bytes) in buffer.chunks(BLOCK_BYTES).enumerate() {
        let block = stream.next_block();
        let expected = &block[..bytes.len()];
        if bytes != expected {
            let position = bytes
                .iter()
                .zip(expected)
                .position(|(found, expected)| found != expected)
                .unwrap_or(0);
            return Err(ContentMismatch {
                offset_bytes: block_index * BLOCK_BYTES + position,
                expected: expected[position],
                found: bytes[position],
            });
        }
    }
    Ok(())
}

/// The contents of `objects`, `chunk_bytes` each, one after another: what a benchmark
/// stores, chunk `i` being `objects[i]`'s.
pub fn filled(objects: &[ObjectId], chunk_bytes: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; objects.len() * chunk_bytes];
    for (object, chunk) in objects.iter().zip(bytes.chunks_mut(chunk_bytes.max(1))) {
        fill(object, chunk);
    }
    bytes
}

/// Destinations for loading `objects`, `chunk_bytes` each, one after another, each chunk
/// poisoned against its object: equal to [`filled`] of the same arguments only once every
/// byte was loaded. Writing every byte also pre-faults the memory.
pub fn poisoned(objects: &[ObjectId], chunk_bytes: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; objects.len() * chunk_bytes];
    for (object, chunk) in objects.iter().zip(bytes.chunks_mut(chunk_bytes.max(1))) {
        poison(object, chunk);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::model::{NamespaceId, PrefixDigest};
    use std::collections::HashSet;

    fn object(namespace: u8, prefix: u8, shard: u16, part: u16) -> ObjectId {
        ObjectId {
            namespace: NamespaceId([namespace; 16]),
            prefix: PrefixDigest([prefix; 16]),
            shard,
            part,
        }
    }

    fn content(object: &ObjectId, bytes: usize) -> Vec<u8> {
        let mut buffer = vec![0u8; bytes];
        fill(object, &mut buffer);
        buffer
    }

    #[test]
    fn distinct_ids_give_distinct_content_and_an_id_always_the_same() {
        const CHUNK_BYTES: usize = 256 << 10;
        // Ids that differ in one field each, and a benchmark's worth of seeded ids: the
        // 251st chunk of the old repeating pattern is among them.
        let mut ids = vec![
            object(1, 1, 0, 0),
            object(2, 1, 0, 0),
            object(1, 2, 0, 0),
            object(1, 1, 1, 0),
            object(1, 1, 0, 1),
        ];
        let namespace = kvtier_core::model::demo_namespace();
        ids.extend(crate::workload::prefix::seeded_ids(&namespace, 600, 7).unwrap());
        let mut seen = HashSet::new();
        for id in &ids {
            let bytes = content(id, CHUNK_BYTES);
            assert_eq!(bytes, content(id, CHUNK_BYTES), "{id:?} is not repeatable");
            assert_eq!(bytes[..100], content(id, 100)[..], "a prefix of itself");
            assert!(verify(id, &bytes).is_ok());
            assert!(
                seen.insert(bytes[..CONTENT_DISTINCT_BYTES_MIN].to_vec()),
                "{id:?} repeats another id's content"
            );
        }
        // Two distinct ids' chunks differ throughout, not only at the start: no word of
        // one chunk stands at the same place in the other, and none repeats inside one.
        let (first, second) = (
            content(&ids[0], CHUNK_BYTES),
            content(&ids[250], CHUNK_BYTES),
        );
        let words = |bytes: &[u8]| -> Vec<[u8; 8]> {
            bytes
                .chunks(8)
                .map(|word| word.try_into().unwrap())
                .collect()
        };
        let (first, second) = (words(&first), words(&second));
        assert!(first.iter().zip(&second).all(|(a, b)| a != b));
        assert_eq!(first.iter().collect::<HashSet<_>>().len(), first.len());
        assert_eq!(
            verify(&ids[250], &content(&ids[0], 64)).map_err(|m| m.offset_bytes),
            Err(0)
        );
    }

    #[test]
    fn a_poisoned_buffer_differs_from_the_content_in_every_byte() {
        let id = object(4, 5, 0, 0);
        for length in [0, 1, 7, 8, 9, 4096 + 3] {
            let mut buffer = content(&id, length);
            poison(&id, &mut buffer);
            let expected = content(&id, length);
            assert!(buffer.iter().zip(&expected).all(|(a, b)| a != b));
            if length > 0 {
                assert_eq!(verify(&id, &buffer).map_err(|m| m.offset_bytes), Err(0));
            }
            // A load that writes all but the last byte is caught at that byte.
            if length > 1 {
                buffer[..length - 1].copy_from_slice(&expected[..length - 1]);
                let mismatch = verify(&id, &buffer).unwrap_err();
                assert_eq!(mismatch.offset_bytes, length - 1);
                assert_eq!(mismatch.expected, expected[length - 1]);
            }
        }
        let ids = [object(1, 1, 0, 0), object(1, 2, 0, 0)];
        let stored = filled(&ids, 100);
        let mut loaded = poisoned(&ids, 100);
        assert_ne!(loaded, stored);
        fill(&ids[0], &mut loaded[..100]);
        assert_ne!(loaded, stored);
        fill(&ids[1], &mut loaded[100..]);
        assert_eq!(loaded, stored);
    }
}
