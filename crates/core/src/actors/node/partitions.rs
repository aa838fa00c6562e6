//! The node's memory as its clients see it: the CPU partitions it creates (one sealed
//! memory file per salt group of its tenants, see [`crate::config::CpuPartition`]), and the
//! files each admitted client is handed: its tenant's partition and the CXL pools the node
//! maps, never another tenant's partition. A pool whose medium is not in the node's write
//! order is handed through a read-only descriptor, which the client can only map read-only
//! and cannot truncate.

use super::process::fresh_uuid;
use crate::backends::{CpuPoolConfig, MemoryPool, SharedMemory};
use crate::config::{ClusterConfig, CpuPartition, NodeSection};
use crate::model::{Medium, PoolId, SaltGroup};
use crate::progress::{Progress, Unit};
use crate::protocol::messages::PoolMapping;
use anyhow::Context as _;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

/// Live allocations per CPU partition (one per stored chunk): 4M at 64 KiB pages is
/// 256 GiB.
pub const ALLOCATIONS_MAX: u32 = 1 << 22;

/// Creates the node's CPU partitions: each a sealed anonymous memory file (no path: the
/// node hands it only to the clients of its tenants) with a fresh UUID, pre-faulted with
/// progress in the log.
pub fn create_cpu_partitions(
    config: &ClusterConfig,
    section: &NodeSection,
) -> anyhow::Result<Vec<(CpuPartition, MemoryPool)>> {
    let started = Instant::now();
    let partitions = config.cpu_partitions(section)?;
    let total: u64 = partitions
        .iter()
        .map(|partition| partition.capacity_bytes)
        .sum();
    let prefault = Progress::logged("pre-faulting the CPU pool", total, Unit::Bytes);
    let mut created = Vec::with_capacity(partitions.len());
    let mut done_before = 0;
    for partition in partitions {
        // `kvtier-cpu-<node>`, then `-<first tenant>` when the node has several partitions.
        let tenant = partition
            .name
            .strip_prefix(&format!("{}-cpu", section.name))
            .unwrap_or_default();
        let pool_config = CpuPoolConfig {
            name: format!("kvtier-cpu-{}{tenant}", section.name),
            capacity_bytes: partition.capacity_bytes,
            page_bytes: section.cpu_pool.page_bytes,
            allocations_max: ALLOCATIONS_MAX,
            pool_uuid: fresh_uuid(),
        };
        let pool = MemoryPool::create_cpu_reporting(&pool_config, &mut |done_bytes| {
            prefault.set(done_before + done_bytes)
        })
        .with_context(|| format!("creating the CPU partition `{}`", partition.name))?;
        done_before += partition.capacity_bytes;
        created.push((partition, pool));
    }
    prefault.finish();
    tracing::info!(bytes = total, partitions = created.len(), elapsed = ?started.elapsed(), "CPU pool pre-faulted");
    Ok(created)
}

/// A pool the node hands to clients: its id, medium and mapping.
pub struct HandedPool<'a> {
    pub pool: PoolId,
    pub medium: Medium,
    pub memory: &'a SharedMemory,
}

/// What one connection is handed: the files, in the order the mappings number them.
pub struct Handoff {
    pub files: Vec<OwnedFd>,
    pub mappings: Vec<PoolMapping>,
}

/// The handoff of each salt group the node has a CPU partition for.
pub struct Handoffs {
    by_group: HashMap<SaltGroup, Handoff>,
}

impl Handoffs {
    /// One handoff per partition in `partitions` (its group and pool): that partition and
    /// every pool of `shared`, each writable only when its medium is in `write_order`.
    pub fn new(
        partitions: &[(SaltGroup, HandedPool<'_>)],
        shared: &[HandedPool<'_>],
        write_order: &[Medium],
    ) -> anyhow::Result<Handoffs> {
        let mut by_group = HashMap::new();
        for (group, partition) in partitions {
            let mut handoff = Handoff {
                files: Vec::new(),
                mappings: Vec::new(),
            };
            for pool in std::iter::once(partition).chain(shared) {
                let writable = write_order.contains(&pool.medium);
                let file = handed_file(pool, writable)?;
                handoff.mappings.push(PoolMapping {
                    pool: pool.pool,
                    medium: pool.medium,
                    handed: u32::try_from(handoff.files.len())
                        .context("too many pools to hand over")?,
                    writable,
                    pool_uuid: pool.memory.pool_uuid(),
                    data_bytes: pool.memory.data_bytes(),
                });
                handoff.files.push(file);
            }
            by_group.insert(*group, handoff);
        }
        Ok(Handoffs { by_group })
    }

    /// The handoff of the clients of `group`'s tenants; `None` when the node has no
    /// partition for it (a tenant a reload added: it gets one when the node restarts).
    pub fn of(&self, group: SaltGroup) -> Option<&Handoff> {
        self.by_group.get(&group)
    }
}

/// The file a client is handed for `pool`: a duplicate of the node's descriptor, or, where
/// the client may not write, a new read-only descriptor of the same file (opened again
/// through `/proc/self/fd`, which a memory file without a path allows).
fn handed_file(pool: &HandedPool<'_>, writable: bool) -> anyhow::Result<OwnedFd> {
    let handle = pool
        .memory
        .handle()
        .with_context(|| format!("pool {} has no file to hand to clients", pool.pool))?;
    if writable {
        return handle
            .try_clone_to_owned()
            .with_context(|| format!("duplicating pool {}'s file", pool.pool));
    }
    let path = format!("/proc/self/fd/{}", handle.as_fd().as_raw_fd());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .open(&path)
        .with_context(|| format!("opening pool {}'s file read-only through {path}", pool.pool))?;
    Ok(file.into())
}
