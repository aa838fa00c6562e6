//! Unit tests of the reasons a replication is skipped: each skip is counted under its own
//! reason, also when the network path is unavailable (no peer endpoint), which used to
//! report every shared pool's refusal as `no_path`.

use super::tests::{Fixture, NodeHandle, MIB};
use super::*;
use crate::model::{DomainId, Medium, ObjectId};
use std::net::SocketAddr;

/// Node A (CPU first, domain 0) holding `object` in its CPU pool, node B (domains
/// `b_domains`), a shared pool of `cxl_bytes` in domain 0; neither node serves a peer
/// endpoint unless `peers`.
fn two_nodes(
    config: DirectoryConfig,
    cxl_bytes: u64,
    b_order: Vec<Medium>,
    b_domains: Vec<DomainId>,
    peers: bool,
) -> (Fixture, NodeHandle, NodeHandle, ObjectId) {
    let mut fixture = Fixture::with_config(config);
    fixture.cxl(cxl_bytes);
    let a = fixture.node("a", 16 * MIB);
    let b = fixture.node_with("b", 16 * MIB, b_order, b_domains);
    let endpoint = peers.then(|| SocketAddr::from(([127, 0, 0, 1], 7500)));
    fixture.directory.set_peer_endpoint("a", endpoint);
    fixture.directory.set_peer_endpoint("b", endpoint);
    let object = fixture.object(1);
    let (_, stored) = fixture.store(&a, object, MIB);
    assert_eq!(stored.pool, a.cpu);
    (fixture, a, b, object)
}

/// B misses `object` once; the skips counted, by reason.
fn skips_after_one_miss(
    fixture: &mut Fixture,
    a: &NodeHandle,
    b: &NodeHandle,
    object: ObjectId,
) -> [u64; 4] {
    assert_eq!(fixture.acquire_one(b, object), AcquireOutcome::Miss);
    let tasks = fixture.poll(a, 64);
    assert!(tasks.is_empty(), "a skipped copy queued {tasks:?}");
    fixture.directory.check_invariants();
    fixture.directory.replication_counts().skipped
}

fn only(reason: SkipReason) -> [u64; 4] {
    let mut counts = [0; 4];
    counts[reason.index()] = 1;
    counts
}

#[test]
fn a_full_shared_pool_is_no_room_with_or_without_a_network_path() {
    for peers in [false, true] {
        // B fills the 1 MiB shared pool; network copies are on (the default).
        let (mut fixture, a, b, object) = two_nodes(
            DirectoryConfig::default(),
            MIB,
            vec![Medium::Cxl],
            vec![DomainId(0)],
            peers,
        );
        let filler = fixture.object(9);
        let (_, stored) = fixture.store(&b, filler, MIB);
        assert_ne!(stored.pool, b.cpu, "the filler went to the shared pool");
        if peers {
            // B's own CPU pool is the network candidate: fill it too.
            fixture.directory.config.high_watermark_percent = 0;
        }
        let skipped = skips_after_one_miss(&mut fixture, &a, &b, object);
        assert_eq!(skipped, only(SkipReason::NoRoom), "peers {peers}");
    }
}

#[test]
fn a_copy_that_does_not_pay_is_not_worth_with_or_without_a_network_path() {
    for peers in [false, true] {
        // Recomputing is nearly free: no copy pays, whatever the room.
        let config = DirectoryConfig {
            prefill_us_per_token: 1e-6,
            ..DirectoryConfig::default()
        };
        let (mut fixture, a, b, object) = two_nodes(
            config,
            16 * MIB,
            vec![Medium::Cpu],
            vec![DomainId(0)],
            peers,
        );
        let skipped = skips_after_one_miss(&mut fixture, &a, &b, object);
        assert_eq!(skipped, only(SkipReason::NotWorth), "peers {peers}");
    }
}

#[test]
fn no_shared_domain_and_no_network_path_is_no_path() {
    // (network copies on, both nodes serve a peer endpoint)
    for (network, peers) in [(false, true), (true, false), (false, false)] {
        let config = DirectoryConfig {
            replicate_over_network: network,
            ..DirectoryConfig::default()
        };
        let (mut fixture, a, b, object) =
            two_nodes(config, 16 * MIB, vec![Medium::Cpu], vec![], peers);
        let skipped = skips_after_one_miss(&mut fixture, &a, &b, object);
        assert_eq!(
            skipped,
            only(SkipReason::NoPath),
            "network {network} peers {peers}"
        );
    }
}

#[test]
fn a_shared_pool_without_room_outranks_a_network_copy_that_does_not_pay() {
    // 600 µs to recompute a 256-token object: keeping 1 MiB in CXL (about 420 µs) pays,
    // the network copy (about 594 µs to transfer, 191 µs to keep in DRAM) does not. The
    // shared pool is full: the copy was missed for room, so the skip is `no_room`.
    let config = DirectoryConfig {
        prefill_us_per_token: 600.0 / 256.0,
        ..DirectoryConfig::default()
    };
    let (mut fixture, a, b, object) =
        two_nodes(config, MIB, vec![Medium::Cxl], vec![DomainId(0)], true);
    let filler = fixture.object(9);
    let (_, stored) = fixture.store(&b, filler, MIB);
    assert_ne!(stored.pool, b.cpu, "the filler went to the shared pool");
    let skipped = skips_after_one_miss(&mut fixture, &a, &b, object);
    assert_eq!(skipped, only(SkipReason::NoRoom));
}
