//! Untrusted input checks: each function runs one decoder of the wire boundary (frames, every
//! message type, the configuration parser) or of the disk (an SSD region's recovery scan)
//! on arbitrary bytes and says whether the outcome
//! was allowed — a value, or a typed error, never a panic and never an untyped failure.
//! The fuzz targets beside this file (`fuzz/fuzz_targets/`) and the bounded runs in
//! `tests/untrusted_inputs.rs` include it (`#[path]`), so the library carries no harness.

use kvtier_core::config::ClusterConfig;
use kvtier_core::wire::{codec, read_raw_frame, WireError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;

/// Frames one input may hold before the check stops reading: every frame consumes at least
/// its 16-byte header, so this only bounds pathological inputs above 64 KiB.
const FRAMES_PER_INPUT_MAX: usize = 4096;

/// Reads frames from `bytes` until the end or a connection-level error, as a session's
/// reader does. Allowed: frames, [`WireError::UnknownVersion`] (reading goes on), and a
/// final [`WireError::Truncated`], [`WireError::BadMagic`] or [`WireError::Oversized`].
pub fn check_frames(bytes: &[u8]) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|error| format!("no runtime: {error}"))?;
    runtime.block_on(async {
        let mut reader = bytes;
        for _ in 0..FRAMES_PER_INPUT_MAX {
            match read_raw_frame(&mut reader).await {
                Ok(Some(frame)) => {
                    if frame.payload.len() != frame.header.payload_bytes as usize {
                        return Err(format!("payload length differs from {frame:?}"));
                    }
                }
                Ok(None) => return Ok(()),
                Err(WireError::UnknownVersion { .. }) => {}
                Err(WireError::Truncated | WireError::BadMagic { .. })
                | Err(WireError::Oversized { .. }) => return Ok(()),
                Err(other) => return Err(format!("untyped frame error: {other}")),
            }
        }
        Ok(())
    })
}

/// Decodes `bytes` as a `T`. Allowed: [`WireError::Decode`], or a value that encodes again
/// and decodes to itself (so a decoded message can always be answered or forwarded).
pub fn check_message<T>(bytes: &[u8]) -> Result<(), String>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    match codec::decode::<T>(bytes) {
        Err(WireError::Decode { .. }) => Ok(()),
        Err(other) => Err(format!("untyped decode error: {other}")),
        Ok(value) => {
            let encoded = codec::encode(&value).map_err(|error| format!("re-encode: {error}"))?;
            let again = codec::decode::<T>(&encoded).map_err(|error| format!("{error}"))?;
            if again == value {
                Ok(())
            } else {
                Err(format!("{value:?} decodes back as {again:?}"))
            }
        }
    }
}

/// Parses `bytes` as the text of a `cluster.toml`. Any outcome but a panic is allowed: a
/// configuration, or an error naming what is wrong.
pub fn check_config(bytes: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(());
    };
    let _ = ClusterConfig::parse(text, Path::new("/nonexistent"));
    Ok(())
}

/// Region files an SSD store's recovery scan reads after a restart, built from `bytes`: the
/// first byte chooses whether every block that starts with a header's magic gets its header
/// checksum recomputed (odd: so that mutated header fields reach the scan's own checks
/// instead of stopping at the checksum), the rest is the region image (padded to whole
/// blocks, at least three) in an anonymous memory file. Allowed: any scan that adopts only
/// objects lying inside the region whose data passes its checksum, ending at or before the
/// region's end; never a panic or an I/O error.
pub fn check_region_scan(bytes: &[u8]) -> Result<(), String> {
    use kvtier_core::backends::checksum;
    use kvtier_core::backends::ssd::layout::BLOCK_BYTES;
    use kvtier_core::backends::ssd::recovery::scan_region;
    use std::os::unix::fs::FileExt;
    let Some((&mode, bytes)) = bytes.split_first() else {
        return Ok(());
    };
    let region_bytes = (bytes.len() as u64)
        .next_multiple_of(BLOCK_BYTES)
        .max(3 * BLOCK_BYTES);
    let mut image = bytes.to_vec();
    image.resize(region_bytes as usize, 0);
    if mode & 1 == 1 {
        reseal_headers(&mut image);
    }
    let file = anonymous_file().map_err(|error| format!("no memory file: {error}"))?;
    file.write_all_at(&image, 0)
        .map_err(|error| format!("writing the region: {error}"))?;
    let file = kvtier_core::backends::ssd::disk::RegionFile::Os(file);
    let scan = scan_region(&file, 0, region_bytes, region_bytes)
        .map_err(|error| format!("the scan failed: {error}"))?;
    if scan.cursor > region_bytes {
        return Err(format!("the scan ended at {} past the region", scan.cursor));
    }
    for (object, entry) in &scan.objects {
        let start = entry.header_offset.saturating_add(BLOCK_BYTES);
        let end = start.saturating_add(entry.length_bytes);
        let data = usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(start, end)| image.get(start..end));
        let sound = data.is_some_and(|data| checksum::crc32c(data) == entry.data_crc);
        if !sound {
            return Err(format!(
                "adopted {object:?} at {entry:?}, which is not sound"
            ));
        }
    }
    Ok(())
}

/// Recomputes the checksum of every region and object header of `image` (the offsets of
/// `kvtier_core::backends::ssd::layout`: a region header's CRC-32C of bytes 0..48 at 48, an
/// object header's of 0..88 at 88, little endian).
fn reseal_headers(image: &mut [u8]) {
    use kvtier_core::backends::checksum;
    use kvtier_core::backends::ssd::layout::{BLOCK_BYTES, OBJECT_MAGIC, REGION_MAGIC};
    for block in image.chunks_exact_mut(BLOCK_BYTES as usize) {
        let covered = if block[..8] == REGION_MAGIC {
            48
        } else if block[..8] == OBJECT_MAGIC {
            88
        } else {
            continue;
        };
        let crc = checksum::crc32c(&block[..covered]);
        block[covered..covered + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// An anonymous file in memory (`memfd_create`), gone when dropped.
fn anonymous_file() -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: the name is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(c"kvtier-input-check".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened here and is owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}
