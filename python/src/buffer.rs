//! Buffers of Python objects through the buffer protocol's C API (`PyObject_GetBuffer`,
//! `PyBuffer_Release`). The limited API declares these only from Python 3.11; the functions
//! themselves are exported by every CPython 3 interpreter, so with `abi3-py310` they are
//! declared here. A [`Buffer`] always gives its export back when dropped (with the GIL).

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::{c_char, c_int, c_void};

/// `PyBUF_WRITABLE`.
const PYBUF_WRITABLE: c_int = 0x0001;
/// `PyBUF_C_CONTIGUOUS` (implies `PyBUF_STRIDES` and `PyBUF_ND`).
const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | 0x0010 | 0x0008;

/// CPython's `Py_buffer`, whose layout is fixed by the buffer protocol (PEP 3118).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(object: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// One exported, C-contiguous buffer of a Python object, held until drop.
pub(crate) struct Buffer {
    raw: Box<RawBuffer>,
}

// SAFETY: the export pins the memory (the exporter may not resize or free it while exported);
// the bytes are touched without the GIL only through `Span`s, and the export is released in
// `Drop`, which takes the GIL.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Exports `object`'s buffer; `writable` asks for a writable one (a read-only object is
    /// refused with `BufferError`). A CPU torch tensor (no buffer protocol of its own) is
    /// exported through `kvtier.as_buffer`: a uint8 numpy view of its memory, no copy.
    pub(crate) fn get(object: &Bound<'_, PyAny>, writable: bool) -> PyResult<Buffer> {
        match Buffer::export(object, writable) {
            Err(_) if is_tensor(object) => {
                let array = object
                    .py()
                    .import("kvtier")?
                    .getattr("as_buffer")?
                    .call1((object,))?;
                Buffer::export(&array, writable)
            }
            exported => exported,
        }
    }

    fn export(object: &Bound<'_, PyAny>, writable: bool) -> PyResult<Buffer> {
        let mut raw = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        let flags = PYBUF_C_CONTIGUOUS | if writable { PYBUF_WRITABLE } else { 0 };
        // SAFETY: `object` is a live object (the GIL is held: we have a `Bound`), and `raw`
        // is a valid `Py_buffer` to fill.
        if unsafe { PyObject_GetBuffer(object.as_ptr(), &mut *raw, flags) } != 0 {
            return Err(PyErr::take(object.py()).unwrap_or_else(|| {
                PyBufferError::new_err("the object does not export a contiguous buffer")
            }));
        }
        let buffer = Buffer { raw };
        if buffer.raw.len < 0 || (buffer.raw.len > 0 && buffer.raw.buf.is_null()) {
            return Err(PyBufferError::new_err(
                "the object exported a malformed buffer",
            ));
        }
        Ok(buffer)
    }

    /// The buffer's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.raw.len as usize
    }

    /// The bytes, for reading (valid while the export lives; the caller may drop the GIL).
    pub(crate) fn span(&self) -> Span {
        Span {
            pointer: self.raw.buf as *mut u8,
            len: self.len(),
        }
    }
}

/// Whether `object` is a torch tensor (its type's module is torch's).
fn is_tensor(object: &Bound<'_, PyAny>) -> bool {
    object
        .get_type()
        .getattr("__module__")
        .and_then(|module| module.extract::<String>())
        .is_ok_and(|module| module == "torch" || module.starts_with("torch."))
}

impl Drop for Buffer {
    fn drop(&mut self) {
        Python::with_gil(|_| {
            // SAFETY: `raw` was filled by a successful `PyObject_GetBuffer` and is released
            // exactly once, here, with the GIL held.
            unsafe { PyBuffer_Release(&mut *self.raw) }
        });
    }
}

/// The memory of an exported buffer, usable without the GIL while its [`Buffer`] lives.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    pointer: *mut u8,
    len: usize,
}

// SAFETY: a span points into memory pinned by its buffer's export; see `Buffer`.
unsafe impl Send for Span {}
unsafe impl Sync for Span {}

/// Refuses targets that share a byte (the same buffer twice, or overlapping views of one
/// array): each becomes a `&mut [u8]` of its own, and two of those may never alias.
pub(crate) fn ensure_distinct(spans: &[Span]) -> PyResult<()> {
    let mut sorted: Vec<Span> = spans.iter().copied().filter(|span| span.len > 0).collect();
    sorted.sort_by_key(|span| span.pointer as usize);
    if sorted.windows(2).any(|pair| pair[0].overlaps(pair[1])) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "two target buffers overlap: load into distinct buffers",
        ));
    }
    Ok(())
}

impl Span {
    /// Whether the two spans share a byte.
    pub(crate) fn overlaps(self, other: Span) -> bool {
        let (start, end) = (self.pointer as usize, self.pointer as usize + self.len);
        let (other_start, other_end) = (other.pointer as usize, other.pointer as usize + other.len);
        start < other_end && other_start < end
    }

    /// The bytes.
    ///
    /// # Safety
    /// The span's [`Buffer`] is alive and nobody writes the memory meanwhile.
    pub(crate) unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.pointer, self.len)
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// The span's [`Buffer`] is alive, was exported writable, and nothing else touches
    /// the memory meanwhile.
    pub(crate) unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.pointer, self.len)
    }
}
