//! Extents of shared pools: granting a session an extent it alone allocates in, and taking
//! it back. Both are idempotent by operation id.

use super::idempotency::LedgerStep;
use super::{Directory, DirectoryError, Extent, ExtentGrant, ExtentReturn, Table};
use crate::model::{OperationId, OwnerWord, PoolId, Scope, SessionId, Timestamp};

impl Directory {
    /// Grants the session an extent of a shared pool it maps: a range no other node may
    /// allocate in until the extent is returned. The node sub-allocates pages inside it
    /// without asking again. `Full` when no extent is free. Idempotent by operation id, so
    /// a grant whose reply was lost is resolved, not leaked.
    pub fn grant_extent(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        pool: PoolId,
    ) -> Result<ExtentGrant, DirectoryError> {
        let session = match self.check_ledger(session_id, operation)? {
            LedgerStep::Replay(grant) => return Ok(grant),
            LedgerStep::Proceed(session) => session,
        };
        let record = self
            .pools
            .get(pool.0 as usize)
            .ok_or(DirectoryError::UnknownPool)?;
        let Scope::Domain(domain) = record.spec.scope else {
            return Err(DirectoryError::InvalidPool(
                "extents exist only in shared pools".into(),
            ));
        };
        if !session.domains.contains(&domain) {
            return Err(DirectoryError::InvalidPool(
                "the node does not map this pool's domain".into(),
            ));
        }
        if self.extents_held(session_id) >= self.config.extents_per_session_max {
            return Err(DirectoryError::Full(Table::Extents));
        }
        let node = session.node;
        let Some(extents) = self.pools[pool.0 as usize].extents.as_mut() else {
            return Err(DirectoryError::InvalidPool(
                "shared pool without extents".into(),
            ));
        };
        let grant = match extents.grant(session_id, node, now) {
            Some(granted) => ExtentGrant::Granted(Extent {
                pool,
                offset_bytes: granted.offset_bytes,
                length_bytes: granted.length_bytes,
                owner_word: granted.owner_word,
            }),
            None => ExtentGrant::Full,
        };
        self.record_outcome(session_id, operation, grant);
        Ok(grant)
    }

    /// The owner gives back an extent it no longer allocates in. `Returned`: any node may
    /// be granted it at once — the live owner offers only an extent its allocator holds
    /// nothing in (no page of a grant an engine may still write, expired grants included),
    /// and never allocates there again unless told `InUse`. Idempotent by operation id, so
    /// a return whose reply was lost is resolved, never guessed.
    pub fn return_extent(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        pool: PoolId,
        offset_bytes: u64,
    ) -> Result<ExtentReturn, DirectoryError> {
        if let LedgerStep::Replay(answer) = self.check_ledger(session_id, operation)? {
            return Ok(answer);
        }
        let extents = self
            .pools
            .get_mut(pool.0 as usize)
            .and_then(|record| record.extents.as_mut())
            .ok_or(DirectoryError::UnknownPool)?;
        let answer = extents.give_back(session_id, offset_bytes, now);
        self.record_outcome(session_id, operation, answer);
        Ok(answer)
    }

    /// Learns the owner word of the extent at `offset_bytes` that `session` gives back (the
    /// word it holds, or the one it found when it could not take the extent after a grant):
    /// the next grant starts from it. Only the extent's holder is heard; safety never rests
    /// on the word being right (a stale one only makes the next grant fail), only liveness.
    pub fn learn_owner_word(
        &mut self,
        session: SessionId,
        pool: PoolId,
        offset_bytes: u64,
        word: OwnerWord,
    ) {
        if let Some(extents) = self
            .pools
            .get_mut(pool.0 as usize)
            .and_then(|record| record.extents.as_mut())
        {
            extents.learn_word(session, offset_bytes, word);
        }
    }

    /// Grants no extent of shared pool `pool` before `until`. A directory that starts over a
    /// pool that already held data (a restart) calls it with the longest lease, grant and
    /// fence window the previous incarnation could have issued: until then, nodes of that
    /// incarnation may still write into extents it granted them and engines may still read
    /// under its leases, so nothing unclaimed is reused.
    pub fn hold_extents_until(
        &mut self,
        pool: PoolId,
        until: Timestamp,
    ) -> Result<(), DirectoryError> {
        let extents = self
            .pools
            .get_mut(pool.0 as usize)
            .and_then(|record| record.extents.as_mut())
            .ok_or(DirectoryError::UnknownPool)?;
        extents.hold_until(until);
        Ok(())
    }

    /// The longest window the previous incarnation of a directory with this configuration
    /// could have left open: a lease, an unwritten grant, or a silent node not yet fenced;
    /// with delegations, a local lease a node granted under one until it stopped on its own
    /// (at most `fence_after` after the old incarnation last answered it), so a lease more.
    pub fn recovery_window(&self) -> std::time::Duration {
        let config = &self.config;
        let local_leases = match config.delegations_per_session_max {
            0 => std::time::Duration::ZERO,
            _ => config.fence_after + config.lease_duration,
        };
        config
            .lease_duration
            .max(config.reservation_duration)
            .max(config.fence_after)
            .max(local_leases)
    }
}
