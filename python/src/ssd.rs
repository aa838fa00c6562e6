//! `SsdPin`: where one object's bytes lie in the node's SSD files, for a reader that reads
//! them itself (GPUDirect Storage: `cuFileRead` of `length` bytes at `offset` of `path`).

use kvtier::SsdExtent;
use pyo3::prelude::*;

/// One object pinned in place on the node's SSD by `Client.pin_on_ssd`: open `path`
/// read-only, read `length` bytes at `offset` (4 KiB-aligned), check them against `crc32c`.
/// The region stays protected from reuse until `Client.unpin_on_ssd([pin])`, `lasts_ms`
/// from the pin, or the client's connection ends.
#[pyclass(frozen, get_all, name = "SsdPin", module = "kvtier._kvtier")]
pub(crate) struct SsdPin {
    /// The pin's id, for `unpin_on_ssd`.
    pin: u64,
    /// The region file holding the bytes.
    path: String,
    /// Where the object's bytes start in the file (4 KiB-aligned).
    offset: u64,
    /// The object's length in bytes.
    length: u64,
    /// crc32c (Castagnoli) of the object's bytes.
    crc32c: u32,
    /// How long the pin lasts from its grant (milliseconds), unless ended earlier.
    lasts_ms: u64,
}

#[pymethods]
impl SsdPin {
    fn __repr__(&self) -> String {
        format!(
            "SsdPin({}, {}, offset {}, {} bytes)",
            self.pin, self.path, self.offset, self.length
        )
    }
}

impl From<SsdExtent> for SsdPin {
    fn from(extent: SsdExtent) -> SsdPin {
        SsdPin {
            pin: extent.pin,
            path: extent.path,
            offset: extent.offset,
            length: extent.length_bytes,
            crc32c: extent.data_crc,
            lasts_ms: extent.lasts_ms,
        }
    }
}
