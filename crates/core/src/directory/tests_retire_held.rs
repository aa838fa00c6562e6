//! `retire_held`: a node's SSD store dropped a region, so the READY replicas it names by
//! location in the node's own SSD pool retire, and nothing else does.

use super::tests::{Fixture, NodeHandle, MIB};
use super::*;
use crate::model::{AllocationId, DomainId, Generation, Location, Medium, ObjectId};
use std::time::Duration;

const LENGTH: u64 = 64 << 10;

struct Held {
    fixture: Fixture,
    a: NodeHandle,
    b: NodeHandle,
    a_ssd: PoolId,
    b_ssd: PoolId,
}

fn ssd_pool(fixture: &mut Fixture, node: &NodeHandle, name: &str) -> PoolId {
    fixture
        .directory
        .register_pool(
            Some(node.session),
            PoolSpec {
                name: name.into(),
                medium: Medium::Ssd,
                scope: Scope::Host(node.node),
                capacity_bytes: 64 * MIB,
                page_bytes: 4096,
                extent_bytes: None,
                tenancy: crate::model::PoolTenancy::Shared,
            },
        )
        .unwrap()
}

/// Node `a` writes to CXL first, node `b` to its CPU; both have an SSD pool; the
/// directory takes adoptions.
fn held() -> Held {
    let mut fixture = Fixture::new();
    fixture.cxl(16 * MIB);
    let a = fixture.node_with("a", 16 * MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let a_ssd = ssd_pool(&mut fixture, &a, "a-ssd");
    let b_ssd = ssd_pool(&mut fixture, &b, "b-ssd");
    fixture
        .directory
        .recover_until(Timestamp::ZERO + Duration::from_secs(3600));
    fixture.directory.tick(fixture.now);
    Held {
        fixture,
        a,
        b,
        a_ssd,
        b_ssd,
    }
}

fn on_ssd(pool: PoolId, offset_bytes: u64, generation: u64) -> Location {
    Location {
        pool,
        allocation: AllocationId(offset_bytes),
        generation: Generation(generation),
        offset_bytes,
        length_bytes: LENGTH,
    }
}

impl Held {
    fn adopt(&mut self, node: Node, object: ObjectId, location: Location) {
        let session = self.session(node);
        let holding = Holding { object, location };
        let outcomes = self
            .fixture
            .directory
            .adopt(self.fixture.now, session, &[holding])
            .unwrap();
        assert_eq!(outcomes, vec![AdoptOutcome::Adopted]);
    }

    fn session(&self, node: Node) -> SessionId {
        match node {
            Node::A => self.a.session,
            Node::B => self.b.session,
        }
    }

    fn retire_held(&mut self, node: Node, holdings: &[Holding]) -> Result<u32, DirectoryError> {
        let session = self.session(node);
        let retired = self.fixture.directory.retire_held(session, holdings);
        self.fixture.directory.check_invariants();
        retired
    }

    fn state_at(&self, object: ObjectId, location: Location) -> Option<ReplicaState> {
        self.fixture
            .directory
            .replicas
            .of_object(&object)
            .find(|(_, replica)| replica.location() == location)
            .map(|(_, replica)| replica.state)
    }
}

#[derive(Clone, Copy)]
enum Node {
    A,
    B,
}

#[test]
fn the_replica_at_the_held_location_retires_once() {
    let mut held = held();
    let object = held.fixture.object(1);
    let location = on_ssd(held.a_ssd, 0, 3);
    held.adopt(Node::A, object, location);
    let holding = [Holding { object, location }];
    assert_eq!(held.retire_held(Node::A, &holding), Ok(1));
    assert_eq!(
        held.state_at(object, location),
        Some(ReplicaState::Retiring)
    );
    assert_eq!(
        held.retire_held(Node::A, &holding),
        Ok(0),
        "repeating the request retires nothing more (a retiring replica is left alone)"
    );
}

#[test]
fn another_nodes_replica_is_untouched() {
    let mut held = held();
    let object = held.fixture.object(1);
    let location = on_ssd(held.b_ssd, 0, 1);
    held.adopt(Node::B, object, location);
    let holding = [Holding { object, location }];
    assert_eq!(held.retire_held(Node::A, &holding), Ok(0));
    assert_eq!(held.state_at(object, location), Some(ReplicaState::Ready));
}

#[test]
fn the_object_at_another_generation_or_offset_is_untouched() {
    let mut held = held();
    let object = held.fixture.object(1);
    let location = on_ssd(held.a_ssd, 1 << 20, 2);
    held.adopt(Node::A, object, location);
    let stale = [
        Holding {
            object,
            location: on_ssd(held.a_ssd, 1 << 20, 1),
        },
        Holding {
            object,
            location: on_ssd(held.a_ssd, 2 << 20, 2),
        },
        Holding {
            object: held.fixture.object(2),
            location,
        },
    ];
    assert_eq!(held.retire_held(Node::A, &stale), Ok(0));
    assert_eq!(held.state_at(object, location), Some(ReplicaState::Ready));
}

#[test]
fn a_memory_replica_of_the_node_is_untouched() {
    let mut held = held();
    let object = held.fixture.object(1);
    let (_, cxl) = held.fixture.store(&held.a, object, LENGTH);
    assert_eq!(
        held.fixture.directory.pools[cxl.pool.0 as usize]
            .spec
            .medium,
        Medium::Cxl
    );
    let other = held.fixture.object(2);
    let (_, cpu) = held.fixture.store(&held.b, other, LENGTH);
    let holdings = [
        Holding {
            object,
            location: cxl,
        },
        Holding {
            object: other,
            location: cpu,
        },
    ];
    assert_eq!(held.retire_held(Node::A, &holdings[..1]), Ok(0));
    assert_eq!(held.retire_held(Node::B, &holdings[1..]), Ok(0));
    assert_eq!(held.state_at(object, cxl), Some(ReplicaState::Ready));
    assert_eq!(held.state_at(other, cpu), Some(ReplicaState::Ready));
}

#[test]
fn a_batch_over_the_bound_is_refused() {
    let mut held = held();
    let object = held.fixture.object(1);
    let location = on_ssd(held.a_ssd, 0, 1);
    held.adopt(Node::A, object, location);
    let max = DirectoryConfig::default().batch_items_max as usize;
    let holdings = vec![Holding { object, location }; max + 1];
    assert!(matches!(
        held.retire_held(Node::A, &holdings),
        Err(DirectoryError::BatchTooLarge { .. })
    ));
    assert_eq!(held.state_at(object, location), Some(ReplicaState::Ready));
}

#[test]
fn a_fenced_session_is_refused() {
    let mut held = held();
    let object = held.fixture.object(1);
    let location = on_ssd(held.a_ssd, 0, 1);
    held.adopt(Node::A, object, location);
    let fenced = held.a.session;
    let reopened = held
        .fixture
        .node_with("a", 16 * MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    assert_ne!(reopened.session, fenced);
    let holding = [Holding { object, location }];
    assert!(matches!(
        held.fixture.directory.retire_held(fenced, &holding),
        Err(DirectoryError::Fenced { .. })
    ));
}
