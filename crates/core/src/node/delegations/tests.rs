use super::*;
use crate::model::{
    AllocationId, Generation, Location, Medium, NamespaceId, PoolId, PrefixDigest, ReplicaId,
};

const LEASE: Duration = Duration::from_secs(30);

fn at(seconds: u64) -> Timestamp {
    Timestamp::ZERO + Duration::from_secs(seconds)
}

fn object(index: u8) -> ObjectId {
    ObjectId {
        namespace: NamespaceId([1; 16]),
        prefix: PrefixDigest([index; 16]),
        shard: 0,
        part: 0,
    }
}

fn lease(replica: u64) -> Lease {
    Lease {
        lease: LeaseId(100 + replica),
        duration_ms: LEASE.as_millis() as u64,
        replica: ReplicaId(replica),
        medium: Medium::Cpu,
        location: Location {
            pool: PoolId(0),
            allocation: AllocationId(replica),
            generation: Generation(1),
            offset_bytes: replica * 4096,
            length_bytes: 4096,
        },
        deadline: at(30),
    }
}

fn delegation(id: u64) -> Delegation {
    Delegation {
        lease: LeaseId(id),
        duration_ms: 2 * LEASE.as_millis() as u64,
    }
}

/// A node holding delegation 7 on object 1 (replica 1), granted at 0.
fn delegated() -> Delegations {
    let mut delegations = Delegations::default();
    delegations.granted(at(0), object(1), &lease(1), delegation(7));
    delegations
}

#[test]
fn a_delegated_object_is_a_local_hit_with_a_local_lease() {
    let mut delegations = delegated();
    let probed = delegations.probe(at(1), &[object(1)]).unwrap();
    assert!(matches!(
        probed[0],
        ProbeOutcome::Hit {
            length_bytes: 4096,
            ..
        }
    ));
    let leases = delegations.acquire(at(1), &[object(1)]).unwrap();
    assert!(is_local(leases[0].lease));
    assert_eq!(leases[0].replica, ReplicaId(1));
    assert_eq!(leases[0].deadline, at(31));
    // One miss in a batch: nothing is granted, the batch goes to the directory.
    assert!(delegations
        .acquire(at(1), &[object(1), object(2)])
        .is_none());
    assert!(delegations.probe(at(1), &[object(2)]).is_none());
    assert_eq!(delegations.local_leases(), 1);
    assert_eq!(delegations.counts().local_hits, 1);
}

#[test]
fn no_local_lease_outlives_its_delegation() {
    let mut delegations = delegated();
    // The delegation lasts until 60: a 30 s local lease fits until 30, not after.
    assert!(delegations.acquire(at(30), &[object(1)]).is_some());
    assert!(delegations.acquire(at(31), &[object(1)]).is_none());
    assert!(delegations.probe(at(31), &[object(1)]).is_none());
}

#[test]
fn a_recall_stops_grants_at_once_and_releases_after_the_last_reader() {
    let mut delegations = delegated();
    let leases = delegations.acquire(at(1), &[object(1), object(1)]).unwrap();
    delegations.recall(at(2), LeaseId(7));
    assert!(delegations.acquire(at(2), &[object(1)]).is_none());
    assert!(
        delegations.take_releases().is_empty(),
        "two readers are live"
    );
    assert!(delegations.release_local(at(3), leases[0].lease));
    assert!(delegations.take_releases().is_empty(), "one reader is live");
    assert!(delegations.release_local(at(4), leases[1].lease));
    assert_eq!(delegations.take_releases(), vec![LeaseId(7)]);
    assert_eq!(
        delegations.take_recall_latencies(),
        vec![Duration::from_secs(2)]
    );
    // A repeated recall changes nothing.
    delegations.recall(at(5), LeaseId(7));
    assert!(delegations.take_releases().is_empty());
    assert_eq!(delegations.counts().recalls, 1);
}

#[test]
fn a_recall_waits_for_a_reader_until_its_deadline() {
    let mut delegations = delegated();
    delegations.acquire(at(1), &[object(1)]).unwrap();
    delegations.recall(at(2), LeaseId(7));
    delegations.expire(at(30));
    assert!(delegations.take_releases().is_empty());
    delegations.expire(at(31));
    assert_eq!(delegations.take_releases(), vec![LeaseId(7)]);
}

#[test]
fn a_grant_recalled_before_it_arrived_is_released_not_served() {
    let mut delegations = Delegations::default();
    delegations.recall(at(0), LeaseId(7));
    delegations.granted(at(0), object(1), &lease(1), delegation(7));
    assert_eq!(delegations.take_releases(), vec![LeaseId(7)]);
    assert!(delegations.acquire(at(1), &[object(1)]).is_none());
}

#[test]
fn a_newer_delegation_supersedes_the_older_once_its_readers_are_gone() {
    let mut delegations = delegated();
    let old = delegations.acquire(at(1), &[object(1)]).unwrap();
    delegations.granted(at(40), object(1), &lease(1), delegation(8));
    assert!(delegations.take_releases().is_empty(), "a reader is live");
    let new = delegations.acquire(at(41), &[object(1)]).unwrap();
    assert!(new[0].deadline > at(60), "granted under the newer one");
    delegations.release_local(at(42), old[0].lease);
    assert_eq!(delegations.take_releases(), vec![LeaseId(7)]);
    // The object stays delegated under the newer one.
    assert!(delegations.probe(at(42), &[object(1)]).is_some());
}

#[test]
fn hits_are_reported_once_and_delegations_end_with_their_time_or_session() {
    let mut delegations = delegated();
    delegations.acquire(at(1), &[object(1), object(1)]).unwrap();
    let reports = delegations.take_hit_reports(16);
    assert_eq!(reports.len(), 1);
    assert_eq!((reports[0].delegation, reports[0].hits), (LeaseId(7), 2));
    assert!(delegations.take_hit_reports(16).is_empty());
    delegations.expire(at(60));
    assert!(delegations.is_empty());
    assert!(
        delegations.take_releases().is_empty(),
        "it ended at the directory too"
    );
    let mut delegations = delegated();
    delegations.clear();
    assert!(delegations.probe(at(1), &[object(1)]).is_none());
}

#[test]
fn the_same_grant_twice_is_kept_not_released() {
    let mut delegations = delegated();
    delegations.granted(at(0), object(1), &lease(1), delegation(7));
    assert!(delegations.take_releases().is_empty());
    assert!(delegations.acquire(at(1), &[object(1)]).is_some());
}
