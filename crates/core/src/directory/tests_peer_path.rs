//! Unit tests of the network path's precondition: a copy over the network is planned only
//! between nodes that both serve a peer endpoint.

use super::tests::{Fixture, MIB};
use super::*;
use crate::model::Medium;
use std::net::SocketAddr;

#[test]
fn no_network_copy_is_planned_to_or_from_a_node_without_a_peer_endpoint() {
    let no_path = SkipReason::ALL
        .iter()
        .position(|reason| *reason == SkipReason::NoPath)
        .unwrap();
    for (a_serves, b_serves) in [(false, true), (true, false), (true, true)] {
        let mut fixture = Fixture::new();
        let a = fixture.node("a", 16 * MIB);
        let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![]);
        let endpoint = |serves: bool| serves.then(|| SocketAddr::from(([127, 0, 0, 1], 7500)));
        fixture.directory.set_peer_endpoint("a", endpoint(a_serves));
        fixture.directory.set_peer_endpoint("b", endpoint(b_serves));
        let statuses = fixture.directory.node_statuses();
        let addresses: Vec<_> = statuses.iter().map(|status| status.peer_address).collect();
        assert_eq!(addresses, [endpoint(a_serves), endpoint(b_serves)]);
        let object = fixture.object(1);
        fixture.store(&a, object, MIB);
        assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
        let both = a_serves && b_serves;
        let tasks = fixture.poll(&a, 64);
        assert_eq!(tasks.len(), usize::from(both), "a {a_serves} b {b_serves}");
        let counts = fixture.directory.replication_counts();
        assert_eq!(counts.skipped[no_path], u64::from(!both));
        assert_eq!(counts.in_flight, u64::from(both));
        fixture.directory.check_invariants();
    }
}
