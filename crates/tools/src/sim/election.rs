//! Leader election in the simulation, as `actors::directory::election` runs it over etcd:
//! the serving directory holds the election key under a lease of [`LEASE_TTL`] and renews it
//! every quarter of it, through a channel to etcd that delays and loses renewals and their
//! answers, and that a fault cuts for a while. The leader's own [`Leadership`] core (the
//! production one) decides whether it may answer: a request that reaches a leader past its
//! lease is dropped, its ticks stop. etcd expires the lease `ttl` after the last renewal
//! it heard; a standby then wins the key (after a delay of its own) and serves as a new
//! directory incarnation: the nodes' requests in flight reach it and are refused as unknown
//! sessions, replies the deposed leader sent before it stopped still arrive, and every node
//! rejoins the new leader.
//!
//! Checked at every step: the deposed leader was not serving when its successor was
//! elected, and no deposed leadership serves again, whatever renewal answers arrive late.

use super::world::World;
use kvtier_core::directory::leadership::Leadership;
use kvtier_core::model::Timestamp;
use std::time::Duration;

/// The election lease's time to live (`[directory] lease_ttl_s`, scaled to the
/// simulation's fence window).
pub const LEASE_TTL: Duration = Duration::from_millis(1_000);
/// The longest one way of a renewal or its answer between the leader and etcd: a round
/// trip may take longer than the leader's margin (a tenth of the TTL), so a leader that
/// counted its lease from an answer rather than from the renewal it sent would be caught
/// serving past it.
const RENEWAL_DELAY_MS_MAX: u64 = 150;
/// Renewals lost on the way, in a hundred.
const RENEWAL_LOSS_PERCENT: u64 = 5;
/// Steps in a thousand at which the leader is cut off from etcd (but not from the nodes).
const CUT_OFF_PER_MILLE: u64 = 1;
/// How long a standby may take to win the key once the lease expired.
const ELECTION_DELAY_MS_MAX: u64 = 1_500;
/// Deposed leaderships kept to check that none serves again.
const DEPOSED_KEPT: usize = 8;

/// A renewal on its way to etcd and back.
#[derive(Clone, Copy, Debug)]
struct Renewal {
    term: u64,
    sent_at: Timestamp,
    heard_at: Timestamp,
    answered_at: Timestamp,
    /// What etcd answered, once it heard it: whether the lease was still alive.
    alive: Option<bool>,
}

/// The election: etcd's lease and the leaders' cores. See the module documentation.
#[derive(Debug)]
pub struct Election {
    term: u64,
    leadership: Leadership,
    /// When etcd expires the serving term's lease, as far as it heard renewals.
    expires_at: Timestamp,
    /// When a standby wins the key, once the lease expired.
    elected_at: Option<Timestamp>,
    renew_at: Timestamp,
    renewals: Vec<Renewal>,
    cut_off_until: Timestamp,
    deposed: Vec<(u64, Leadership)>,
}

impl Election {
    /// The first leader, elected at `now`.
    pub fn new(now: Timestamp) -> Election {
        Election {
            term: 1,
            leadership: Leadership::won(1, now, LEASE_TTL),
            expires_at: now + LEASE_TTL,
            elected_at: None,
            renew_at: now,
            renewals: Vec::new(),
            cut_off_until: Timestamp::ZERO,
            deposed: Vec::new(),
        }
    }

    /// Whether a directory serves at `now`.
    pub fn serving(&self, now: Timestamp) -> bool {
        self.elected_at.is_none() && self.leadership.serving(now)
    }

    /// The directory process was killed and started again at `now` (a deployment without
    /// standbys): the dead leader serves no more, the new process leads a new term.
    pub fn restarted(&mut self, now: Timestamp) {
        let mut dead = self.leadership;
        dead.lose();
        self.depose(dead);
        self.renewals.clear();
        self.begin_term(now);
    }

    fn depose(&mut self, leadership: Leadership) {
        self.deposed.push((self.term, leadership));
        if self.deposed.len() > DEPOSED_KEPT {
            self.deposed.remove(0);
        }
    }

    fn begin_term(&mut self, now: Timestamp) {
        self.term += 1;
        self.leadership = Leadership::won(self.term, now, LEASE_TTL);
        self.expires_at = now + LEASE_TTL;
        self.elected_at = None;
        self.renew_at = now;
    }

    fn leadership_of(&mut self, term: u64) -> Option<&mut Leadership> {
        if term == self.term {
            return Some(&mut self.leadership);
        }
        self.deposed
            .iter_mut()
            .find(|(deposed, _)| *deposed == term)
            .map(|(_, leadership)| leadership)
    }
}

impl World {
    /// One step of the election: etcd hears renewals, their answers reach the leaders, the
    /// leader sends its next renewal, a fault may cut it off, and an expired lease elects
    /// a standby.
    pub(super) fn election_step(&mut self) {
        let now = self.now;
        let seed = self.stats.seed;
        let election = &mut self.election;
        for renewal in &mut election.renewals {
            if renewal.alive.is_none() && renewal.heard_at <= now {
                let alive = renewal.term == election.term
                    && election.elected_at.is_none()
                    && renewal.heard_at < election.expires_at;
                if alive {
                    election.expires_at = election.expires_at.max(renewal.heard_at + LEASE_TTL);
                }
                renewal.alive = Some(alive);
            }
        }
        let answered: Vec<Renewal> = election
            .renewals
            .iter()
            .filter(|renewal| renewal.answered_at <= now)
            .copied()
            .collect();
        election
            .renewals
            .retain(|renewal| renewal.answered_at > now);
        for renewal in answered {
            if let Some(leadership) = election.leadership_of(renewal.term) {
                match renewal.alive {
                    Some(true) => leadership.renewed(renewal.sent_at, LEASE_TTL),
                    _ => leadership.lose(),
                }
            }
        }
        if self.faults && self.rng.below(1000) < CUT_OFF_PER_MILLE {
            let cut = LEASE_TTL / 2 + Duration::from_millis(self.rng.below(3 * 1_000));
            self.election.cut_off_until = now + cut;
            self.stats.covered.leader_cut_offs += 1;
        }
        self.send_renewal();
        let election = &mut self.election;
        if election.elected_at.is_none() && now >= election.expires_at {
            assert!(
                !election.leadership.serving(now),
                "seed={seed}: the leader still served when its lease expired at etcd"
            );
            let delay = Duration::from_millis(self.rng.below(ELECTION_DELAY_MS_MAX + 1));
            self.election.elected_at = Some(now + delay);
        }
        if self
            .election
            .elected_at
            .is_some_and(|elected_at| elected_at <= now)
        {
            self.fail_over();
        }
        for (term, deposed) in &self.election.deposed {
            assert!(
                !deposed.serving(now),
                "seed={seed}: the deposed leader of term {term} serves again"
            );
        }
    }

    /// The leader renews its lease when due, unless cut off or the renewal is lost.
    fn send_renewal(&mut self) {
        let now = self.now;
        if self.election.elected_at.is_some() || now < self.election.renew_at {
            return;
        }
        self.election.renew_at = now + self.election.leadership.renew_interval();
        if now < self.election.cut_off_until || self.rng.chance(RENEWAL_LOSS_PERCENT) {
            return;
        }
        let there = Duration::from_millis(self.rng.below(RENEWAL_DELAY_MS_MAX + 1));
        let back = Duration::from_millis(self.rng.below(RENEWAL_DELAY_MS_MAX + 1));
        self.election.renewals.push(Renewal {
            term: self.election.term,
            sent_at: now,
            heard_at: now + there,
            answered_at: now + there + back,
            alive: None,
        });
    }

    /// A standby won the key: the next term's directory serves, a new incarnation.
    fn fail_over(&mut self) {
        let deposed = self.election.leadership;
        self.election.depose(deposed);
        self.election.begin_term(self.now);
        self.stats.covered.failovers += 1;
        // The deposed process exits: nothing it had not sent yet goes out, what it sent
        // still arrives.
        self.new_incarnation();
    }
}
