//! Registered pools and their byte accounting. Counters change only through the methods
//! here, each of which moves bytes between states, so `reserved + allocated <= capacity`
//! holds by construction and is asserted.

use crate::model::{PoolSpec, PoolUsage, SessionId};

/// A registered pool.
#[derive(Debug)]
pub struct PoolRecord {
    pub spec: PoolSpec,
    /// For a host pool, the session that registered it in the current epoch; `None` once
    /// that session is gone (the pool then accepts nothing until re-registered).
    pub owner_session: Option<SessionId>,
    pub reserved_bytes: u64,
    pub ready_bytes: u64,
    pub retiring_bytes: u64,
    pub pinned_bytes: u64,
}

impl PoolRecord {
    /// A pool with nothing in it.
    pub fn new(spec: PoolSpec, owner_session: Option<SessionId>) -> PoolRecord {
        PoolRecord {
            spec,
            owner_session,
            reserved_bytes: 0,
            ready_bytes: 0,
            retiring_bytes: 0,
            pinned_bytes: 0,
        }
    }

    /// Bytes not reserved and not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.spec.capacity_bytes - self.reserved_bytes - self.ready_bytes - self.retiring_bytes
    }

    /// Grants `bytes`; the caller checked [`PoolRecord::free_bytes`].
    pub fn reserve(&mut self, bytes: u64) {
        assert!(bytes <= self.free_bytes(), "pool reservation over capacity");
        self.reserved_bytes += bytes;
    }

    /// Returns an uncommitted reservation.
    pub fn abort(&mut self, bytes: u64) {
        self.reserved_bytes = self
            .reserved_bytes
            .checked_sub(bytes)
            .expect("reserved bytes underflow");
    }

    /// A reservation became READY.
    pub fn commit(&mut self, bytes: u64) {
        self.abort(bytes);
        self.ready_bytes += bytes;
    }

    /// A READY replica starts retiring.
    pub fn retire(&mut self, bytes: u64) {
        self.ready_bytes = self
            .ready_bytes
            .checked_sub(bytes)
            .expect("ready bytes underflow");
        self.retiring_bytes += bytes;
    }

    /// A replica's storage was reclaimed (or dropped with its owner's epoch).
    pub fn free(&mut self, bytes: u64, retiring: bool) {
        let counter = if retiring {
            &mut self.retiring_bytes
        } else {
            &mut self.ready_bytes
        };
        *counter = counter
            .checked_sub(bytes)
            .expect("allocated bytes underflow");
    }

    /// A replica's first lease was granted (`pinned`) or its last released.
    pub fn pin(&mut self, bytes: u64, pinned: bool) {
        if pinned {
            self.pinned_bytes += bytes;
        } else {
            self.pinned_bytes = self
                .pinned_bytes
                .checked_sub(bytes)
                .expect("pinned bytes underflow");
        }
    }

    /// The usage report; `quarantined` is everything allocated while the owner is away.
    pub fn usage(&self, owner_reachable: bool) -> PoolUsage {
        let allocated_bytes = self.ready_bytes + self.retiring_bytes;
        PoolUsage {
            capacity_bytes: self.spec.capacity_bytes,
            reserved_bytes: self.reserved_bytes,
            allocated_bytes,
            ready_bytes: self.ready_bytes,
            retiring_bytes: self.retiring_bytes,
            quarantined_bytes: if owner_reachable { 0 } else { allocated_bytes },
            pinned_bytes: self.pinned_bytes,
        }
    }
}
