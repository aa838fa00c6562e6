//! Where a write batch's bytes come from: slices in memory (a node's spill passes its
//! source replica's bytes in the pool's mapping), copied into the store's aligned staging
//! slot and checksummed chunk by chunk, never through a whole-object buffer of their own.

use super::error::SsdError;
use super::store::VERIFY_CHUNK_BYTES;
use crate::backends::checksum;
use crate::model::ObjectId;

/// The objects of a write batch and their bytes.
pub trait WriteSource {
    /// Objects in the batch.
    fn count(&self) -> usize;
    /// The object of request `request` and its length.
    fn object(&self, request: usize) -> (ObjectId, u64);
    /// Fills `data` (exactly the object's length) with the bytes of request `request`.
    fn fill(&mut self, request: usize, data: &mut [u8]) -> Result<(), SsdError>;

    /// Fills `data` as [`WriteSource::fill`] does and returns the crc32c of the bytes. By
    /// default it fills, then checksums the whole object; a source that can copy in chunks
    /// checksums each chunk right after copying it, reading the bytes from memory once.
    fn fill_checked(&mut self, request: usize, data: &mut [u8]) -> Result<u32, SsdError> {
        self.fill(request, data)?;
        Ok(checksum::crc32c(data))
    }
}

/// Objects whose bytes are in memory.
pub struct Slices<'a>(pub &'a [(ObjectId, &'a [u8])]);

impl WriteSource for Slices<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }

    fn object(&self, request: usize) -> (ObjectId, u64) {
        let (object, bytes) = self.0[request];
        (object, bytes.len() as u64)
    }

    fn fill(&mut self, request: usize, data: &mut [u8]) -> Result<(), SsdError> {
        data.copy_from_slice(self.0[request].1);
        Ok(())
    }

    fn fill_checked(&mut self, request: usize, data: &mut [u8]) -> Result<u32, SsdError> {
        let source = self.0[request].1;
        assert_eq!(
            source.len(),
            data.len(),
            "a staging slice of the object's length"
        );
        let mut crc = 0;
        let chunks = source.chunks(VERIFY_CHUNK_BYTES);
        for (source, copy) in chunks.zip(data.chunks_mut(VERIFY_CHUNK_BYTES)) {
            copy.copy_from_slice(source);
            crc = checksum::crc32c_append(crc, copy);
        }
        Ok(crc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NamespaceId, PrefixDigest};

    #[test]
    fn a_chunked_fill_checksums_the_whole_object() {
        let object = ObjectId {
            namespace: NamespaceId([1; 16]),
            prefix: PrefixDigest([3; 16]),
            shard: 0,
            part: 0,
        };
        for length in [1, 65_535, 65_536, 65_537, 256 << 10, (256 << 10) + 13] {
            let bytes: Vec<u8> = (0..length).map(|at| (at * 7 + at / 251) as u8).collect();
            let items = [(object, &bytes[..])];
            let mut data = vec![0u8; length];
            let crc = Slices(&items).fill_checked(0, &mut data).unwrap();
            assert_eq!(data, bytes);
            assert_eq!(crc, checksum::crc32c(&bytes), "{length} bytes");
        }
    }
}
