//! The on-disk format of the SSD store, the one place that encodes and decodes it.
//!
//! A store is a directory holding `region_count` files named `region-NNNNN.kvtier-ssd`
//! (five decimal digits), each exactly `region_bytes` long, a multiple of [`BLOCK_BYTES`].
//! All integers are little-endian; every offset and length on disk is a multiple of
//! [`BLOCK_BYTES`], so direct I/O (and a later GPUDirect Storage read) can address any
//! object's bytes in place.
//!
//! ```text
//! region file
//!   [0, 4096)        region header
//!   [4096, ...)      objects, back to back: [object header: 4096][data, zero-padded to 4 KiB]
//!
//! region header (one block)            object header (one block)
//!   0..8   magic "KVTSSDRG"              0..8   magic "KVTSSDOB"
//!   8..12  layout version (1)            8..12  layout version (1)
//!   12..16 zero                          12..16 zero
//!   16..24 region bytes                  16..32 object namespace id
//!   24..32 region index                  32..48 object prefix digest
//!   32..40 sequence (the generation)     48..50 shard      50..52 part
//!   40..44 crc32c of bytes 0..40         52..56 zero
//!   rest   zero                          56..64 length of the data in bytes
//!                                        64..72 generation (the region's sequence)
//!                                        72..76 crc32c of the data bytes
//!                                        76..80 crc32c of header bytes 0..76
//!                                        rest   zero
//! ```
//!
//! The region's sequence grows by one each time any region of the store is opened for
//! writing, so the order of sequences is the order regions were filled. An object belongs
//! to its region only while its generation equals the region header's sequence: headers
//! left from an earlier fill of the region carry an older generation and end the scan.
//! A header whose checksum fails also ends the scan of its region (its length cannot be
//! trusted); an object whose header is sound but whose data checksum fails is skipped.

use crate::backends::checksum;
use crate::model::PrefixDigest;
use crate::model::{AllocationId, Generation, Location, NamespaceId, ObjectId, PoolId};

/// The unit of alignment of every offset and length on disk (and of direct I/O buffers).
pub const BLOCK_BYTES: u64 = 4096;

/// Version of this format, written in every header; other versions are not read. 2 added
/// the fill's nonce to region and object headers.
pub const LAYOUT_VERSION: u32 = 2;

/// Magic of a region header.
pub const REGION_MAGIC: [u8; 8] = *b"KVTSSDRG";

/// Magic of an object header.
pub const OBJECT_MAGIC: [u8; 8] = *b"KVTSSDOB";

/// Bytes an object occupies in its region: its header block plus its data rounded up to
/// whole blocks.
pub fn object_footprint_bytes(length_bytes: u64) -> u64 {
    BLOCK_BYTES + length_bytes.next_multiple_of(BLOCK_BYTES)
}

/// Objects of `length_bytes` one region of `region_bytes` holds: its header block, then
/// their footprints back to back.
pub fn objects_per_region(region_bytes: u64, length_bytes: u64) -> u64 {
    region_bytes.saturating_sub(BLOCK_BYTES) / object_footprint_bytes(length_bytes)
}

/// Where a stored object's data is in the store's address space: the regions laid end to
/// end, region `r`'s file at `r × region_bytes`. One offset names one object of one fill;
/// the directory records it as the object's location in the store's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredPlace {
    /// Offset of the data: region index × region size + offset in the region file.
    pub offset_bytes: u64,
    /// Length of the data.
    pub length_bytes: u64,
    /// The region fill that wrote it.
    pub generation: u64,
}

impl StoredPlace {
    /// The place of an object of `length_bytes` whose data is at `data_offset` in the file
    /// of region `region` (of `region_bytes`), written by fill `generation`.
    pub fn new(
        region_bytes: u64,
        region: u32,
        data_offset: u64,
        length_bytes: u64,
        generation: u64,
    ) -> StoredPlace {
        StoredPlace {
            offset_bytes: u64::from(region) * region_bytes + data_offset,
            length_bytes,
            generation,
        }
    }

    /// The location the directory records for it in the store's pool `pool`: the
    /// allocation is the data's offset (one object per offset), the generation the fill.
    pub fn location(&self, pool: PoolId) -> Location {
        Location {
            pool,
            allocation: AllocationId(self.offset_bytes),
            generation: Generation(self.generation),
            offset_bytes: self.offset_bytes,
            length_bytes: self.length_bytes,
        }
    }

    /// The place a location in the store's pool names ([`StoredPlace::location`] undone).
    pub fn of_location(location: &Location) -> StoredPlace {
        StoredPlace {
            offset_bytes: location.offset_bytes,
            length_bytes: location.length_bytes,
            generation: location.generation.0,
        }
    }
}

/// The file name of region `index`.
pub fn region_file_name(index: u32) -> String {
    format!("region-{index:05}.kvtier-ssd")
}

/// A region's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionHeader {
    /// Length of the region file.
    pub region_bytes: u64,
    /// Which region file this is.
    pub index: u32,
    /// The fill this header opened; objects of this fill carry it as their generation.
    pub sequence: u64,
    /// Drawn from the OS at random when the fill opened; objects of this fill carry it.
    /// Nobody can write, before a fill opens, bytes that pass for one of its object
    /// headers: a stale tail that looks like headers (a tenant's data from an earlier fill)
    /// is never adopted by the recovery scan.
    pub nonce: u64,
}

/// One object's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectHeader {
    /// The object whose bytes follow.
    pub object: ObjectId,
    /// Length of the data in bytes (before padding).
    pub length_bytes: u64,
    /// The sequence of the region fill that wrote it.
    pub generation: u64,
    /// The nonce of that fill ([`RegionHeader::nonce`]).
    pub nonce: u64,
    /// crc32c of the data bytes.
    pub data_crc: u32,
}

fn put_u32(block: &mut [u8], at: usize, value: u32) {
    block[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(block: &mut [u8], at: usize, value: u64) {
    block[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(block: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&block[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn get_u64(block: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&block[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn get_16(block: &[u8], at: usize) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&block[at..at + 16]);
    bytes
}

impl RegionHeader {
    /// Writes the header into `block` (at least [`BLOCK_BYTES`] long), zeroing the rest of
    /// the block.
    pub fn encode(&self, block: &mut [u8]) {
        let block = &mut block[..BLOCK_BYTES as usize];
        block.fill(0);
        block[0..8].copy_from_slice(&REGION_MAGIC);
        put_u32(block, 8, LAYOUT_VERSION);
        put_u64(block, 16, self.region_bytes);
        put_u64(block, 24, u64::from(self.index));
        put_u64(block, 32, self.sequence);
        put_u64(block, 40, self.nonce);
        let crc = checksum::crc32c(&block[0..48]);
        put_u32(block, 48, crc);
    }

    /// Reads a header; `None` when the block holds no sound region header of this layout
    /// (never written, torn, another version).
    pub fn decode(block: &[u8]) -> Option<RegionHeader> {
        if block.len() < 52 || block[0..8] != REGION_MAGIC {
            return None;
        }
        if get_u32(block, 8) != LAYOUT_VERSION
            || get_u32(block, 48) != checksum::crc32c(&block[0..48])
        {
            return None;
        }
        Some(RegionHeader {
            region_bytes: get_u64(block, 16),
            index: u32::try_from(get_u64(block, 24)).ok()?,
            sequence: get_u64(block, 32),
            nonce: get_u64(block, 40),
        })
    }
}

impl ObjectHeader {
    /// Writes the header into `block` (at least [`BLOCK_BYTES`] long), zeroing the rest of
    /// the block.
    pub fn encode(&self, block: &mut [u8]) {
        let block = &mut block[..BLOCK_BYTES as usize];
        block.fill(0);
        block[0..8].copy_from_slice(&OBJECT_MAGIC);
        put_u32(block, 8, LAYOUT_VERSION);
        block[16..32].copy_from_slice(&self.object.namespace.0);
        block[32..48].copy_from_slice(&self.object.prefix.0);
        block[48..50].copy_from_slice(&self.object.shard.to_le_bytes());
        block[50..52].copy_from_slice(&self.object.part.to_le_bytes());
        put_u64(block, 56, self.length_bytes);
        put_u64(block, 64, self.generation);
        put_u32(block, 72, self.data_crc);
        put_u64(block, 80, self.nonce);
        let crc = checksum::crc32c(&block[0..88]);
        put_u32(block, 88, crc);
    }

    /// Reads a header; `None` when the block holds no sound object header of this layout.
    pub fn decode(block: &[u8]) -> Option<ObjectHeader> {
        if block.len() < 92 || block[0..8] != OBJECT_MAGIC {
            return None;
        }
        if get_u32(block, 8) != LAYOUT_VERSION
            || get_u32(block, 88) != checksum::crc32c(&block[0..88])
        {
            return None;
        }
        Some(ObjectHeader {
            object: ObjectId {
                namespace: NamespaceId(get_16(block, 16)),
                prefix: PrefixDigest(get_16(block, 32)),
                shard: u16::from_le_bytes([block[48], block[49]]),
                part: u16::from_le_bytes([block[50], block[51]]),
            },
            length_bytes: get_u64(block, 56),
            generation: get_u64(block, 64),
            nonce: get_u64(block, 80),
            data_crc: get_u32(block, 72),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object() -> ObjectId {
        ObjectId {
            namespace: NamespaceId([7; 16]),
            prefix: PrefixDigest([9; 16]),
            shard: 3,
            part: 1,
        }
    }

    #[test]
    fn headers_round_trip_and_any_flipped_byte_is_refused() {
        let header = ObjectHeader {
            object: object(),
            length_bytes: 12345,
            generation: 42,
            nonce: 0x5eed_0bad_cafe_f00d,
            data_crc: 0xdead_beef,
        };
        let mut block = vec![0u8; BLOCK_BYTES as usize];
        header.encode(&mut block);
        assert_eq!(ObjectHeader::decode(&block), Some(header));
        for at in 0..92 {
            let mut flipped = block.clone();
            flipped[at] ^= 0x10;
            assert_eq!(ObjectHeader::decode(&flipped), None, "byte {at}");
        }
        let region = RegionHeader {
            region_bytes: 1 << 20,
            index: 4,
            sequence: 9,
            nonce: 0x1234_5678_9abc_def0,
        };
        region.encode(&mut block);
        assert_eq!(RegionHeader::decode(&block), Some(region));
        assert_eq!(ObjectHeader::decode(&block), None);
        for at in 0..52 {
            let mut flipped = block.clone();
            flipped[at] ^= 0x01;
            assert_eq!(RegionHeader::decode(&flipped), None, "byte {at}");
        }
    }

    #[test]
    fn footprints_are_block_multiples() {
        assert_eq!(object_footprint_bytes(1), 2 * BLOCK_BYTES);
        assert_eq!(object_footprint_bytes(4096), 2 * BLOCK_BYTES);
        assert_eq!(object_footprint_bytes(4097), 3 * BLOCK_BYTES);
        assert_eq!(region_file_name(7), "region-00007.kvtier-ssd");
    }

    #[test]
    fn a_region_holds_whole_footprints_and_places_name_one_offset_each() {
        let region_bytes = 4 << 20;
        assert_eq!(objects_per_region(region_bytes, 64 << 10), 60);
        assert_eq!(objects_per_region(region_bytes, 4 << 20), 0);
        assert_eq!(objects_per_region(region_bytes, 1), 511);
        let place = StoredPlace::new(region_bytes, 2, 5 * BLOCK_BYTES, 100, 9);
        assert_eq!(place.offset_bytes, 2 * region_bytes + 5 * BLOCK_BYTES);
        let location = place.location(PoolId(3));
        assert_eq!(location.allocation, AllocationId(place.offset_bytes));
        assert_eq!(location.generation, Generation(9));
        assert_eq!(StoredPlace::of_location(&location), place);
    }
}
