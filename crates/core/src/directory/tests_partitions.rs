//! Tenants' memory: a salt group's objects are placed only in its own partition of a node's
//! CPU memory (or in a shared pool), whatever room the other partitions have; in a shared
//! pool, a group at its quota gets no more room and gives up its own coldest replicas.

use super::tests::{descriptor, Fixture, MIB};
use super::*;
use crate::model::{DomainId, Medium, ObjectId, PoolTenancy, PrefixDigest, SaltGroup};
use std::time::Duration;

/// A node with a CPU partition of 1 MiB for each of the salts `s1` and `s2`, the shared
/// CXL pool of its domain, and a namespace of each salt and an unsalted one.
struct Partitioned {
    fixture: Fixture,
    session: SessionId,
    partitions: [PoolId; 2],
    cxl: PoolId,
    /// Namespaces salted `s1`, `s2`, and unsalted.
    namespaces: [NamespaceId; 3],
}

fn partitioned() -> Partitioned {
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(8 * MIB);
    let reply = fixture
        .directory
        .open(
            fixture.now,
            OpenRequest {
                node_name: "a".into(),
                write_order: vec![Medium::Cpu, Medium::Cxl],
                read_order: vec![Medium::Cpu, Medium::Cxl],
                domains: vec![DomainId(0)],
                namespaces: NamespaceAccess::Any,
            },
        )
        .unwrap();
    let partition = |fixture: &mut Fixture, salt: &str| {
        fixture
            .directory
            .register_pool(
                Some(reply.session),
                PoolSpec {
                    name: format!("a-cpu-{salt}"),
                    medium: Medium::Cpu,
                    scope: Scope::Host(reply.node),
                    capacity_bytes: MIB,
                    page_bytes: 4096,
                    extent_bytes: None,
                    tenancy: PoolTenancy::Partition(SaltGroup::of(Some(salt))),
                },
            )
            .unwrap()
    };
    let partitions = [partition(&mut fixture, "s1"), partition(&mut fixture, "s2")];
    let mut namespace = |salt: Option<&str>| {
        let salted = crate::model::NamespaceDescriptor {
            salt: salt.map(str::to_string),
            ..descriptor()
        };
        fixture
            .directory
            .register_namespace(reply.session, salted)
            .unwrap()
    };
    let namespaces = [
        namespace(Some("s1")),
        namespace(Some("s2")),
        namespace(None),
    ];
    Partitioned {
        fixture,
        session: reply.session,
        partitions,
        cxl,
        namespaces,
    }
}

impl Partitioned {
    /// The pool a store of object `index` of namespace `namespace` is granted.
    fn granted_pool(&mut self, namespace: usize, index: u32) -> Option<PoolId> {
        let object = ObjectId {
            namespace: self.namespaces[namespace],
            prefix: PrefixDigest::ROOT.chain(&[index]),
            shard: 0,
            part: 0,
        };
        let operation = self.fixture.operation();
        let outcome = self
            .fixture
            .directory
            .reserve(
                self.fixture.now,
                self.session,
                operation,
                ReserveItem {
                    object,
                    length_bytes: 256 << 10,
                },
            )
            .unwrap();
        self.fixture.directory.check_invariants();
        match outcome {
            ReserveOutcome::Granted { pool, .. } => Some(pool),
            _ => None,
        }
    }
}

#[test]
fn a_salt_groups_objects_go_only_to_its_own_partition() {
    let mut node = partitioned();
    let [first, second] = node.partitions;
    assert_eq!(node.granted_pool(0, 0), Some(first));
    assert_eq!(node.granted_pool(1, 0), Some(second));
    // The first partition fills (four objects of 256 KiB); its group's next store goes one
    // tier on, to the shared pool, though the other partition has room.
    for index in 1..4 {
        assert_eq!(node.granted_pool(0, index), Some(first));
    }
    assert_eq!(node.granted_pool(0, 4), Some(node.cxl));
    assert_eq!(node.granted_pool(1, 1), Some(second));
    // An unsalted namespace has no partition on this node: only the shared pool takes it.
    assert_eq!(node.granted_pool(2, 0), Some(node.cxl));
}

#[test]
fn a_partition_is_a_host_pool_only() {
    let mut fixture = Fixture::new();
    let refused = fixture.directory.register_pool(
        None,
        PoolSpec {
            name: "cxl-partition".into(),
            medium: Medium::Cxl,
            scope: Scope::Domain(DomainId(0)),
            capacity_bytes: 8 * MIB,
            page_bytes: 4096,
            extent_bytes: Some(MIB),
            tenancy: PoolTenancy::Partition(SaltGroup::of(None)),
        },
    );
    assert!(matches!(refused, Err(DirectoryError::InvalidPool(_))));
}

/// A store of `length_bytes` for object `index` of `namespace` by `node`, committed when
/// granted: the pool, or the skip.
fn store_in(
    fixture: &mut Fixture,
    node: &super::tests::NodeHandle,
    namespace: NamespaceId,
    index: u32,
) -> Result<PoolId, StoreSkip> {
    let object = ObjectId {
        namespace,
        prefix: PrefixDigest::ROOT.chain(&[index]),
        shard: 0,
        part: 0,
    };
    match fixture.reserve(node, object, 256 << 10) {
        ReserveOutcome::Skip(skip) => Err(skip),
        granted => Ok(fixture.commit_granted(node, granted, 256 << 10).1.pool),
    }
}

#[test]
fn a_group_at_its_quota_in_a_shared_pool_gets_no_room_and_gives_up_its_own_coldest() {
    let quota = TierQuota {
        cxl_bytes: Some(MIB),
        ssd_bytes: None,
    };
    let mut config = DirectoryConfig::default();
    config.group_quotas.insert(SaltGroup::of(Some("s1")), quota);
    let mut fixture = Fixture::with_config(config);
    let cxl = fixture.cxl(16 * MIB);
    let node = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let mut namespace = |salt: &str| {
        let salted = crate::model::NamespaceDescriptor {
            salt: Some(salt.into()),
            ..descriptor()
        };
        fixture
            .directory
            .register_namespace(node.session, salted)
            .unwrap()
    };
    let (s1, s2) = (namespace("s1"), namespace("s2"));
    // s1 fills its 1 MiB quota of the 16 MiB pool; s2, without a quota, stores beside it.
    for index in 0..4 {
        assert_eq!(store_in(&mut fixture, &node, s1, index), Ok(cxl));
        assert_eq!(store_in(&mut fixture, &node, s2, index), Ok(cxl));
    }
    assert_eq!(store_in(&mut fixture, &node, s1, 4), Err(StoreSkip::NoRoom));
    assert_eq!(store_in(&mut fixture, &node, s2, 4), Ok(cxl));
    // Past the minimum residency, eviction takes s1's coldest replica, and none of s2's,
    // though the pool is far below its own watermark.
    let report = fixture.advance(Duration::from_secs(1), &node);
    assert_eq!(report.evicted, 1);
    let probed = |fixture: &Fixture, namespace, index| {
        let object = ObjectId {
            namespace,
            prefix: PrefixDigest::ROOT.chain(&[index]),
            shard: 0,
            part: 0,
        };
        fixture.directory.probe(node.session, &[object]).unwrap()[0]
    };
    assert_eq!(probed(&fixture, s1, 0), ProbeOutcome::Miss);
    for index in 0..5 {
        assert!(matches!(
            probed(&fixture, s2, index),
            ProbeOutcome::Hit { .. }
        ));
    }
    assert_eq!(store_in(&mut fixture, &node, s1, 4), Ok(cxl));
    fixture.directory.check_invariants();
}
