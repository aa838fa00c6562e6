//! Batched stores against real processes: `Client::store_many` splits into batches of at
//! most `STORE_BATCH_ITEMS_MAX` (each one reserve and one commit round trip), gives one
//! outcome per item (a full pool skips only the items past it), and the node refuses an
//! oversized or partly invalid batch with typed errors, whole or per item. The blocking
//! forms (copies on the calling thread, round trips on the runtime) round trip as well.

mod common;

use common::{connect, object, runtime};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::{AcquireMode, CommitOutcome, ReserveItem};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{NamespaceId, ObjectId};
use kvtier_core::node::ClientRefusal;
use kvtier_core::protocol::messages::{
    ClientReply, ClientRequest, Hello, ProtocolError, StoreCommitted, StoreGrant,
    STORE_BATCH_ITEMS_MAX,
};
use kvtier_core::wire::{uds, RpcClient, RpcConfig};
use kvtier_tools::launch::{ClusterSpec, LocalCluster};
use std::path::Path;
use std::time::{Duration, Instant};

fn cluster(cpu_pool_bytes: u64) -> LocalCluster {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes,
        // Eviction off: the tests fill the pool on purpose and read back what they stored.
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        ..ClusterSpec::default()
    };
    LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap()
}

type RawClient = RpcClient<ClientRequest, ClientReply>;

/// A connection that speaks the client protocol itself, with the demo namespace registered.
async fn raw_client(cluster: &LocalCluster) -> (RawClient, NamespaceId) {
    let stream = uds::connect(&cluster.socket(0).unwrap()).await.unwrap();
    kvtier_core::wire::handoff::receive(&stream, Duration::from_secs(30))
        .await
        .unwrap();
    let (reader, writer) = stream.into_split();
    let config = RpcConfig {
        inflight_requests_max: 4,
        request_timeout: Duration::from_secs(30),
    };
    let rpc = RawClient::spawn(reader, writer, config).unwrap();
    rpc.call(ClientRequest::Hello(Hello::ours())).await.unwrap();
    let reply = rpc
        .call(ClientRequest::RegisterNamespace(demo_namespace()))
        .await
        .unwrap();
    let ClientReply::Namespace(namespace) = reply else {
        panic!("{reply:?}");
    };
    (rpc, namespace)
}

/// A 4 KiB store of object `index` of `namespace`.
fn item(index: u32, namespace: NamespaceId) -> ReserveItem {
    ReserveItem {
        object: object(namespace, index, 3, 0).0,
        length_bytes: 4096,
    }
}

#[test]
fn store_many_splits_into_batches_and_round_trips_every_item() {
    let cluster = cluster(64 << 20);
    store_and_load_every_item(&cluster, usize::MAX);
}

/// One node of a 64 MiB pool under a directory that takes at most `batch_items_max` items a
/// request.
fn cluster_with_directory_batch(batch_items_max: u32) -> LocalCluster {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 64 << 20,
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        batch_items_max: Some(batch_items_max),
        ..ClusterSpec::default()
    };
    LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap()
}

#[test]
fn a_directory_batch_smaller_than_the_client_batch_is_split_by_the_node() {
    let cluster = cluster_with_directory_batch(5);
    store_and_load_every_item(&cluster, 5);
}

#[test]
fn load_into_and_release_split_by_the_bound_the_directory_names() {
    let cluster = cluster_with_directory_batch(5);
    let runtime = multi_thread_runtime();
    let (client, namespace) = runtime.block_on(connect(&cluster, 0));
    let objects: Vec<_> = (0..23)
        .map(|index| object(namespace, index, 6, 4096))
        .collect();
    store_all_blocking(&client, runtime.handle(), &objects);
    let ids: Vec<_> = objects.iter().map(|(id, _)| *id).collect();
    // Both forms, more objects than the directory takes in one acquire; each on a client of
    // its own, so each learns the bound from its own refusal.
    for blocking in [false, true] {
        let (client, _) = runtime.block_on(connect(&cluster, 0));
        let mut buffers = vec![vec![0u8; 4096]; ids.len()];
        let mut targets: Vec<&mut [u8]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
        let hits = if blocking {
            client.load_into_blocking(runtime.handle(), &ids, &mut targets)
        } else {
            runtime.block_on(client.load_into(&ids, &mut targets))
        };
        assert_eq!(hits.unwrap(), vec![true; ids.len()]);
        for ((_, bytes), loaded) in objects.iter().zip(&buffers) {
            assert_eq!(bytes, loaded);
        }
    }
    // A release of more leases than the bound goes through in parts, on a client that has
    // not learned the bound yet (its loads stay within it).
    runtime.block_on(async {
        let (client, _) = connect(&cluster, 0).await;
        let mut leases = Vec::new();
        for part in ids.chunks(5) {
            let views = client.load(part, AcquireMode::Each).await.unwrap();
            leases.extend(views.into_iter().map(|view| view.unwrap().into_lease()));
        }
        client.release(&leases).await.unwrap();
    });
}

#[test]
fn a_dropped_store_many_future_aborts_its_reservations_at_once() {
    let cluster = cluster(64 << 20);
    runtime().block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        // Dropped after its first poll (the reserve sent, its reply not yet in) and at
        // later points; a call that finished in time leaves nothing reserved either.
        for (round, after_ms) in [0u64, 0, 1, 3].into_iter().enumerate() {
            // 12 MiB a call, two batches: 48 MiB in all fit the pool.
            let objects: Vec<_> = (0..24)
                .map(|index| object(namespace, index, 10 + round as u32, 512 << 10))
                .collect();
            let items: Vec<_> = objects
                .iter()
                .map(|(id, bytes)| (*id, &bytes[..]))
                .collect();
            let store = client.store_many(&items);
            let _ = tokio::time::timeout(Duration::from_millis(after_ms), store).await;
        }
        // Well before a ticket's 30 s lifetime ends.
        nothing_reserved_within(&cluster, Duration::from_secs(10)).await;
    });
}

#[test]
fn store_many_of_more_items_than_a_node_admits_tickets_stores_them_all() {
    let cluster = cluster(128 << 20);
    runtime().block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        let objects: Vec<_> = (0..1_100)
            .map(|index| object(namespace, index, 4, 4096))
            .collect();
        let items: Vec<_> = objects
            .iter()
            .map(|(id, bytes)| (*id, &bytes[..]))
            .collect();
        let outcomes = client.store_many(&items).await;
        assert_eq!(outcomes.len(), items.len());
        let stored = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Ok(StoreOutcome::Stored)))
            .count();
        let other = outcomes
            .iter()
            .find(|outcome| !matches!(outcome, Ok(StoreOutcome::Stored)));
        assert_eq!(stored, items.len(), "{other:?}");
    });
}

#[test]
fn a_dropped_connection_gives_its_batch_reservations_back() {
    let cluster = cluster(16 << 20);
    runtime().block_on(async {
        let (rpc, namespace) = raw_client(&cluster).await;
        let items = (0..8).map(|index| item(index, namespace)).collect();
        let reply = rpc
            .call(ClientRequest::BeginStoreMany { items })
            .await
            .unwrap();
        let ClientReply::Grants(grants) = reply else {
            panic!("{reply:?}");
        };
        assert!(
            grants
                .iter()
                .all(|grant| matches!(grant, Ok(StoreGrant::Write { .. }))),
            "{grants:?}"
        );
        assert!(reserved_bytes(&cluster).await >= 8 * 4096);
        drop(rpc);
        nothing_reserved_within(&cluster, Duration::from_secs(10)).await;
    });
}

/// The bytes the directory holds reserved (granted, not committed) over every pool.
/// Stores `objects` through the blocking `store_many` and asserts each was stored; returns
/// the items, for another call.
fn store_all_blocking<'a>(
    client: &Client,
    runtime: &tokio::runtime::Handle,
    objects: &'a [(ObjectId, Vec<u8>)],
) -> Vec<(ObjectId, &'a [u8])> {
    let items: Vec<_> = objects
        .iter()
        .map(|(id, bytes)| (*id, &bytes[..]))
        .collect();
    let outcomes = client.store_many_blocking(runtime, &items);
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Ok(StoreOutcome::Stored))),
        "{outcomes:?}"
    );
    items
}

/// A runtime of two worker threads, for the blocking forms called from outside it (the test's
/// own thread copies while the workers drive the round trips).
fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits until the directory holds no reserved bytes, failing past `within`.
async fn nothing_reserved_within(cluster: &LocalCluster, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let reserved = reserved_bytes(cluster).await;
        if reserved == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{reserved} bytes still reserved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn reserved_bytes(cluster: &LocalCluster) -> u64 {
    let (rpc, _) = raw_client(cluster).await;
    let reply = rpc.call(ClientRequest::ClusterStatus).await.unwrap();
    let ClientReply::ClusterStatus(status) = reply else {
        panic!("{reply:?}");
    };
    status
        .pools
        .iter()
        .map(|pool| pool.usage.reserved_bytes)
        .sum()
}

/// Stores more than one client batch of objects with `store_many`, stores a few again
/// (already present) and loads every one back, `load_batch` objects a call.
fn store_and_load_every_item(cluster: &LocalCluster, load_batch: usize) {
    runtime().block_on(async {
        let (client, namespace) = connect(cluster, 0).await;
        let count = STORE_BATCH_ITEMS_MAX as u32 + 6;
        let objects: Vec<_> = (0..count)
            .map(|index| object(namespace, index, 1, 64 << 10))
            .collect();
        let items: Vec<_> = objects
            .iter()
            .map(|(id, bytes)| (*id, &bytes[..]))
            .collect();
        let outcomes = client.store_many(&items).await;
        assert_eq!(outcomes.len(), items.len());
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, Ok(StoreOutcome::Stored))),
            "{outcomes:?}"
        );
        let again = client.store_many(&items[..3]).await;
        assert!(
            again
                .iter()
                .all(|outcome| matches!(outcome, Ok(StoreOutcome::AlreadyPresent))),
            "{again:?}"
        );
        // At most `load_batch` objects a call.
        for part in objects.chunks(load_batch) {
            let ids: Vec<_> = part.iter().map(|(id, _)| *id).collect();
            let mut buffers = vec![vec![0u8; 64 << 10]; part.len()];
            let mut targets: Vec<&mut [u8]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
            let hits = client.load_into(&ids, &mut targets).await.unwrap();
            assert!(hits.iter().all(|hit| *hit));
            for ((_, bytes), loaded) in part.iter().zip(&buffers) {
                assert_eq!(bytes, loaded);
            }
        }
    });
}

#[test]
fn a_full_pool_skips_the_items_past_it_and_keeps_the_others() {
    let cluster = cluster(16 << 20);
    runtime().block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        let objects: Vec<_> = (0..12)
            .map(|index| object(namespace, index, 2, 2 << 20))
            .collect();
        let items: Vec<_> = objects
            .iter()
            .map(|(id, bytes)| (*id, &bytes[..]))
            .collect();
        let outcomes: Vec<StoreOutcome> = client
            .store_many(&items)
            .await
            .into_iter()
            .map(|outcome| outcome.expect("a full pool is a skip, never an error"))
            .collect();
        let stored = outcomes
            .iter()
            .filter(|outcome| **outcome == StoreOutcome::Stored)
            .count();
        let skipped = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, StoreOutcome::Skipped(_)))
            .count();
        assert!(stored > 0 && skipped > 0, "{outcomes:?}");
        assert_eq!(stored + skipped, items.len(), "{outcomes:?}");
        // In order: every item before the pool filled was stored, every one after skipped.
        assert!(
            outcomes[..stored]
                .iter()
                .all(|outcome| *outcome == StoreOutcome::Stored),
            "{outcomes:?}"
        );
        for ((id, bytes), outcome) in objects.iter().zip(&outcomes) {
            let mut buffer = vec![0u8; bytes.len()];
            let hit = client
                .load_into(&[*id], &mut [&mut buffer[..]])
                .await
                .unwrap()[0];
            assert_eq!(hit, *outcome == StoreOutcome::Stored);
            if hit {
                assert_eq!(&buffer, bytes);
            }
        }
    });
}

#[test]
fn oversized_and_partly_invalid_batches_get_typed_errors() {
    let cluster = cluster(16 << 20);
    runtime().block_on(async {
        let (rpc, namespace) = raw_client(&cluster).await;

        let oversized = (0..=STORE_BATCH_ITEMS_MAX as u32)
            .map(|index| item(index, namespace))
            .collect();
        let reply = rpc
            .call(ClientRequest::BeginStoreMany { items: oversized })
            .await
            .unwrap();
        assert_eq!(
            reply,
            ClientReply::Error(ProtocolError::Client(ClientRefusal::BatchTooLarge {
                items: STORE_BATCH_ITEMS_MAX + 1,
                max: STORE_BATCH_ITEMS_MAX,
            }))
        );
        let reply = rpc
            .call(ClientRequest::CommitStoreMany {
                tickets: vec![1; STORE_BATCH_ITEMS_MAX + 1],
            })
            .await
            .unwrap();
        assert!(
            matches!(
                reply,
                ClientReply::Error(ProtocolError::Client(ClientRefusal::BatchTooLarge { .. }))
            ),
            "{reply:?}"
        );

        // One item of a namespace this connection did not register: refused alone.
        let foreign = NamespaceId([7; 16]);
        let items = vec![item(1, namespace), item(2, foreign)];
        let reply = rpc
            .call(ClientRequest::BeginStoreMany { items })
            .await
            .unwrap();
        let ClientReply::Grants(grants) = reply else {
            panic!("{reply:?}");
        };
        let Ok(StoreGrant::Write { ticket, .. }) = grants[0] else {
            panic!("{grants:?}");
        };
        assert_eq!(
            grants[1],
            Err(ProtocolError::Client(
                ClientRefusal::NamespaceNotRegistered(foreign)
            ))
        );
        // A ticket this client does not hold is refused alone; the granted one commits.
        let reply = rpc
            .call(ClientRequest::CommitStoreMany {
                tickets: vec![ticket, ticket + 1_000],
            })
            .await
            .unwrap();
        let ClientReply::StoredMany(committed) = reply else {
            panic!("{reply:?}");
        };
        assert_eq!(
            committed[0],
            StoreCommitted::Stored(CommitOutcome::Committed)
        );
        assert!(
            matches!(
                committed[1],
                StoreCommitted::Refused(ProtocolError::Sequence(_))
            ),
            "{committed:?}"
        );
    });
}

#[test]
fn blocking_store_many_and_load_into_pipeline_batches_from_a_plain_thread() {
    let cluster = cluster(64 << 20);
    // The blocking forms copy on the calling thread while the runtime's own threads drive
    // the round trips: a multi-thread runtime, called from outside it.
    let runtime = multi_thread_runtime();
    let (client, namespace) = runtime.block_on(connect(&cluster, 0));
    // More count-bounded batches than the window, and objects over the byte bound (alone
    // in their batches) between them.
    let sizes = (0..150u32).map(|index| match index {
        40 | 100 => 9 << 20,
        _ => 64 << 10,
    });
    let objects: Vec<_> = sizes
        .enumerate()
        .map(|(index, bytes)| object(namespace, index as u32, 5, bytes))
        .collect();
    let items = store_all_blocking(&client, runtime.handle(), &objects);
    let again = client.store_many_blocking(runtime.handle(), &items[..3]);
    assert!(
        again
            .iter()
            .all(|outcome| matches!(outcome, Ok(StoreOutcome::AlreadyPresent))),
        "{again:?}"
    );
    let ids: Vec<_> = objects.iter().map(|(id, _)| *id).collect();
    let mut buffers: Vec<Vec<u8>> = objects.iter().map(|(_, b)| vec![0; b.len()]).collect();
    let mut targets: Vec<&mut [u8]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
    let hits = client
        .load_into_blocking(runtime.handle(), &ids, &mut targets)
        .unwrap();
    assert!(hits.iter().all(|hit| *hit), "{hits:?}");
    for ((_, bytes), loaded) in objects.iter().zip(&buffers) {
        assert!(
            bytes == loaded,
            "a loaded object differs from the stored one"
        );
    }
}

/// More small stores within one heartbeat period than the directory's ledger holds for a
/// session (65,536 operations: 40,000 stores are 80,000, a reserve and a commit each): the
/// node acknowledges on volume, not only with its heartbeat, so every store succeeds.
#[test]
fn more_stores_in_a_heartbeat_period_than_the_ledger_holds_all_succeed() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 192 << 20,
        page_bytes: 4096,
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        // A heartbeat every 40 s: none within the test.
        suspect_after_ms: 120_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    runtime().block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        for first in (0..40_000u32).step_by(1_000) {
            let objects: Vec<_> = (first..first + 1_000)
                .map(|index| object(namespace, index, 6, 4096))
                .collect();
            let items: Vec<_> = objects
                .iter()
                .map(|(id, bytes)| (*id, &bytes[..]))
                .collect();
            for outcome in client.store_many(&items).await {
                assert!(
                    matches!(outcome, Ok(StoreOutcome::Stored)),
                    "after {first} stores: {outcome:?}"
                );
            }
        }
    });
}

/// Stores `objects` in one `store_many` call; the outcomes.
async fn store_batch(client: &Client, objects: &[(ObjectId, Vec<u8>)]) -> Vec<StoreOutcome> {
    let items: Vec<_> = objects
        .iter()
        .map(|(id, bytes)| (*id, &bytes[..]))
        .collect();
    let outcomes = client.store_many(&items).await;
    outcomes.into_iter().map(Result::unwrap).collect()
}

/// The node's early grants so far whose reserve ended with `outcome`.
fn early_grants(node: std::net::SocketAddr, outcome: &str) -> f64 {
    let series = format!("kvtier_node_early_grants_total{{outcome=\"{outcome}\"}}");
    common::scraped(node, &series)
}

/// The bytes the node's allocators hold, over its pools.
fn allocated_bytes(node: std::net::SocketAddr) -> f64 {
    let body = kvtier_tools::launch::scrape_metrics(node).unwrap();
    body.lines()
        .filter(|line| line.starts_with("kvtier_pool_bytes{") && line.contains("allocated"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_session_placed_in_one_pool_is_granted_before_its_reserve_and_ends_as_the_directory_says() {
    let cluster = cluster(64 << 20);
    let node = common::metrics_of(&cluster, "node-a");
    runtime().block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        // 8 × 256 KiB: a batch large enough to be granted before its reserve.
        let batch = |first: u32, tag: u32| -> Vec<(ObjectId, Vec<u8>)> {
            (first..first + 8)
                .map(|index| object(namespace, index, tag, 256 << 10))
                .collect()
        };
        let stored = vec![StoreOutcome::Stored; 8];
        // The first batch asks first and places the session; the second is granted at once.
        let first = batch(0, 30);
        assert_eq!(store_batch(&client, &first).await, stored);
        assert_eq!(early_grants(node, "reserved"), 0.0);
        let second = batch(8, 30);
        assert_eq!(store_batch(&client, &second).await, stored);
        assert_eq!(early_grants(node, "reserved"), 8.0);
        // The same objects with other bytes, granted at once: the directory has them, so
        // each ends as already present at its commit and its copy's pages are freed.
        let mut again = batch(0, 30);
        for (_, bytes) in &mut again {
            bytes.iter_mut().for_each(|byte| *byte = !*byte);
        }
        let present = vec![StoreOutcome::AlreadyPresent; 8];
        assert_eq!(store_batch(&client, &again).await, present);
        assert_eq!(early_grants(node, "ended"), 8.0);
        let held = 16.0 * f64::from(256u32 << 10);
        let deadline = Instant::now() + Duration::from_secs(10);
        while allocated_bytes(node) != held {
            assert!(Instant::now() < deadline, "{} bytes", allocated_bytes(node));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A batch not placed whole asks first again: the next batch relearns the pool.
        let third = batch(16, 30);
        assert_eq!(store_batch(&client, &third).await, stored);
        assert_eq!(early_grants(node, "reserved"), 8.0);
        let fourth = batch(24, 30);
        assert_eq!(store_batch(&client, &fourth).await, stored);
        assert_eq!(early_grants(node, "reserved"), 16.0);
        let every: Vec<_> = [first, second, third, fourth].concat();
        assert_eq!(common::verified_hits(&client, &every).await, every.len());
        // A small batch asks first, placed or not.
        let small: Vec<_> = (32..40)
            .map(|index| object(namespace, index, 30, 4 << 10))
            .collect();
        assert_eq!(store_batch(&client, &small).await, stored);
        assert_eq!(early_grants(node, "reserved"), 16.0);
    });
}

/// A node answers hits on what its clients stored in its CPU pool from the commit on, with
/// no request to the directory. Retired while an engine reads it, the object's pages stay
/// until that reader is gone: the reclaim waits for the node's local lease.
#[test]
fn a_stored_object_is_a_local_hit_from_its_commit_and_outlives_its_retire_while_read() {
    let cluster = cluster(64 << 20);
    let node = common::metrics_of(&cluster, "node-a");
    runtime().block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        let objects: Vec<_> = (0..4)
            .map(|index| object(namespace, index, 40, 256 << 10))
            .collect();
        assert_eq!(
            store_batch(&client, &objects).await,
            vec![StoreOutcome::Stored; 4]
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let metric = |name: &str| common::scraped(node, name);
        let lookups = metric("kvtier_directory_lookups_total");
        let views = client
            .load(&[objects[0].0], AcquireMode::Each)
            .await
            .unwrap();
        let view = views
            .into_iter()
            .next()
            .flatten()
            .expect("a stored object hits");
        assert!(
            kvtier_core::node::delegations::is_local(view.lease().lease),
            "the first load of a stored object is answered by its node"
        );
        assert_eq!(metric("kvtier_directory_lookups_total"), lookups);
        // Retired while the view reads it: the node puts the reclaim off.
        client
            .retire(objects[0].0, view.lease().replica)
            .await
            .unwrap();
        while metric("kvtier_reclaims_deferred_total") < 1.0 {
            assert!(
                Instant::now() < deadline,
                "the reclaim never reached the node"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The node publishes its pools' usage at each task round: wait for the round
        // after the deferral (were the pages freed, it would never show all four).
        let four = 4.0 * f64::from(256u32 << 10);
        while allocated_bytes(node) != four {
            assert!(
                Instant::now() < deadline,
                "its pages are not held while read: {} bytes allocated",
                allocated_bytes(node)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(view.bytes().unwrap(), &objects[0].1[..]);
        assert_eq!(
            common::verified_hits(&client, &objects[..1]).await,
            0,
            "retired"
        );
        // The reader gone, the pages go.
        drop(view);
        let three = 3.0 * f64::from(256u32 << 10);
        while allocated_bytes(node) != three {
            assert!(Instant::now() < deadline, "{} bytes", allocated_bytes(node));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(common::verified_hits(&client, &objects[1..]).await, 3);
    });
}
