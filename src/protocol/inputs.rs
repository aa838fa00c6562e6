//! Untrusted input checks: each function runs one decoder of the wire boundary (frames, every
//! message type, the configuration parser) on arbitrary bytes and says whether the outcome
//! was allowed — a value, or a typed error, never a panic and never an untyped failure.
//! The fuzz targets (`fuzz/`) and the bounded runs in `tests/untrusted_inputs.rs` share them.

use crate::config::ClusterConfig;
use crate::wire::{codec, read_raw_frame, WireError};
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
