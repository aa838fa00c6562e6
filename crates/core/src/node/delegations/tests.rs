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

#[test]
fn an_owned_replica_is_a_local_hit_until_its_reclaim_and_goes_after_its_last_reader() {
    let mut delegations = Delegations::default();
    let mark = delegations.session_mark();
    delegations.owned(mark, object(2), lease(2));
    // Hits from its commit on, for as long as the session: a local lease of a lease's length.
    let leases = delegations.acquire(at(500), &[object(2)]).unwrap();
    assert!(is_local(leases[0].lease));
    assert_eq!(leases[0].replica, ReplicaId(2));
    assert_eq!(leases[0].deadline, at(530));
    // Its reclaim while the lease is live: no more grants, and not yet.
    assert!(!delegations.may_reclaim(at(501), ReplicaId(2)));
    assert!(delegations.probe(at(501), &[object(2)]).is_none());
    assert!(
        !delegations.may_reclaim(at(502), ReplicaId(2)),
        "handed out again"
    );
    // The last reader gone: the reclaim goes, and nothing is owed to the directory.
    assert!(delegations.release_local(at(503), leases[0].lease));
    assert!(delegations.may_reclaim(at(504), ReplicaId(2)));
    assert!(delegations.take_releases().is_empty());
    assert!(delegations.is_empty());
    // The hits are reported by replica, for the directory to count.
    let reports = delegations.take_hit_reports(16);
    assert!(reports.is_empty(), "the entry is gone with its reports");
    // A replica never owned goes at once.
    assert!(delegations.may_reclaim(at(505), ReplicaId(9)));
}

#[test]
fn an_owned_replica_reports_its_hits_by_replica_and_a_reader_past_its_deadline_lets_it_go() {
    let mut delegations = Delegations::default();
    delegations.owned(delegations.session_mark(), object(3), lease(3));
    let leases = delegations.acquire(at(0), &[object(3)]).unwrap();
    let reports = delegations.take_hit_reports(16);
    assert_eq!(reports.len(), 1);
    assert_eq!(
        (reports[0].replica, reports[0].object, reports[0].hits),
        (ReplicaId(3), object(3), 1)
    );
    assert!(!delegations.may_reclaim(at(1), ReplicaId(3)));
    delegations.expire(at(30));
    assert_eq!(
        delegations.local_leases(),
        0,
        "{leases:?} ended at its deadline"
    );
    assert!(delegations.may_reclaim(at(31), ReplicaId(3)));
}

#[test]
fn a_commit_answered_after_its_session_ended_records_nothing() {
    let mut delegations = Delegations::default();
    let sent_in = delegations.session_mark();
    delegations.owned(sent_in, object(4), lease(4));
    delegations.clear();
    assert!(
        delegations.probe(at(0), &[object(4)]).is_none(),
        "gone with its session"
    );
    // A commit sent in the ended session, answered now: its replica id may name
    // something else in the next session, so it is not recorded.
    delegations.owned(sent_in, object(5), lease(5));
    assert!(delegations.probe(at(0), &[object(5)]).is_none());
    delegations.owned(delegations.session_mark(), object(5), lease(5));
    assert!(delegations.probe(at(0), &[object(5)]).is_some());
}

#[test]
fn an_object_answered_here_already_is_not_owned_twice_and_an_owned_replica_outranks_a_delegation() {
    let mut delegations = delegated();
    let mark = delegations.session_mark();
    // Object 1 is delegated: owning another replica of it records nothing.
    delegations.owned(mark, object(1), lease(6));
    assert!(delegations.may_reclaim(at(1), ReplicaId(6)));
    // An owned object whose delegation arrives (offered on a copy in shared memory): the
    // owned replica keeps answering, and the delegation is released at once.
    delegations.owned(mark, object(2), lease(2));
    delegations.granted(at(2), object(2), &lease(12), delegation(8));
    assert_eq!(delegations.take_releases(), vec![LeaseId(8)]);
    let leases = delegations.acquire(at(3), &[object(2)]).unwrap();
    assert_eq!(leases[0].replica, ReplicaId(2));
    assert!(delegations.release_local(at(3), leases[0].lease));
    // Once the owned replica's reclaim came, a delegation answers in its place.
    assert!(delegations.may_reclaim(at(4), ReplicaId(2)));
    delegations.granted(at(4), object(2), &lease(12), delegation(9));
    let leases = delegations.acquire(at(5), &[object(2)]).unwrap();
    assert_eq!(leases[0].replica, ReplicaId(12));
}
