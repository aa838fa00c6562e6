//! The write path of a batch: each object reserved in the active region, staged and
//! submitted through the store's queue, committed or aborted when the batch ends.

use super::{lock, SsdStore, StoredPlace};
use crate::backends::ssd::error::SsdError;
use crate::backends::ssd::io::{IoKind, IoOp, IoRequests, Slot};
use crate::backends::ssd::layout::{ObjectHeader, RegionHeader, BLOCK_BYTES};
use crate::backends::ssd::region::Reservation;
use crate::backends::ssd::source::WriteSource;
use crate::model::ObjectId;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Bytes the write of `reservation` transfers: its footprint, and the region header's block
/// for the first object of a fill ([`Reservation::starts_fill`]). No ordering is needed
/// between the two: if the region header is lost, the fill's objects carry a generation the
/// old header does not name and are absent after a restart; if it lands without them, the
/// old fill's headers carry an older generation and end the scan. (Buffered stores sync
/// each batch's files.)
fn write_bytes(reservation: &Reservation) -> u64 {
    reservation.footprint_bytes
        + if reservation.starts_fill() {
            BLOCK_BYTES
        } else {
            0
        }
}

pub(super) struct WriteRequests<'a> {
    pub(super) store: &'a SsdStore,
    pub(super) source: &'a mut dyn WriteSource,
    pub(super) reservations: Vec<Option<(Reservation, u32)>>,
    pub(super) results: Vec<Result<Duration, SsdError>>,
    pub(super) evicted: Vec<(ObjectId, StoredPlace)>,
}

impl WriteRequests<'_> {
    fn reserve(&mut self, length_bytes: u64) -> Result<Reservation, SsdError> {
        let limit = self.store.config.object_bytes_max;
        if length_bytes > limit {
            return Err(SsdError::TooLarge {
                length_bytes,
                limit_bytes: limit,
            });
        }
        let (reservation, effects) = lock(&self.store.table)
            .reserve(length_bytes)
            .ok_or(SsdError::Full)?;
        if effects.reclaimed_region {
            self.store
                .counters
                .regions_reclaimed
                .fetch_add(1, Ordering::Relaxed);
        }
        let store = self.store;
        self.evicted.extend(
            effects
                .evicted
                .iter()
                .map(|(object, entry)| (*object, store.place(entry))),
        );
        Ok(reservation)
    }
}

impl IoRequests for WriteRequests<'_> {
    fn prepare(&mut self, request: usize, mut slot: Slot<'_>) -> Option<IoOp> {
        let (object, length_bytes) = self.source.object(request);
        let reservation = match self.reserve(length_bytes) {
            Ok(reservation) => reservation,
            Err(error) => {
                self.results[request] = Err(error);
                return None;
            }
        };
        let block = BLOCK_BYTES as usize;
        // The first object of a region fill carries the region's header block in its write:
        // no write of its own, waited for while the queue is full of objects.
        let head = if reservation.starts_fill() { block } else { 0 };
        let footprint = reservation.footprint_bytes as usize;
        let length = length_bytes as usize;
        let file = self.store.files[reservation.region as usize].io_file();
        let region_header = RegionHeader {
            region_bytes: self.store.config.region_bytes,
            index: reservation.region,
            sequence: reservation.generation,
            nonce: reservation.nonce,
        };
        let object_block = &mut slot.bytes(head + footprint)[head..];
        let data = &mut object_block[block..];
        let data_crc = match self.source.fill_checked(request, &mut data[..length]) {
            Ok(crc) => crc,
            Err(error) => {
                // Its region header unwritten, the fill's later objects are absent after a
                // restart, as they are behind any write that failed: the scan of a region
                // ends at the first header that is not sound.
                lock(&self.store.table).abort(reservation);
                self.results[request] = Err(error);
                return None;
            }
        };
        data[length..].fill(0);
        let staged = slot.bytes(head + block);
        if head > 0 {
            region_header.encode(&mut staged[..block]);
        }
        ObjectHeader {
            object,
            length_bytes,
            generation: reservation.generation,
            nonce: reservation.nonce,
            data_crc,
        }
        .encode(&mut staged[head..]);
        self.reservations[request] = Some((reservation, data_crc));
        Some(IoOp {
            kind: IoKind::Write,
            file,
            offset: reservation.header_offset - head as u64,
            length: write_bytes(&reservation) as usize,
        })
    }

    fn complete(
        &mut self,
        request: usize,
        _bytes: &[u8],
        result: io::Result<usize>,
        latency: Duration,
    ) {
        let Some((reservation, _)) = self.reservations[request] else {
            return;
        };
        let path = || self.store.paths[reservation.region as usize].clone();
        self.results[request] = match result {
            Ok(written) if written as u64 == write_bytes(&reservation) => Ok(latency),
            // A regular file's write is cut short only when the file system ran out of room.
            Ok(_) => Err(SsdError::NoSpace { path: path() }),
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                Err(SsdError::Unaligned { path: path() })
            }
            Err(error) => Err(SsdError::from_io(path(), error)),
        };
    }
}
