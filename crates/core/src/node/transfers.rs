//! The transfers a node expects to receive from its peers: the receiving half of the
//! directory's copy tasks between hosts.
//!
//! A copy is accepted only when the directory named both ends: the receiving node adds an
//! entry when its task arrives (target replica, its token, the sending node's name, length,
//! task, deadline), and a stream that claims the entry must come from that sender's
//! certificate, present the token the directory gave both halves, and match it exactly. An entry is consumed by its first claim, so a replay or a second
//! stream for the same target is refused; while the claimed copy runs, the task handed out
//! again does not re-open it ([`ExpectedTransfers::finished`] ends it). Entries past their
//! deadline leave with [`ExpectedTransfers::expire`], and the caller aborts their targets.
//! No clock, socket or pool here: the peer actor calls in with `now`.
//!
//! A stream that names a target it may not claim learns nothing about it: a wrong sender or
//! token is answered as a target not expected ([`TransferRefusal::verdict_kind`]), and a connection's
//! refusals are bounded ([`RefusalBudget`]), so guessing replica ids is slow and blind.

use crate::model::{ObjectId, PoolId, ReplicaId, SessionId, TaskId, Timestamp, TransferToken};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Transfers one node expects or runs at once: 1024. The directory plans at most a few copies per
/// node and round (each a multi-MiB object); more than this is a flood the node refuses
/// ([`TransferRefusal::Full`]) rather than lets grow.
pub const EXPECTED_TRANSFERS_MAX: usize = 1024;

/// How long an expected transfer waits for its stream: 30 s, the directory's default
/// reservation duration, after which the target's reservation is gone anyway.
pub const EXPECTED_TRANSFER_TIMEOUT: Duration = Duration::from_secs(30);

/// One transfer the directory named: `from` sends `length_bytes` for `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedTransfer {
    /// The receiving task.
    pub task: TaskId,
    /// The object copied: once the target commits, the node holds it there.
    pub object: ObjectId,
    /// The session the task came from: the target is its reservation, committed or
    /// aborted in it.
    pub session: SessionId,
    /// The replica reserved here for the copy.
    pub target: ReplicaId,
    /// The token the directory gave the copy: the stream must present it.
    pub token: TransferToken,
    /// The pool the target is reserved in (this node's CPU pool).
    pub target_pool: PoolId,
    /// The certificate name of the only node that may send it.
    pub from: String,
    /// The object's length.
    pub length_bytes: u64,
    /// When the entry lapses.
    pub deadline: Timestamp,
}

/// What a stream claims: who sent it (its certificate's name) and what its header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferClaim<'a> {
    /// The sender's authenticated name.
    pub sender: &'a str,
    /// The header's target replica.
    pub target: ReplicaId,
    /// The header's token.
    pub token: TransferToken,
    /// The header's length.
    pub length_bytes: u64,
}

/// Why a stream was refused. The receiver answers it, closes the stream and counts the
/// refusal by [`TransferRefusal::reason`]; the pool is never touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferRefusal {
    /// No transfer for this target is expected (never named, already consumed, or lapsed).
    #[error("no transfer is expected for this target")]
    NotExpected,
    /// A transfer for this target is expected from another node: the sender was not
    /// named for the task. The entry stays for the named sender.
    #[error("the sender is not the node named for this transfer")]
    WrongSender,
    /// The stream's token is not the copy's: a sender that guesses. The entry stays for
    /// the named sender.
    #[error("the transfer's token is not the one the directory gave")]
    WrongToken,
    /// The sender is the named one but the length differs from the directory's. The
    /// entry stays (a stale retry must not consume a live task's entry).
    #[error("the transfer's length differs from the expected one")]
    Mismatch,
    /// The entry's deadline passed: it stays until [`ExpectedTransfers::expire`] returns
    /// it, and the caller aborts the target in the entry's session.
    #[error("the expected transfer lapsed")]
    Expired,
    /// [`EXPECTED_TRANSFERS_MAX`] entries are held: the new one is not recorded.
    #[error("too many expected transfers")]
    Full,
}

/// What a refused stream is told, of a refusal: a sender not named for a target hears the
/// same as for a target nobody expects (it cannot tell an expected id from another), and
/// may retry; the named sender hears of a mismatch or a lapse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// Not expected (yet): the named sender retries until its deadline.
    NotExpected,
    /// Refused for good.
    Refused,
    /// The receiver is full: retry.
    Busy,
}

impl TransferRefusal {
    /// What the stream is told ([`RefusalKind`]).
    pub fn verdict_kind(self) -> RefusalKind {
        match self {
            TransferRefusal::NotExpected
            | TransferRefusal::WrongSender
            | TransferRefusal::WrongToken => RefusalKind::NotExpected,
            TransferRefusal::Full => RefusalKind::Busy,
            TransferRefusal::Mismatch | TransferRefusal::Expired => RefusalKind::Refused,
        }
    }

    /// A fixed name for metrics labels.
    pub fn reason(self) -> &'static str {
        match self {
            TransferRefusal::NotExpected => "not_expected",
            TransferRefusal::WrongSender => "wrong_sender",
            TransferRefusal::WrongToken => "wrong_token",
            TransferRefusal::Mismatch => "mismatch",
            TransferRefusal::Expired => "expired",
            TransferRefusal::Full => "full",
        }
    }
}

/// The table of expected transfers, keyed by target replica, and of the claimed ones
/// still running; at most `capacity` of both together.
#[derive(Debug)]
pub struct ExpectedTransfers {
    entries: HashMap<ReplicaId, ExpectedTransfer>,
    running: HashSet<ReplicaId>,
    capacity: usize,
}

impl Default for ExpectedTransfers {
    fn default() -> Self {
        ExpectedTransfers::with_capacity(EXPECTED_TRANSFERS_MAX)
    }
}

impl ExpectedTransfers {
    /// An empty table holding at most `capacity` entries.
    pub fn with_capacity(capacity: usize) -> ExpectedTransfers {
        ExpectedTransfers {
            entries: HashMap::new(),
            running: HashSet::new(),
            capacity,
        }
    }

    /// Entries held (expected and running).
    pub fn len(&self) -> usize {
        self.entries.len() + self.running.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a transfer the directory named. Idempotent: a task handed out again finds
    /// its entry (or its running copy) and changes nothing, deadline included. Errors with
    /// [`TransferRefusal::Full`] at capacity; the caller aborts the target.
    pub fn expect(&mut self, transfer: ExpectedTransfer) -> Result<(), TransferRefusal> {
        if self.entries.contains_key(&transfer.target) || self.running.contains(&transfer.target) {
            return Ok(());
        }
        if self.len() >= self.capacity {
            return Err(TransferRefusal::Full);
        }
        self.entries.insert(transfer.target, transfer);
        Ok(())
    }

    /// Consumes the entry a stream claims, when the claim matches it exactly and in time;
    /// the copy then runs until [`ExpectedTransfers::finished`]. On a refusal the entry
    /// stays; a lapsed one leaves with the next [`ExpectedTransfers::expire`], which the
    /// caller runs to abort it in its own session.
    pub fn claim(
        &mut self,
        claim: TransferClaim<'_>,
        now: Timestamp,
    ) -> Result<ExpectedTransfer, TransferRefusal> {
        let entry = self
            .entries
            .get(&claim.target)
            .ok_or(TransferRefusal::NotExpected)?;
        if entry.from != claim.sender {
            return Err(TransferRefusal::WrongSender);
        }
        if entry.token != claim.token {
            return Err(TransferRefusal::WrongToken);
        }
        if entry.length_bytes != claim.length_bytes {
            return Err(TransferRefusal::Mismatch);
        }
        if entry.deadline <= now {
            return Err(TransferRefusal::Expired);
        }
        let entry = self
            .entries
            .remove(&claim.target)
            .ok_or(TransferRefusal::NotExpected)?;
        self.running.insert(entry.target);
        Ok(entry)
    }

    /// The claimed copy of `target` ended (committed or not): its slot is free, and a task
    /// for it handed out again may record it anew.
    pub fn finished(&mut self, target: ReplicaId) {
        self.running.remove(&target);
    }

    /// Removes an entry without a stream (its task was cancelled). Returns it, if held.
    pub fn forget(&mut self, target: ReplicaId) -> Option<ExpectedTransfer> {
        self.entries.remove(&target)
    }

    /// Removes and returns every entry whose deadline is at or before `now`: the caller
    /// aborts their targets.
    pub fn expire(&mut self, now: Timestamp) -> Vec<ExpectedTransfer> {
        let lapsed: Vec<ReplicaId> = self
            .entries
            .values()
            .filter(|entry| entry.deadline <= now)
            .map(|entry| entry.target)
            .collect();
        lapsed
            .into_iter()
            .filter_map(|target| self.entries.remove(&target))
            .collect()
    }

    /// The earliest deadline held, for the caller's next expiry round.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.entries.values().map(|entry| entry.deadline).min()
    }
}

/// Refusals one peer connection may draw at once before it is closed, refilled at
/// [`PEER_REFUSALS_PER_SECOND`]: a named sender retrying a transfer its receiver does not
/// expect yet asks every 20 ms (50 a second per push), well inside; a peer guessing
/// targets is cut off after this many guesses and must reconnect (connections are bounded).
pub const PEER_REFUSALS_BURST: u32 = 256;
/// How fast a connection's refusal budget refills.
pub const PEER_REFUSALS_PER_SECOND: u32 = 256;

/// A token bucket of refusals for one peer connection.
#[derive(Debug)]
pub struct RefusalBudget {
    tokens: u32,
    refilled: Timestamp,
}

impl RefusalBudget {
    /// A full budget at `now`.
    pub fn new(now: Timestamp) -> RefusalBudget {
        RefusalBudget {
            tokens: PEER_REFUSALS_BURST,
            refilled: now,
        }
    }

    /// Counts one refusal at `now`: false once the connection has used its budget (the
    /// caller closes it).
    pub fn spend(&mut self, now: Timestamp) -> bool {
        let elapsed = now.saturating_since(self.refilled);
        let earned = elapsed.as_millis() * u128::from(PEER_REFUSALS_PER_SECOND) / 1000;
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(earned).min(PEER_REFUSALS_BURST);
            self.refilled = now;
        }
        match self.tokens.checked_sub(1) {
            Some(left) => {
                self.tokens = left;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_sender_or_token_hears_what_a_stranger_to_the_target_hears() {
        for refusal in [TransferRefusal::WrongSender, TransferRefusal::WrongToken] {
            assert_eq!(
                refusal.verdict_kind(),
                TransferRefusal::NotExpected.verdict_kind()
            );
        }
    }

    #[test]
    fn a_connection_that_keeps_being_refused_runs_out_and_a_retrying_sender_never_does() {
        let start = Timestamp::ZERO;
        let mut guesser = RefusalBudget::new(start);
        let allowed = (0..10_000).take_while(|_| guesser.spend(start)).count();
        assert_eq!(allowed, PEER_REFUSALS_BURST as usize);
        // A second later it may guess again, as many as the refill gives.
        let later = start + Duration::from_secs(1);
        let again = (0..10_000).take_while(|_| guesser.spend(later)).count();
        assert_eq!(again, PEER_REFUSALS_PER_SECOND as usize);
        // Four pushes retried every 20 ms for the sender's whole 5 s wait.
        let mut sender = RefusalBudget::new(start);
        for step in 0..250u64 {
            let now = start + Duration::from_millis(20 * step);
            for _ in 0..4 {
                assert!(sender.spend(now), "a retrying sender was cut off at {step}");
            }
        }
    }

    fn entry(target: u64, from: &str, deadline_ms: u64) -> ExpectedTransfer {
        ExpectedTransfer {
            task: TaskId(target + 100),
            object: ObjectId {
                namespace: crate::model::NamespaceId([1; 16]),
                prefix: crate::model::PrefixDigest::ROOT,
                shard: 0,
                part: target as u16,
            },
            session: SessionId(5),
            target: ReplicaId(target),
            token: TransferToken(target.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            target_pool: PoolId(1),
            from: from.into(),
            length_bytes: 4 << 20,
            deadline: Timestamp::ZERO + Duration::from_millis(deadline_ms),
        }
    }

    fn claim_of(expected: &ExpectedTransfer) -> TransferClaim<'_> {
        TransferClaim {
            sender: &expected.from,
            target: expected.target,
            token: expected.token,
            length_bytes: expected.length_bytes,
        }
    }

    const EARLY: Timestamp = Timestamp(1);

    #[test]
    fn a_named_transfer_is_claimed_once() {
        let mut table = ExpectedTransfers::default();
        let expected = entry(1, "node-a", 1000);
        table.expect(expected.clone()).unwrap();
        assert_eq!(
            table.claim(claim_of(&expected), EARLY),
            Ok(expected.clone())
        );
        assert_eq!(
            table.claim(claim_of(&expected), EARLY),
            Err(TransferRefusal::NotExpected),
            "a replay is refused"
        );
        assert_eq!(table.len(), 1, "the copy runs");
        table.expect(expected.clone()).unwrap();
        assert_eq!(
            table.claim(claim_of(&expected), EARLY),
            Err(TransferRefusal::NotExpected),
            "the task handed out again does not re-open a running copy"
        );
        table.finished(expected.target);
        assert!(table.is_empty());
    }

    #[test]
    fn claims_that_do_not_match_are_refused_and_keep_the_entry() {
        let mut table = ExpectedTransfers::default();
        let expected = entry(1, "node-a", 1000);
        table.expect(expected.clone()).unwrap();
        let cases = [
            (
                TransferClaim {
                    sender: "node-c",
                    ..claim_of(&expected)
                },
                TransferRefusal::WrongSender,
            ),
            (
                TransferClaim {
                    token: TransferToken(expected.token.0 ^ 1),
                    ..claim_of(&expected)
                },
                TransferRefusal::WrongToken,
            ),
            (
                TransferClaim {
                    target: ReplicaId(2),
                    ..claim_of(&expected)
                },
                TransferRefusal::NotExpected,
            ),
            (
                TransferClaim {
                    length_bytes: 1,
                    ..claim_of(&expected)
                },
                TransferRefusal::Mismatch,
            ),
        ];
        for (claim, refusal) in cases {
            assert_eq!(table.claim(claim, EARLY), Err(refusal), "{claim:?}");
            assert_eq!(table.len(), 1);
        }
        assert_eq!(table.claim(claim_of(&expected), EARLY), Ok(expected));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn a_lapsed_entry_is_refused_and_leaves_with_its_session() {
        let mut table = ExpectedTransfers::default();
        let expected = entry(1, "node-a", 10);
        table.expect(expected.clone()).unwrap();
        let late = Timestamp::ZERO + Duration::from_millis(10);
        assert_eq!(
            table.claim(claim_of(&expected), late),
            Err(TransferRefusal::Expired)
        );
        assert_eq!(
            table.expire(late),
            vec![expected],
            "the caller aborts it in its session"
        );
        assert!(table.is_empty());
    }

    #[test]
    fn expiry_returns_exactly_the_lapsed_entries() {
        let mut table = ExpectedTransfers::default();
        for (target, deadline_ms) in [(1, 10), (2, 20), (3, 30)] {
            table.expect(entry(target, "node-a", deadline_ms)).unwrap();
        }
        assert_eq!(
            table.next_deadline(),
            Some(Timestamp::ZERO + Duration::from_millis(10))
        );
        let mut lapsed: Vec<u64> = table
            .expire(Timestamp::ZERO + Duration::from_millis(20))
            .iter()
            .map(|entry| entry.target.0)
            .collect();
        lapsed.sort_unstable();
        assert_eq!(lapsed, vec![1, 2]);
        assert_eq!(table.len(), 1);
        assert_eq!(
            table.forget(ReplicaId(3)).map(|entry| entry.target.0),
            Some(3)
        );
        assert_eq!(table.next_deadline(), None);
    }

    #[test]
    fn the_table_is_bounded_and_repeats_are_idempotent() {
        let mut table = ExpectedTransfers::with_capacity(2);
        table.expect(entry(1, "node-a", 10)).unwrap();
        table.expect(entry(2, "node-a", 10)).unwrap();
        assert_eq!(
            table.expect(entry(3, "node-a", 10)),
            Err(TransferRefusal::Full)
        );
        // A task handed out again keeps its first entry, even at capacity.
        assert_eq!(table.expect(entry(1, "node-a", 99)), Ok(()));
        assert_eq!(table.len(), 2);
        assert_eq!(
            table.next_deadline(),
            Some(Timestamp::ZERO + Duration::from_millis(10))
        );
    }
}
