//! Where a write batch's bytes come from: slices in memory, or a filler that copies an
//! object straight into the store's aligned staging slot (a spill reads its source replica
//! chunk by chunk there, never through a whole-object buffer of its own).

use super::error::SsdError;
use crate::model::ObjectId;

/// The objects of a write batch and their bytes.
pub trait WriteSource {
    /// Objects in the batch.
    fn count(&self) -> usize;
    /// The object of request `request` and its length.
    fn object(&self, request: usize) -> (ObjectId, u64);
    /// Fills `data` (exactly the object's length) with the bytes of request `request`.
    fn fill(&mut self, request: usize, data: &mut [u8]) -> Result<(), SsdError>;
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
}

/// One object whose bytes a function writes into the staging slot; it fails with the
/// reason the source could not be read.
pub struct Filled<F> {
    /// The object.
    pub object: ObjectId,
    /// Its length.
    pub length_bytes: u64,
    /// Fills the slice it is given (the object's length) with the object's bytes.
    pub fill: F,
}

impl<F: FnMut(&mut [u8]) -> Result<(), String>> WriteSource for Filled<F> {
    fn count(&self) -> usize {
        1
    }

    fn object(&self, _: usize) -> (ObjectId, u64) {
        (self.object, self.length_bytes)
    }

    fn fill(&mut self, _: usize, data: &mut [u8]) -> Result<(), SsdError> {
        (self.fill)(data).map_err(|reason| SsdError::Source { reason })
    }
}
