//! A node whose session was fenced or replaced (it was silent for its fence window, and
//! rejoined the same directory) adopts its replicas again, while engines on it may still
//! read under the old session's leases: its reclaim tasks wait until those ended.

use super::tests::{Fixture, MIB};
use super::*;
use crate::model::Medium;

#[test]
fn a_replaced_session_holds_the_nodes_reclaims_until_its_leases_ended() {
    let mut fixture = Fixture::new();
    let a = fixture.node_with("a", MIB, vec![Medium::Cpu], vec![]);
    let object = fixture.object(1);
    let (_, stored) = fixture.store(&a, object, 4096);
    // An engine on node a reads under a lease of this session...
    let AcquireOutcome::Leased(_) = fixture.acquire_one(&a, object) else {
        panic!("a stored object is leased");
    };
    // ...when the node opens a new session (the old one is fenced) and adopts its replica.
    let a2 = fixture.node_with("a", MIB, vec![Medium::Cpu], vec![]);
    assert_eq!(a2.cpu, a.cpu);
    let holding = Holding {
        object,
        location: stored,
    };
    assert_eq!(
        fixture.directory.adopt(fixture.now, a2.session, &[holding]),
        Ok(vec![AdoptOutcome::Adopted])
    );
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&a2, object) else {
        panic!("the adopted replica is leased");
    };
    fixture
        .directory
        .release(a2.session, &[lease.lease])
        .unwrap();
    fixture
        .directory
        .retire(Some(a2.session), lease.replica)
        .unwrap();
    assert_eq!(
        fixture.polled(&a2),
        vec![],
        "the old session's lease may still be read: no reclaim yet"
    );
    let lease_duration = DirectoryConfig::default().lease_duration;
    fixture.advance(lease_duration, &a2);
    assert!(matches!(
        fixture.polled(&a2).as_slice(),
        [TaskKind::Reclaim { .. }]
    ));
    fixture.directory.check_invariants();
}
