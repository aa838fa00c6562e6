//! `kvtier bench data`'s full-cache row: small objects stored into a cache that stays full,
//! so every store evicts (the steady state of a production cache), against the same stores
//! into the same cache while it is empty, measured in the same run. Prints both rates,
//! their ratio, and the directory process's CPU time per stored object in each phase (what
//! bounds how many stores one directory serves).

use crate::launch::{ClusterSpec, LocalCluster};
use crate::workload::prefix::seeded_ids;
use anyhow::{bail, Context as _};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::model::{demo_namespace, ObjectId};
use serde::Serialize;
use std::time::Instant;

/// Bytes of each object: one page of the pool.
const OBJECT_BYTES: u64 = 4 << 10;
/// The node's CPU pool: 65,536 objects.
const POOL_BYTES: u64 = 256 << 20;
/// Objects per `store_many`, as an engine stores a prefix.
const BATCH: usize = 32;
/// Objects the empty phase stores: 40 % of the pool, below the eviction watermarks.
const EMPTY_OBJECTS: u64 = POOL_BYTES / OBJECT_BYTES * 2 / 5;

/// The full-cache row.
#[derive(Clone, Debug, Serialize)]
pub struct FullCacheReport {
    pub object_bytes: u64,
    pub pool_bytes: u64,
    /// Objects stored per second while the pool is below its watermarks.
    pub empty_stored_per_s: f64,
    /// Objects stored per second while every store evicts.
    pub full_stored_per_s: f64,
    /// `full_stored_per_s` over `empty_stored_per_s`.
    pub ratio: f64,
    /// Of the stores in the full phase, the share skipped (no room at once).
    pub full_skipped_share: f64,
    /// The directory process's CPU microseconds per stored object, in each phase.
    pub empty_directory_cpu_us_per_object: f64,
    pub full_directory_cpu_us_per_object: f64,
}

/// Starts a one-node cluster with a pool of 4 KiB pages, stores 40 % of it (the empty
/// phase), fills it past its watermarks (untimed), then stores `objects` more (the full
/// phase), one `store_many` of 32 at a time.
pub fn measure(exe: &std::path::Path, objects: u64) -> anyhow::Result<FullCacheReport> {
    let cluster = LocalCluster::start(
        exe,
        &ClusterSpec {
            nodes: 1,
            cpu_pool_bytes: POOL_BYTES,
            page_bytes: OBJECT_BYTES,
            metrics: false,
            ..ClusterSpec::default()
        },
    )?;
    let directory = cluster
        .directory_pid()
        .context("the cluster has no directory process")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = runtime.block_on(Client::connect(&cluster.socket(0)?))?;
    let namespace = runtime.block_on(client.register_namespace(demo_namespace()))?;
    let pool_objects = POOL_BYTES / OBJECT_BYTES;
    let mut ids = seeded_ids(
        &demo_namespace(),
        EMPTY_OBJECTS + pool_objects + objects,
        0x0f11_cac4e,
    )?;
    for id in &mut ids {
        id.namespace = namespace;
    }
    let source = vec![0x5a_u8; OBJECT_BYTES as usize * BATCH];
    let (empty, rest) = ids.split_at(EMPTY_OBJECTS as usize);
    let (fill, full) = rest.split_at(pool_objects as usize);
    let empty = runtime.block_on(phase(&client, empty, &source, directory))?;
    if empty.skipped > 0 {
        bail!("{} stores skipped in an empty pool", empty.skipped);
    }
    runtime.block_on(phase(&client, fill, &source, directory))?;
    let full = runtime.block_on(phase(&client, full, &source, directory))?;
    drop(client);
    drop(cluster);
    let empty_rate = empty.stored as f64 / empty.seconds;
    let full_rate = full.stored as f64 / full.seconds;
    Ok(FullCacheReport {
        object_bytes: OBJECT_BYTES,
        pool_bytes: POOL_BYTES,
        empty_stored_per_s: empty_rate,
        full_stored_per_s: full_rate,
        ratio: full_rate / empty_rate,
        full_skipped_share: full.skipped as f64 / (full.stored + full.skipped).max(1) as f64,
        empty_directory_cpu_us_per_object: empty.directory_cpu_s / empty.stored.max(1) as f64 * 1e6,
        full_directory_cpu_us_per_object: full.directory_cpu_s / full.stored.max(1) as f64 * 1e6,
    })
}

/// What one phase stored, in how long, and the directory's CPU time meanwhile.
struct Phase {
    stored: u64,
    skipped: u64,
    seconds: f64,
    directory_cpu_s: f64,
}

async fn phase(
    client: &Client,
    ids: &[ObjectId],
    source: &[u8],
    directory: u32,
) -> anyhow::Result<Phase> {
    let (mut stored, mut skipped) = (0, 0);
    let cpu_before = cpu_seconds(directory)?;
    let started = Instant::now();
    for batch in ids.chunks(BATCH) {
        let items: Vec<(ObjectId, &[u8])> = batch
            .iter()
            .copied()
            .zip(source.chunks(OBJECT_BYTES as usize))
            .collect();
        for outcome in client.store_many(&items).await {
            match outcome? {
                StoreOutcome::Stored => stored += 1,
                StoreOutcome::Skipped(_) => skipped += 1,
                other => bail!("a fresh object's store answered {other:?}"),
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Phase {
        stored,
        skipped,
        seconds,
        directory_cpu_s: cpu_seconds(directory)? - cpu_before,
    })
}

/// The CPU time (user and system) process `pid` has used, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .and_then(|field| field.parse().ok())
            .with_context(|| format!("{path}: no CPU time field {index}"))
    };
    // utime and stime: fields 14 and 15 of the line, indices 11 and 12 after the name.
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if per_second <= 0 {
        bail!("the clock tick rate is unknown");
    }
    Ok(total as f64 / per_second as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's CPU time reads, and grows with work done.
    #[test]
    fn a_processs_cpu_time_is_read_from_proc() {
        let before = cpu_seconds(std::process::id()).unwrap();
        let started = Instant::now();
        let mut spin = 0u64;
        while started.elapsed().as_millis() < 50 {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let after = cpu_seconds(std::process::id()).unwrap();
        assert!(
            after > before,
            "{before} s then {after} s after 50 ms of work"
        );
        assert!(cpu_seconds(u32::MAX).is_err());
    }
}
