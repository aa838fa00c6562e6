//! `SsdError`, the one error type of the SSD store's boundary, and the reasons a spill is
//! skipped, which the node counts in a metric.

use std::io;
use std::path::PathBuf;

/// Why a spill was skipped: one bounded label set for the skipped-spills metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// The file system is full (`ENOSPC`, `EDQUOT`).
    NoSpace,
    /// The file system is read-only (`EROFS`) or the files are not writable (`EACCES`).
    ReadOnly,
    /// The store's directory or a region file is gone.
    MissingDirectory,
    /// Every region is in use by a write or a reader: nothing can be reclaimed now.
    Full,
    /// The object is larger than the store admits.
    TooLarge,
    /// The device refused the alignment of direct I/O.
    Unaligned,
    /// Any other I/O error.
    Io,
}

impl SkipReason {
    /// Every reason, for metric label pre-registration.
    pub const ALL: [SkipReason; 7] = [
        SkipReason::NoSpace,
        SkipReason::ReadOnly,
        SkipReason::MissingDirectory,
        SkipReason::Full,
        SkipReason::TooLarge,
        SkipReason::Unaligned,
        SkipReason::Io,
    ];

    /// The metric label of this reason.
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::NoSpace => "no_space",
            SkipReason::ReadOnly => "read_only",
            SkipReason::MissingDirectory => "missing_directory",
            SkipReason::Full => "full",
            SkipReason::TooLarge => "too_large",
            SkipReason::Unaligned => "unaligned",
            SkipReason::Io => "io",
        }
    }

    /// The index of this reason in [`SkipReason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why an SSD store operation failed. Every variant is an operating condition: the caller
/// skips the spill (or the store) with [`SsdError::skip_reason`] counted and keeps serving
/// its memory tiers; a read that fails is a miss.
#[derive(Debug, thiserror::Error)]
pub enum SsdError {
    /// The configuration cannot describe a store (region size not a multiple of 4 KiB,
    /// capacity under one region, zero queue depth). The node starts without the store.
    #[error("invalid SSD store configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// The store's directory (or its parent) does not exist and could not be created.
    #[error("SSD store directory {path} is missing")]
    MissingDirectory {
        /// The directory.
        path: PathBuf,
    },
    /// The file system is read-only or refuses this process write access.
    #[error("SSD store at {path} is read-only")]
    ReadOnly {
        /// The file or directory that refused.
        path: PathBuf,
    },
    /// The file system is full.
    #[error("no space left for the SSD store at {path}")]
    NoSpace {
        /// The file or directory that refused.
        path: PathBuf,
    },
    /// Direct I/O was refused for alignment (`EINVAL` on an aligned request): the device's
    /// logical block is larger than 4 KiB.
    #[error("the device under {path} refuses 4 KiB-aligned direct I/O")]
    Unaligned {
        /// The file that refused.
        path: PathBuf,
    },
    /// The object is larger than `object_bytes_max` (or than a region's data area).
    #[error("object of {length_bytes} bytes exceeds the SSD store's limit of {limit_bytes}")]
    TooLarge {
        /// The object's length.
        length_bytes: u64,
        /// The limit.
        limit_bytes: u64,
    },
    /// No region is free and none can be reclaimed (each has a write in flight or a
    /// reader); the spill is skipped and tried again later.
    #[error("every SSD region is busy")]
    Full,
    /// Any other I/O error, or a short transfer.
    #[error("SSD I/O on {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl SsdError {
    /// Classifies an I/O error on `path` into the variant the caller branches on.
    pub fn from_io(path: PathBuf, source: io::Error) -> SsdError {
        match source.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => SsdError::NoSpace { path },
            Some(libc::EROFS | libc::EACCES | libc::EPERM) => SsdError::ReadOnly { path },
            Some(libc::ENOENT | libc::ENOTDIR) => SsdError::MissingDirectory { path },
            _ => SsdError::Io { path, source },
        }
    }

    /// The counted reason a spill that failed with this error is skipped.
    pub fn skip_reason(&self) -> SkipReason {
        match self {
            SsdError::NoSpace { .. } => SkipReason::NoSpace,
            SsdError::ReadOnly { .. } => SkipReason::ReadOnly,
            SsdError::MissingDirectory { .. } => SkipReason::MissingDirectory,
            SsdError::Full => SkipReason::Full,
            SsdError::TooLarge { .. } => SkipReason::TooLarge,
            SsdError::Unaligned { .. } => SkipReason::Unaligned,
            SsdError::InvalidConfig { .. } | SsdError::Io { .. } => SkipReason::Io,
        }
    }
}
