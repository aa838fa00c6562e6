//! Unit tests of the replication books' bounds: the demand table stops at
//! [`DEMANDS_MAX`] (a miss past it is a counted `busy` skip, never stored), and at most
//! [`REPLICATIONS_IN_FLIGHT_MAX`] copies run at once (the next waits as a demand and is
//! planned by a tick once one ends).

use super::replication::{DEMANDS_MAX, REPLICATIONS_IN_FLIGHT_MAX};
use super::tests::{Fixture, NodeHandle, MIB};
use super::*;
use crate::model::{DomainId, Medium, ObjectId, ReplicaId};

/// Bytes of each object: one page, so thousands fit in the test's pools.
const OBJECT_BYTES: u64 = 4096;

/// The objects A holds, each with its replica.
type Held = Vec<(ObjectId, ReplicaId)>;

/// Node A holding `objects` one-page objects in its CPU pool, node B in the same domain
/// (it maps the shared pool, never A's CPU pool), and the shared pool.
fn holders(config: DirectoryConfig, objects: u32) -> (Fixture, NodeHandle, NodeHandle, Held) {
    let mut fixture = Fixture::with_config(config);
    fixture.cxl(64 * MIB);
    let a = fixture.node_with("a", 64 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let mut held = Vec::new();
    for index in 0..objects {
        let id = fixture.object(index);
        let (replica, _) = fixture.store(&a, id, OBJECT_BYTES);
        held.push((id, replica));
    }
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    (fixture, a, b, held)
}

fn busy_skips(fixture: &Fixture) -> u64 {
    fixture.directory.replication_counts().skipped[SkipReason::Busy.index()]
}

#[test]
fn the_demand_table_stops_at_its_bound_and_counts_the_miss_past_it() {
    let config = DirectoryConfig {
        // Every first miss is remembered and none replicates yet.
        replicate_after_misses: 2,
        ..DirectoryConfig::default()
    };
    let (mut fixture, _, b, held) = holders(config, DEMANDS_MAX as u32 + 1);
    let (remembered, past) = held.split_at(DEMANDS_MAX);
    for (id, _) in remembered {
        assert_eq!(fixture.acquire_one(&b, *id), AcquireOutcome::Miss);
    }
    assert_eq!(
        busy_skips(&fixture),
        0,
        "every demand up to the bound is kept"
    );
    fixture.directory.check_invariants();
    // One more object: not remembered, counted.
    assert_eq!(fixture.acquire_one(&b, past[0].0), AcquireOutcome::Miss);
    assert_eq!(busy_skips(&fixture), 1);
    fixture.directory.check_invariants();
    // A remembered demand still counts its second miss, and plans its copy.
    assert_eq!(
        fixture.acquire_one(&b, remembered[0].0),
        AcquireOutcome::Miss
    );
    assert_eq!(fixture.directory.replication_counts().planned, 1);
    // A demand whose copy started left the table: the forgotten one is remembered now,
    // from its first miss, and its second plans its copy.
    assert_eq!(fixture.acquire_one(&b, past[0].0), AcquireOutcome::Miss);
    assert_eq!(busy_skips(&fixture), 1);
    assert_eq!(fixture.directory.replication_counts().planned, 1);
    assert_eq!(fixture.acquire_one(&b, past[0].0), AcquireOutcome::Miss);
    assert_eq!(fixture.directory.replication_counts().planned, 2);
    fixture.directory.check_invariants();
}

#[test]
fn copies_in_flight_stop_at_their_bound_and_the_next_waits_for_a_tick() {
    let (mut fixture, a, b, held) = holders(
        DirectoryConfig::default(),
        REPLICATIONS_IN_FLIGHT_MAX as u32 + 1,
    );
    let (planned, waiting) = held.split_at(REPLICATIONS_IN_FLIGHT_MAX);
    for (id, _) in planned {
        assert_eq!(fixture.acquire_one(&b, *id), AcquireOutcome::Miss);
    }
    let counts = fixture.directory.replication_counts();
    let bound = REPLICATIONS_IN_FLIGHT_MAX as u64;
    assert_eq!((counts.planned, counts.in_flight), (bound, bound));
    assert_eq!(busy_skips(&fixture), 0);
    assert_eq!(fixture.acquire_one(&b, waiting[0].0), AcquireOutcome::Miss);
    let counts = fixture.directory.replication_counts();
    assert_eq!((counts.planned, counts.in_flight), (bound, bound));
    assert_eq!(
        busy_skips(&fixture),
        1,
        "the copy past the bound is counted"
    );
    fixture.directory.check_invariants();
    // A tick while the bound holds plans nothing and counts nothing again.
    fixture.directory.tick(fixture.now);
    assert_eq!(fixture.directory.replication_counts().planned, bound);
    assert_eq!(busy_skips(&fixture), 1);
    // One copy ends (its source is retired): the waiting demand is planned by a tick.
    let (object, source) = planned[0];
    fixture
        .directory
        .retire_object(a.session, &object, source)
        .unwrap();
    let counts = fixture.directory.replication_counts();
    assert_eq!((counts.cancelled, counts.in_flight), (1, bound - 1));
    fixture.directory.tick(fixture.now);
    let counts = fixture.directory.replication_counts();
    assert_eq!((counts.planned, counts.in_flight), (bound + 1, bound));
    fixture.directory.check_invariants();
}
