//! `LeasedBytes`: one leased object's bytes in a pool, exported through the buffer protocol.
//! A memoryview made from it, and every slice, cast or array made from that view, holds a
//! reference to it: the lease (and with it the pool's mapping) lives until the last of them
//! is gone, however they were derived, so no view ever reads unmapped memory. Ending it
//! (`Loaded.release()`, or the block's end) gives the lease back at once when nothing still
//! reads, else when the last export is released.

use kvtier::LoadedView;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::{c_char, c_int};
use std::sync::{Mutex, MutexGuard};

/// `PyBUF_WRITABLE`.
const PYBUF_WRITABLE: c_int = 0x0001;
/// `PyBUF_FORMAT`.
const PYBUF_FORMAT: c_int = 0x0004;
/// `PyBUF_ND`.
const PYBUF_ND: c_int = 0x0008;
/// `PyBUF_STRIDES` (includes `PyBUF_ND`).
const PYBUF_STRIDES: c_int = 0x0010 | PYBUF_ND;

/// The format of unsigned bytes.
static FORMAT: &[u8] = b"B\0";

/// The lease behind the exports, and how many exports are out.
struct State {
    /// `None` once the lease was given back.
    view: Option<LoadedView>,
    exports: usize,
    /// `end` was called: the lease goes back when the last export does.
    ended: bool,
}

/// One leased object's bytes (see the module documentation).
#[pyclass(frozen, module = "kvtier._kvtier")]
pub(crate) struct LeasedBytes {
    state: Mutex<State>,
    /// The export's one dimension and its stride, at fixed places for the exports' shape
    /// and strides pointers (this object outlives every export: each holds a reference).
    length: ffi::Py_ssize_t,
    stride: ffi::Py_ssize_t,
}

impl LeasedBytes {
    /// Holds `view`'s lease; fails for an object too large for a Python buffer.
    pub(crate) fn new(view: LoadedView) -> PyResult<LeasedBytes> {
        let length = view
            .bytes()
            .map(<[u8]>::len)
            .map_err(crate::errors::to_py)?;
        let length = ffi::Py_ssize_t::try_from(length)
            .map_err(|_| PyValueError::new_err("object too large for a buffer"))?;
        Ok(LeasedBytes {
            state: Mutex::new(State {
                view: Some(view),
                exports: 0,
                ended: false,
            }),
            length,
            stride: 1,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ends the lease now if nothing reads the bytes, else when the last export goes.
    pub(crate) fn end(&self) {
        let mut state = self.lock();
        state.ended = true;
        if state.exports == 0 {
            state.view = None;
        }
    }

    /// Whether the lease still protects the bytes.
    pub(crate) fn is_valid(&self) -> bool {
        self.lock().view.as_ref().is_some_and(LoadedView::is_valid)
    }
}

#[pymethods]
impl LeasedBytes {
    /// A read-only, one-dimensional export of unsigned bytes; refused once the lease was
    /// given back, or when asked writable.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no buffer to fill"));
        }
        if flags & PYBUF_WRITABLE != 0 {
            return Err(PyBufferError::new_err("leased pool memory is read-only"));
        }
        let this = slf.get();
        let pointer = {
            let mut state = this.lock();
            let Some(leased) = state.view.as_ref() else {
                return Err(PyValueError::new_err(
                    "the lease of these bytes was released",
                ));
            };
            let pointer = leased.bytes().map_err(crate::errors::to_py)?.as_ptr();
            state.exports += 1;
            pointer
        };
        // SAFETY: `view` is a valid `Py_buffer` to fill (checked non-null). The bytes stay
        // mapped and leased until `__releasebuffer__` of this export (counted above); `obj`
        // takes a reference to this object, which holds the shape and stride fields the
        // pointers name.
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = pointer as *mut std::os::raw::c_void;
            (*view).len = this.length;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & PYBUF_FORMAT != 0 {
                FORMAT.as_ptr() as *mut c_char
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & PYBUF_ND == PYBUF_ND {
                &this.length as *const ffi::Py_ssize_t as *mut ffi::Py_ssize_t
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & PYBUF_STRIDES == PYBUF_STRIDES {
                &this.stride as *const ffi::Py_ssize_t as *mut ffi::Py_ssize_t
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// One export ended; an ended lease goes back with its last export.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut state = self.lock();
        state.exports = state.exports.saturating_sub(1);
        if state.ended && state.exports == 0 {
            state.view = None;
        }
    }

    fn __len__(&self) -> usize {
        self.length as usize
    }
}
