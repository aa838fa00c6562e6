//! The recovery scan: rebuilds the object index of one region file from its region and
//! object headers when a store opens with `keep_on_restart`. Every adopted object's data
//! is read and its checksum verified, so an object whose write did not complete (a torn
//! or short write, a flipped bit) is absent after a restart, never partly visible.

use super::disk::RegionFile;
use super::io::AlignedBuffer;
use super::layout::{object_footprint_bytes, ObjectHeader, RegionHeader, BLOCK_BYTES};
use super::region::Entry;
use crate::backends::checksum;
use crate::model::ObjectId;
use std::io;

/// What the scan of one region found.
#[derive(Debug, Default)]
pub struct RegionScan {
    /// The region's fill sequence; `None` when the region holds no sound header (never
    /// written, torn, another layout or region size): the region is free.
    pub sequence: Option<u64>,
    /// Where the scan ended: the first block after the last object of this fill.
    pub cursor: u64,
    /// Objects whose header and data are sound.
    pub objects: Vec<(ObjectId, Entry)>,
    /// Objects with a sound header whose data failed its checksum or was cut short.
    pub torn_objects: u64,
}

/// Scans region `index` of `region_bytes` in `file`. `object_bytes_max` bounds the data
/// buffer; a header claiming more ends the scan.
pub fn scan_region(
    file: &RegionFile,
    index: u32,
    region_bytes: u64,
    object_bytes_max: u64,
) -> io::Result<RegionScan> {
    let mut block = AlignedBuffer::new(BLOCK_BYTES as usize);
    let mut scan = RegionScan {
        cursor: BLOCK_BYTES,
        ..RegionScan::default()
    };
    let Some(header) = region_header(file, &mut block, index, region_bytes)? else {
        return Ok(scan);
    };
    scan.sequence = Some(header.sequence);
    let mut data = AlignedBuffer::new(BLOCK_BYTES as usize);
    while scan.cursor + 2 * BLOCK_BYTES <= region_bytes {
        let header_offset = scan.cursor;
        if file
            .read_exact_at(block.as_mut_slice(), header_offset)
            .is_err()
        {
            break;
        }
        let Some(object) = ObjectHeader::decode(block.as_slice()) else {
            break;
        };
        // The length is checked before the footprint is computed from it: a forged length
        // near `u64::MAX` would overflow it (whatever `object_bytes_max` allows).
        if object.generation != header.sequence
            || object.nonce != header.nonce
            || object.length_bytes > object_bytes_max
        {
            break;
        }
        let footprint = match object.length_bytes.checked_next_multiple_of(BLOCK_BYTES) {
            Some(padded) if padded <= region_bytes => object_footprint_bytes(object.length_bytes),
            _ => break,
        };
        if header_offset.saturating_add(footprint) > region_bytes {
            break;
        }
        let padded = (footprint - BLOCK_BYTES) as usize;
        if data_sound(file, &mut data, &object, header_offset, padded) {
            let entry = Entry {
                region: index,
                header_offset,
                length_bytes: object.length_bytes,
                generation: object.generation,
                data_crc: object.data_crc,
            };
            scan.objects.push((object.object, entry));
        } else {
            scan.torn_objects += 1;
        }
        scan.cursor = header_offset + footprint;
    }
    Ok(scan)
}

/// The header of region `index` of `region_bytes`, read into `block`: `None` when the
/// region holds no sound header of its own (never written, torn, another layout or region
/// size). Errors only when the read fails other than at the end of the file.
fn region_header(
    file: &RegionFile,
    block: &mut AlignedBuffer,
    index: u32,
    region_bytes: u64,
) -> io::Result<Option<RegionHeader>> {
    match file.read_exact_at(block.as_mut_slice(), 0) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let Some(header) = RegionHeader::decode(block.as_slice()) else {
        return Ok(None);
    };
    if header.index != index || header.region_bytes != region_bytes {
        return Ok(None);
    }
    Ok(Some(header))
}

/// Whether the data of `object`, whose header is at `header_offset`, reads whole (its
/// `padded` bytes after the header, into `data`, grown as needed) and matches its checksum.
fn data_sound(
    file: &RegionFile,
    data: &mut AlignedBuffer,
    object: &ObjectHeader,
    header_offset: u64,
    padded: usize,
) -> bool {
    if data.len() < padded {
        *data = AlignedBuffer::new(padded);
    }
    file.read_exact_at(
        &mut data.as_mut_slice()[..padded],
        header_offset + BLOCK_BYTES,
    )
    .is_ok()
        && checksum::crc32c(&data.as_slice()[..object.length_bytes as usize]) == object.data_crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NamespaceId, PrefixDigest};
    use std::os::unix::fs::FileExt;

    fn object(tag: u8) -> ObjectId {
        ObjectId {
            namespace: NamespaceId([tag; 16]),
            prefix: PrefixDigest([tag; 16]),
            shard: 0,
            part: 0,
        }
    }

    /// Writes at `offset` an object header of this fill's `sequence` and `nonce` for
    /// `object`, then its one block of data.
    fn put_object(file: &std::fs::File, offset: u64, object: ObjectId, sequence: u64, nonce: u64) {
        let data = vec![object.namespace.0[0]; BLOCK_BYTES as usize];
        let mut block = vec![0u8; BLOCK_BYTES as usize];
        ObjectHeader {
            object,
            length_bytes: BLOCK_BYTES,
            generation: sequence,
            nonce,
            data_crc: checksum::crc32c(&data),
        }
        .encode(&mut block);
        file.write_all_at(&block, offset).unwrap();
        file.write_all_at(&data, offset + BLOCK_BYTES).unwrap();
    }

    /// A new region file of `region_bytes` in `directory` whose header names fill
    /// `sequence` with `nonce`.
    fn region_file(
        directory: &std::path::Path,
        region_bytes: u64,
        sequence: u64,
        nonce: u64,
    ) -> std::fs::File {
        let file = std::fs::File::create_new(directory.join("region")).unwrap();
        file.set_len(region_bytes).unwrap();
        let mut block = vec![0u8; BLOCK_BYTES as usize];
        RegionHeader {
            region_bytes,
            index: 0,
            sequence,
            nonce,
        }
        .encode(&mut block);
        file.write_all_at(&block, 0).unwrap();
        file
    }

    /// A header of this fill claiming a length near `u64::MAX` ends the scan (found by the
    /// fuzzer: the footprint was computed before the length was checked, and overflowed).
    #[test]
    fn a_header_claiming_an_absurd_length_ends_the_scan() {
        let directory = tempfile::tempdir().unwrap();
        let region_bytes = 8 * BLOCK_BYTES;
        let (sequence, nonce) = (2, 77);
        let file = region_file(directory.path(), region_bytes, sequence, nonce);
        let mut block = vec![0u8; BLOCK_BYTES as usize];
        put_object(&file, BLOCK_BYTES, object(1), sequence, nonce);
        for length_bytes in [u64::MAX, u64::MAX - BLOCK_BYTES, 1 << 62] {
            ObjectHeader {
                object: object(2),
                length_bytes,
                generation: sequence,
                nonce,
                data_crc: 0,
            }
            .encode(&mut block);
            file.write_all_at(&block, 3 * BLOCK_BYTES).unwrap();
            let file = RegionFile::Os(file.try_clone().unwrap());
            for object_bytes_max in [region_bytes, u64::MAX] {
                let scan = scan_region(&file, 0, region_bytes, object_bytes_max).unwrap();
                assert_eq!(scan.objects.len(), 1, "{length_bytes}");
                assert_eq!(scan.cursor, 3 * BLOCK_BYTES);
            }
        }
    }

    /// A stale tail crafted to look like headers of the next fill (its sequence is
    /// predictable; its nonce is not) is not adopted: the scan ends where this fill's
    /// objects end.
    #[test]
    fn a_forged_header_with_the_fills_sequence_but_not_its_nonce_ends_the_scan() {
        let directory = tempfile::tempdir().unwrap();
        let region_bytes = 16 * BLOCK_BYTES;
        let (sequence, nonce) = (5, 0x0123_4567_89ab_cdef);
        let file = region_file(directory.path(), region_bytes, sequence, nonce);
        put_object(&file, BLOCK_BYTES, object(1), sequence, nonce);
        put_object(&file, 3 * BLOCK_BYTES, object(2), sequence, nonce ^ 1);
        put_object(&file, 5 * BLOCK_BYTES, object(3), sequence, nonce);
        let file = RegionFile::Os(file);
        let scan = scan_region(&file, 0, region_bytes, 8 * BLOCK_BYTES).unwrap();
        let adopted: Vec<ObjectId> = scan.objects.iter().map(|(id, _)| *id).collect();
        assert_eq!(adopted, vec![object(1)], "a forged header was adopted");
        assert_eq!(scan.cursor, 3 * BLOCK_BYTES);
    }
}
