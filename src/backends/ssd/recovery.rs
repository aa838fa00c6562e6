//! The recovery scan: rebuilds the object index of one region file from its region and
//! object headers when a store opens with `keep_on_restart`. Every adopted object's data
//! is read and its checksum verified, so an object whose write did not complete (a torn
//! or short write, a flipped bit) is absent after a restart, never partly visible.

use super::io::AlignedBuffer;
use super::layout::{object_footprint_bytes, ObjectHeader, RegionHeader, BLOCK_BYTES};
use super::region::Entry;
use crate::backends::checksum;
use crate::model::ObjectId;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

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
    file: &File,
    index: u32,
    region_bytes: u64,
    object_bytes_max: u64,
) -> io::Result<RegionScan> {
    let mut block = AlignedBuffer::new(BLOCK_BYTES as usize);
    let mut scan = RegionScan {
        cursor: BLOCK_BYTES,
        ..RegionScan::default()
    };
    match file.read_exact_at(block.as_mut_slice(), 0) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(scan),
        Err(error) => return Err(error),
    }
    let Some(header) = RegionHeader::decode(block.as_slice()) else {
        return Ok(scan);
    };
    if header.index != index || header.region_bytes != region_bytes {
        return Ok(scan);
    }
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
        let footprint = object_footprint_bytes(object.length_bytes);
        if object.generation != header.sequence
            || object.length_bytes > object_bytes_max
            || header_offset + footprint > region_bytes
        {
            break;
        }
        let padded = (footprint - BLOCK_BYTES) as usize;
        if data.len() < padded {
            data = AlignedBuffer::new(padded);
        }
        let sound = file
            .read_exact_at(
                &mut data.as_mut_slice()[..padded],
                header_offset + BLOCK_BYTES,
            )
            .is_ok()
            && checksum::crc32c(&data.as_slice()[..object.length_bytes as usize])
                == object.data_crc;
        if sound {
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
