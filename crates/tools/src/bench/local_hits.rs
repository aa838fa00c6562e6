//! The local-hit row of `kvtier bench directory`: an engine's probes and acquires of objects
//! its node holds delegations on ([`kvtier_core::node::delegations`]), answered by the node with
//! no request to the directory. Measured through a real client on the node's Unix socket,
//! beside the QUIC floor of the same run; the node's index alone is measured in process.

use crate::launch::LocalCluster;
use crate::workload::histogram::Histogram;
use crate::workload::prefix::seeded_ids;
use anyhow::{bail, Context};
use futures_util::stream::{self, StreamExt};
use kvtier_core::client::spin::block_on;
use kvtier_core::client::Client;
use kvtier_core::directory::{AcquireMode, Delegation, Lease};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{AllocationId, Generation, LeaseId, Location, Medium, ObjectId, PoolId};
use kvtier_core::model::{ReplicaId, Timestamp};
use kvtier_core::node::Delegations;
use kvtier_core::rng::SplitMix64;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Objects stored (4 KiB each) and delegated before the measured phase.
const OBJECTS: u64 = 1024;
const OBJECT_BYTES: usize = 4096;
/// Keys per batch of the throughput phase.
const BATCH: usize = 64;

/// The local-hit figures.
#[derive(Clone, Debug, Serialize)]
pub struct LocalHitReport {
    /// One single-key probe, then one single-key acquire (its view dropped: the release
    /// goes in the background), of a delegated hit: the pair's p50 and p99.
    pub probe_acquire_p50_us: f64,
    pub probe_acquire_p99_us: f64,
    /// The same pair from an engine's own thread (`kvtier::block_on`: the thread spins
    /// briefly for each reply instead of sleeping), as the Python package calls.
    pub probe_acquire_blocking_p50_us: f64,
    pub probe_acquire_blocking_p99_us: f64,
    /// A single-key acquire alone.
    pub acquire_p50_us: f64,
    /// Batch-64 probes over the socket, `concurrency` in flight.
    pub socket_batch64_keys_per_s: f64,
    /// Batch-64 lookups in the node's delegated index itself (in process, one thread).
    pub index_batch64_keys_per_s: f64,
    /// The same batches in a `dashmap::DashMap` of the same keys (object → delegation id),
    /// the concurrent map the index could have been: an answer per key, as a probe builds.
    pub dashmap_batch64_keys_per_s: f64,
    /// Of the measured acquires, how many were answered under a delegation (local leases).
    pub local_fraction: f64,
}

/// Stores and delegates [`OBJECTS`] objects on node 0 of `cluster`, then measures.
pub async fn measure(
    cluster: &LocalCluster,
    round_trips: u32,
    concurrency: usize,
    seed: u64,
) -> anyhow::Result<LocalHitReport> {
    let client = Client::connect(&cluster.socket(0)?).await?;
    let namespace = client.register_namespace(demo_namespace()).await?;
    let ids: Vec<ObjectId> = seeded_ids(&demo_namespace(), OBJECTS, seed)?
        .into_iter()
        .map(|id| ObjectId { namespace, ..id })
        .collect();
    let bytes = vec![7u8; OBJECT_BYTES];
    for id in &ids {
        client.store(*id, &bytes).await?;
        // The first acquire asks the directory and brings the delegation.
        drop(client.load(&[*id], AcquireMode::Each).await?);
    }
    let mut rng = SplitMix64::new(seed ^ 0x10ca1);
    let (mut pair, mut acquire) = (Histogram::default(), Histogram::default());
    let mut local = 0u64;
    for _ in 0..round_trips {
        let id = ids[rng.below(OBJECTS) as usize];
        let started = Instant::now();
        client.probe(&[id]).await?;
        let views = client.load(&[id], AcquireMode::Each).await?;
        pair.record(started.elapsed());
        let Some(view) = views.into_iter().next().flatten() else {
            bail!("a stored object missed");
        };
        local += u64::from(view.lease().lease.0 >> 63 == 1);
        drop(view);
        let started = Instant::now();
        drop(client.load(&[id], AcquireMode::Each).await?);
        acquire.record(started.elapsed());
    }
    let blocking = blocking_pairs(&client, &ids, round_trips, seed).await?;
    let requests = 2000u64;
    let probes: Vec<Vec<ObjectId>> = (0..requests)
        .map(|_| {
            (0..BATCH)
                .map(|_| ids[rng.below(OBJECTS) as usize])
                .collect()
        })
        .collect();
    let started = Instant::now();
    let replies: Vec<anyhow::Result<()>> = stream::iter(probes)
        .map(|objects| {
            let client = &client;
            async move {
                client.probe(&objects).await?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    replies.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let socket_keys_per_s = (requests * BATCH as u64) as f64 / started.elapsed().as_secs_f64();
    Ok(LocalHitReport {
        probe_acquire_p50_us: micros(pair.quantile(0.5)),
        probe_acquire_p99_us: micros(pair.quantile(0.99)),
        probe_acquire_blocking_p50_us: micros(blocking.quantile(0.5)),
        probe_acquire_blocking_p99_us: micros(blocking.quantile(0.99)),
        acquire_p50_us: micros(acquire.quantile(0.5)),
        socket_batch64_keys_per_s: socket_keys_per_s,
        index_batch64_keys_per_s: index_keys_per_s(&ids, seed).context("the index alone")?,
        dashmap_batch64_keys_per_s: dashmap_keys_per_s(&ids, seed),
        local_fraction: local as f64 / f64::from(round_trips.max(1)),
    })
}

/// `round_trips` probe+acquire pairs of delegated hits from a thread of its own, as an
/// engine's thread calls (`kvtier_core::client::spin::block_on`); their latencies.
async fn blocking_pairs(
    client: &Client,
    ids: &[ObjectId],
    round_trips: u32,
    seed: u64,
) -> anyhow::Result<Histogram> {
    let (client, ids) = (client.clone(), ids.to_vec());
    let runtime = tokio::runtime::Handle::current();
    // A thread of its own, outside the runtime, as an engine's.
    let engine = std::thread::spawn(move || {
        let mut rng = SplitMix64::new(seed ^ 0xb10c);
        let mut pairs = Histogram::default();
        for _ in 0..round_trips {
            let id = ids[rng.below(OBJECTS) as usize];
            let started = Instant::now();
            let views = block_on(&runtime, async {
                client.probe(&[id]).await?;
                client.load(&[id], AcquireMode::Each).await
            })?;
            pairs.record(started.elapsed());
            if views.into_iter().next().flatten().is_none() {
                bail!("a stored object missed");
            }
        }
        Ok(pairs)
    });
    tokio::task::spawn_blocking(move || engine.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?
}

/// Batches of [`BATCH`] keys drawn from `ids`.
fn batches(ids: &[ObjectId], seed: u64) -> Vec<Vec<ObjectId>> {
    let mut rng = SplitMix64::new(seed);
    (0..4096)
        .map(|_| {
            (0..BATCH)
                .map(|_| ids[rng.below(ids.len() as u64) as usize])
                .collect()
        })
        .collect()
}

/// Rounds over the batches in each in-process measurement.
const ROUNDS: usize = 16;

/// Batch-64 lookups in a `DashMap` of `ids` (object → a delegation's id), the batches
/// [`index_keys_per_s`] probes.
fn dashmap_keys_per_s(ids: &[ObjectId], seed: u64) -> f64 {
    let map: dashmap::DashMap<ObjectId, u64> = ids
        .iter()
        .enumerate()
        .map(|(index, id)| (*id, index as u64))
        .collect();
    let batches = batches(ids, seed);
    let started = Instant::now();
    let mut hits = 0usize;
    for _ in 0..ROUNDS {
        for batch in &batches {
            // An answer per key, as the index's probe builds one.
            let found: Option<Vec<u64>> = batch.iter().map(|id| map.get(id).map(|v| *v)).collect();
            hits += found.map_or(0, |found| found.len());
        }
    }
    hits as f64 / started.elapsed().as_secs_f64()
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// Batch-64 probes of the node's delegated index in process, over `ids` all delegated.
fn index_keys_per_s(ids: &[ObjectId], seed: u64) -> anyhow::Result<f64> {
    let mut delegations = Delegations::default();
    let now = Timestamp::ZERO;
    for (index, id) in ids.iter().enumerate() {
        let index = index as u64;
        let lease = Lease {
            lease: LeaseId(index),
            duration_ms: 30_000,
            replica: ReplicaId(index),
            medium: Medium::Cpu,
            location: Location {
                pool: PoolId(0),
                allocation: AllocationId(index),
                generation: Generation(1),
                offset_bytes: index * OBJECT_BYTES as u64,
                length_bytes: OBJECT_BYTES as u64,
            },
            deadline: now + Duration::from_secs(30),
        };
        let delegation = Delegation {
            lease: LeaseId(1 << 20 | index),
            duration_ms: 60_000,
        };
        delegations.granted(now, *id, &lease, delegation);
    }
    let batches = batches(ids, seed);
    let started = Instant::now();
    let mut hits = 0usize;
    for _ in 0..ROUNDS {
        for batch in &batches {
            hits += delegations
                .probe(now, batch)
                .map_or(0, |outcomes| outcomes.len());
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    if hits != ROUNDS * batches.len() * BATCH {
        bail!("the index missed delegated objects");
    }
    Ok(hits as f64 / elapsed)
}
