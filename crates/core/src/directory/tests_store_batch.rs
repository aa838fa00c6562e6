//! Batched reserves and commits: per-item outcomes in order, each item idempotent by its
//! own operation id, and a batch over `batch_items_max` refused whole.

use super::tests::{location, Fixture, MIB};
use super::*;
use crate::model::OperationId;

fn reserve_items(fixture: &mut Fixture, objects: &[(u32, u64)]) -> Vec<ReserveBatchItem> {
    objects
        .iter()
        .map(|(index, length_bytes)| ReserveBatchItem {
            operation: fixture.operation(),
            item: ReserveItem {
                object: fixture.object(*index),
                length_bytes: *length_bytes,
            },
        })
        .collect()
}

#[test]
fn a_batch_reserves_each_item_and_a_full_pool_skips_only_those_past_it() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 2 * MIB);
    fixture.store(&a, fixture.object(1), MIB);
    // Object 1 is present, 2 fits, 3 finds the pool full, 4 has an invalid length.
    let items = reserve_items(&mut fixture, &[(1, MIB), (2, MIB), (3, MIB), (4, 0)]);
    let outcomes = fixture
        .directory
        .reserve_many(fixture.now, a.session, &items)
        .unwrap();
    assert_eq!(outcomes.len(), 4);
    assert_eq!(outcomes[0], Ok(ReserveOutcome::AlreadyPresent));
    assert!(matches!(outcomes[1], Ok(ReserveOutcome::Granted { .. })));
    assert_eq!(
        outcomes[2],
        Ok(ReserveOutcome::Skip(crate::directory::StoreSkip::NoRoom))
    );
    assert_eq!(
        outcomes[3],
        Err(DirectoryError::InvalidLength { length_bytes: 0 })
    );
    // A retried batch (a lost reply) replays every item instead of reserving again.
    assert_eq!(
        fixture
            .directory
            .reserve_many(fixture.now, a.session, &items)
            .unwrap(),
        outcomes
    );
    fixture.directory.check_invariants();
}

#[test]
fn a_batch_commits_each_item_once_and_resolves_item_by_item() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let items = reserve_items(&mut fixture, &[(1, MIB), (2, MIB)]);
    let outcomes = fixture
        .directory
        .reserve_many(fixture.now, a.session, &items)
        .unwrap();
    let commits: Vec<CommitBatchItem> = outcomes
        .iter()
        .enumerate()
        .map(|(index, outcome)| {
            let Ok(ReserveOutcome::Granted { replica, pool, .. }) = outcome else {
                panic!("expected a grant, got {outcome:?}");
            };
            CommitBatchItem {
                operation: fixture.operation(),
                replica: *replica,
                location: location(*pool, index as u64 + 1, MIB),
            }
        })
        .collect();
    let committed = fixture
        .directory
        .commit_many(fixture.now, a.session, &commits)
        .unwrap();
    assert_eq!(
        committed,
        vec![Ok(CommitOutcome::Committed), Ok(CommitOutcome::Committed)]
    );
    assert_eq!(
        fixture
            .directory
            .commit_many(fixture.now, a.session, &commits)
            .unwrap(),
        committed,
        "a retried batch replays"
    );
    for commit in &commits {
        assert_eq!(
            fixture
                .directory
                .resolve(a.session, a.session, commit.operation),
            Ok(ResolveOutcome::Committed(CommitOutcome::Committed))
        );
    }
    // An item naming a replica that was never reserved is refused alone.
    let mut stray = commits[0];
    stray.operation = fixture.operation();
    stray.replica = ReplicaId(u64::MAX);
    let fresh = reserve_items(&mut fixture, &[(3, MIB)]);
    let Ok(ReserveOutcome::Granted { replica, pool, .. }) = fixture
        .directory
        .reserve_many(fixture.now, a.session, &fresh)
        .unwrap()[0]
    else {
        panic!("expected a grant");
    };
    let good = CommitBatchItem {
        operation: fixture.operation(),
        replica,
        location: location(pool, 9, MIB),
    };
    let mixed = fixture
        .directory
        .commit_many(fixture.now, a.session, &[stray, good])
        .unwrap();
    assert!(mixed[0].is_err(), "{mixed:?}");
    assert_eq!(mixed[1], Ok(CommitOutcome::Committed));
    fixture.directory.check_invariants();
}

#[test]
fn a_batch_over_the_bound_is_refused_whole() {
    let mut fixture = Fixture::with_config(DirectoryConfig {
        batch_items_max: 2,
        ..DirectoryConfig::default()
    });
    let a = fixture.node("a", 16 * MIB);
    let items = reserve_items(&mut fixture, &[(1, MIB), (2, MIB), (3, MIB)]);
    assert_eq!(
        fixture
            .directory
            .reserve_many(fixture.now, a.session, &items),
        Err(DirectoryError::BatchTooLarge { items: 3, max: 2 })
    );
    // Nothing was applied: the first item's operation id was never seen.
    assert_eq!(
        fixture
            .directory
            .resolve(a.session, a.session, items[0].operation),
        Ok(ResolveOutcome::NotApplied)
    );
    let commits = vec![
        CommitBatchItem {
            operation: OperationId(1_000),
            replica: ReplicaId(1),
            location: location(a.cpu, 1, MIB),
        };
        3
    ];
    assert_eq!(
        fixture
            .directory
            .commit_many(fixture.now, a.session, &commits),
        Err(DirectoryError::BatchTooLarge { items: 3, max: 2 })
    );
    fixture.directory.check_invariants();
}

#[test]
fn a_partly_applied_batch_replays_the_applied_items_and_refuses_the_rest_on_retry() {
    let mut fixture = Fixture::with_config(DirectoryConfig {
        ledger_entries_per_session_max: 2,
        ..DirectoryConfig::default()
    });
    let a = fixture.node("a", 16 * MIB);
    let items = reserve_items(&mut fixture, &[(1, MIB), (2, MIB), (3, MIB)]);
    let outcomes = fixture
        .directory
        .reserve_many(fixture.now, a.session, &items)
        .unwrap();
    assert!(matches!(outcomes[0], Ok(ReserveOutcome::Granted { .. })));
    assert!(matches!(outcomes[1], Ok(ReserveOutcome::Granted { .. })));
    assert_eq!(outcomes[2], Err(DirectoryError::Full(Table::Ledger)));
    // Resolving the refused item must record it as not applied (so a late copy is
    // refused), which needs a ledger entry too: refused, the node counts it Unresolved.
    assert_eq!(
        fixture
            .directory
            .resolve(a.session, a.session, items[2].operation),
        Err(DirectoryError::Full(Table::Ledger))
    );
    // The retry (its reply was lost) replays the two applied items, reserves nothing
    // again, and refuses the third as the single reserve would.
    let retried = fixture
        .directory
        .reserve_many(fixture.now, a.session, &items)
        .unwrap();
    assert_eq!(retried[..2], outcomes[..2]);
    let single =
        fixture
            .directory
            .reserve(fixture.now, a.session, items[2].operation, items[2].item);
    assert_eq!(retried[2], single);
    assert_eq!(retried[2], Err(DirectoryError::Full(Table::Ledger)));
    fixture.directory.check_invariants();
}

#[test]
fn a_batch_arriving_after_its_first_item_was_resolved_applies_only_the_others() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let items = reserve_items(&mut fixture, &[(1, MIB), (2, MIB)]);
    // The node gave up waiting and resolved item 0 before the batch arrived.
    assert_eq!(
        fixture
            .directory
            .resolve(a.session, a.session, items[0].operation),
        Ok(ResolveOutcome::NotApplied)
    );
    let outcomes = fixture
        .directory
        .reserve_many(fixture.now, a.session, &items)
        .unwrap();
    assert_eq!(
        outcomes[0],
        Err(DirectoryError::OperationAcknowledged(items[0].operation))
    );
    let Ok(granted @ ReserveOutcome::Granted { .. }) = outcomes[1] else {
        panic!("{outcomes:?}");
    };
    assert_eq!(
        fixture
            .directory
            .resolve(a.session, a.session, items[1].operation),
        Ok(ResolveOutcome::Reserved(granted))
    );
    fixture.directory.check_invariants();
}
