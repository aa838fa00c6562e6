//! The requests whose items go each to its shard: split, answered per shard, and put back
//! in the request's order; acquires all or none over shards, releases, retires, locates,
//! resolves and task polls.

use super::Shards;
use crate::directory::{
    AcquireMode, AcquireOutcome, Directory, DirectoryError, NodeRun, ResolveOutcome,
};
use crate::model::{LeaseId, ObjectId, ReplicaId, SessionId, Timestamp};

/// An acquire's outcomes, and its delegations when it asked for them.
type AcquireAnswer = (
    Vec<AcquireOutcome>,
    Vec<Option<crate::directory::Delegation>>,
);

impl Shards {
    /// The core of the shard that issued `replica`; an id naming no shard of this
    /// directory is unknown.
    pub(super) fn core_of(&mut self, replica: ReplicaId) -> Result<&mut Directory, DirectoryError> {
        self.cores
            .get_mut(replica.shard())
            .ok_or(DirectoryError::UnknownReplica(replica))
    }

    /// Splits `items` by shard (`shard_of` each), answers each shard's part with `answer`,
    /// and puts the answers back in the items' order. A shard's refusal of its whole part
    /// refuses the request.
    pub(super) fn split<T: Clone, R>(
        &mut self,
        items: &[T],
        shard_of: impl Fn(&T) -> usize,
        mut answer: impl FnMut(&mut Directory, &[T]) -> Result<Vec<R>, DirectoryError>,
    ) -> Result<Vec<R>, DirectoryError> {
        let count = self.cores.len();
        let mut parts: Vec<Vec<T>> = vec![Vec::new(); count];
        let mut positions: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (position, item) in items.iter().enumerate() {
            let shard = shard_of(item);
            let shard = if shard < count {
                shard
            } else {
                // An id no shard issued: shard 0 answers it as unknown.
                0
            };
            parts[shard].push(item.clone());
            positions[shard].push(position);
        }
        let mut answers: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
        for (shard, part) in parts.iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            let answered = answer(&mut self.cores[shard], part);
            self.propagate(shard);
            let answered = answered?;
            if answered.len() != part.len() {
                return Err(DirectoryError::ShardAnswer {
                    shard,
                    answered: answered.len(),
                    asked: part.len(),
                });
            }
            for (position, answer) in positions[shard].iter().zip(answered) {
                answers[*position] = Some(answer);
            }
        }
        // Every position is in exactly one part, and every part was answered in full.
        Ok(answers.into_iter().flatten().collect())
    }

    /// [`Shards::split`] by the shard of each item's object.
    pub(super) fn split_by_object<T: Clone, R>(
        &mut self,
        items: &[T],
        object_of: impl Fn(&T) -> &ObjectId,
        answer: impl FnMut(&mut Directory, &[T]) -> Result<Vec<R>, DirectoryError>,
    ) -> Result<Vec<R>, DirectoryError> {
        let shards: Vec<usize> = items
            .iter()
            .map(|item| self.shard_of(object_of(item)))
            .collect();
        let indexed: Vec<(usize, T)> = items.iter().cloned().enumerate().collect();
        let mut answer = answer;
        self.split(
            &indexed,
            |(position, _)| shards[*position],
            |core, part| {
                let part: Vec<T> = part.iter().map(|(_, item)| item.clone()).collect();
                answer(core, &part)
            },
        )
    }

    /// Leases `objects` from their shards. In `Manifest` mode all or none: when a shard
    /// could not lease all of its part, the leases the others took are released and
    /// reported `Withheld`. Delegations (`delegating`) are asked once the leases stand.
    pub(super) fn acquire(
        &mut self,
        now: Timestamp,
        session: SessionId,
        objects: &[ObjectId],
        mode: AcquireMode,
        delegating: bool,
    ) -> Result<AcquireAnswer, DirectoryError> {
        // A shard that refuses its part refuses the request: the leases the others took
        // are released first, so that none is left that the node does not know of.
        let mut refusal = None;
        let mut outcomes = self.split_by_object(
            objects,
            |object| object,
            |core, part| {
                Ok(core
                    .acquire(now, session, part, mode)
                    .unwrap_or_else(|error| {
                        refusal.get_or_insert(error);
                        vec![AcquireOutcome::Miss; part.len()]
                    }))
            },
        )?;
        let leased = |outcome: &AcquireOutcome| matches!(outcome, AcquireOutcome::Leased(_));
        if refusal.is_some() || (mode == AcquireMode::Manifest && !outcomes.iter().all(leased)) {
            let leases: Vec<LeaseId> = outcomes
                .iter()
                .filter_map(|outcome| match outcome {
                    AcquireOutcome::Leased(lease) => Some(lease.lease),
                    _ => None,
                })
                .collect();
            self.release(session, &leases)?;
            if let Some(refusal) = refusal {
                return Err(refusal);
            }
            for outcome in &mut outcomes {
                if leased(outcome) {
                    *outcome = AcquireOutcome::Withheld;
                }
            }
        }
        let delegations = if delegating {
            let replicas: Vec<(usize, Option<ReplicaId>)> = outcomes
                .iter()
                .map(|outcome| match outcome {
                    AcquireOutcome::Leased(lease) => (lease.replica.shard(), Some(lease.replica)),
                    _ => (0, None),
                })
                .collect();
            self.split(
                &replicas,
                |(shard, _)| *shard,
                |core, part| {
                    let leased: Vec<_> = part.iter().map(|(_, replica)| *replica).collect();
                    Ok(core.delegate(now, session, &leased))
                },
            )?
        } else {
            Vec::new()
        };
        Ok((outcomes, delegations))
    }

    /// Releases `leases` in the shards that granted them, answers in order.
    pub(super) fn release(
        &mut self,
        session: SessionId,
        leases: &[LeaseId],
    ) -> Result<Vec<crate::directory::ReleaseOutcome>, DirectoryError> {
        self.split(
            leases,
            |lease| lease.shard(),
            |core, part| core.release(session, part),
        )
    }

    /// Releases `released` where each was granted, then retires `replica` in its shard.
    pub(super) fn retire(
        &mut self,
        session: SessionId,
        object: ObjectId,
        replica: ReplicaId,
        released: &[LeaseId],
    ) -> Result<crate::directory::RetireOutcome, DirectoryError> {
        self.release(session, released)?;
        let shard = self.shard_of(&object);
        if replica.shard() != shard {
            return Err(DirectoryError::UnknownReplica(replica));
        }
        self.cores[shard].retire_object(session, &object, replica)
    }

    /// Each node's run over `objects`, each chunk probed in its own shard.
    pub(super) fn locate(
        &self,
        session: SessionId,
        objects: &[ObjectId],
    ) -> Result<Vec<NodeRun>, DirectoryError> {
        self.cores[0].locate_in(session, objects, |object| {
            &self.cores[self.shard_of(object)]
        })
    }

    /// What became of an operation whose reply the node lost: the shard that applied it
    /// says; every other burns the id, so a late arrival is refused there too.
    pub(super) fn resolve(
        &mut self,
        session: SessionId,
        target: SessionId,
        operation: crate::model::OperationId,
    ) -> Result<ResolveOutcome, DirectoryError> {
        let mut answer = ResolveOutcome::Unknown;
        for core in &mut self.cores {
            match core.resolve(session, target, operation)? {
                ResolveOutcome::Unknown => {}
                ResolveOutcome::NotApplied => {
                    if answer == ResolveOutcome::Unknown {
                        answer = ResolveOutcome::NotApplied;
                    }
                }
                applied => answer = applied,
            }
        }
        Ok(answer)
    }

    /// Up to `max` tasks for `session`, from every shard in turn (a different one first
    /// each time).
    pub(super) fn poll_tasks(
        &mut self,
        now: Timestamp,
        session: SessionId,
        max: u32,
    ) -> Result<Vec<crate::directory::Task>, DirectoryError> {
        let count = self.cores.len();
        let first = self.next_poll % count;
        self.next_poll = (first + 1) % count;
        let mut tasks = Vec::new();
        for offset in 0..count {
            let room = max.saturating_sub(tasks.len() as u32);
            let core = &mut self.cores[(first + offset) % count];
            if room == 0 {
                // Still asked, with no room: the session's state is checked in each.
                core.poll_tasks(now, session, 0)?;
                continue;
            }
            tasks.extend(core.poll_tasks(now, session, room)?);
        }
        Ok(tasks)
    }
}
