//! Pool descriptions: what medium a pool is, which tier it serves and who can map it.

use super::ids::{DomainId, NodeId};
use serde::{Deserialize, Serialize};

/// The physical medium behind a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    /// Host DRAM in a shared mapping.
    Cpu,
    /// CXL-attached memory (a DAX device or, emulated, a shared file).
    Cxl,
    /// An SSD store (staged: bytes are read into memory before use).
    Ssd,
}

impl Medium {
    /// Every medium, for pre-declaring metric label values.
    pub const ALL: [Medium; 3] = [Medium::Cpu, Medium::Cxl, Medium::Ssd];

    /// The lower-case name used in configuration and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Medium::Cpu => "cpu",
            Medium::Cxl => "cxl",
            Medium::Ssd => "ssd",
        }
    }

    /// The tier this medium serves: byte-addressable media are L1, staged media L2.
    pub fn tier(self) -> Tier {
        match self {
            Medium::Cpu | Medium::Cxl => Tier::L1,
            Medium::Ssd => Tier::L2,
        }
    }
}

/// L1 is read in place; L2 is staged into L1 or the GPU before use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Tier {
    L1,
    L2,
}

/// Who can map a pool's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Only the owning node and its local clients (a CPU pool, a local SSD).
    Host(NodeId),
    /// Every node of a sharing domain (a CXL pool).
    Domain(DomainId),
}

/// The objects of the namespaces registered with one salt (or with none): the tenants
/// sharing a salt share objects, so they may share memory; tenants of different salts
/// never do. Derived from the salt by a keyed hash, so a pool's description names no salt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SaltGroup(#[serde(with = "super::digest_bytes")] pub [u8; 16]);

impl SaltGroup {
    /// The group of the namespaces registered with `salt` (`None`: unsalted).
    pub fn of(salt: Option<&str>) -> SaltGroup {
        let mut hasher = blake3::Hasher::new_derive_key("kvtier salt group v1");
        match salt {
            None => hasher.update(&[0]),
            Some(salt) => hasher.update(&[1]).update(salt.as_bytes()),
        };
        let mut group = [0u8; 16];
        group.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        SaltGroup(group)
    }
}

/// Whose objects a pool may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PoolTenancy {
    /// Any namespace's: a CXL pool (its sharing domain is one trust domain, of the
    /// tenants the pool lists) or an SSD store (private to its node).
    Shared,
    /// Only the objects of one salt group: a partition of a node's CPU memory, which only
    /// the processes of that group's tenants are handed.
    Partition(SaltGroup),
}

impl PoolTenancy {
    /// Whether an object of `group` may be placed in this pool.
    pub fn admits(self, group: SaltGroup) -> bool {
        match self {
            PoolTenancy::Shared => true,
            PoolTenancy::Partition(own) => own == group,
        }
    }
}

/// A pool as registered with the directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// Operator-facing name, unique per scope; used as a metrics label.
    pub name: String,
    pub medium: Medium,
    pub scope: Scope,
    pub capacity_bytes: u64,
    /// Allocation granularity; every replica occupies a whole number of pages.
    pub page_bytes: u64,
    /// For a shared pool, the size of the extents the directory grants to nodes (a
    /// multiple of `page_bytes`); `None` for a host pool.
    pub extent_bytes: Option<u64>,
    /// Whose objects it may hold: the directory places nothing else there.
    pub tenancy: PoolTenancy,
}

impl PoolSpec {
    /// The bytes a replica of `length_bytes` occupies in this pool.
    pub fn rounded_bytes(&self, length_bytes: u64) -> u64 {
        length_bytes
            .div_ceil(self.page_bytes)
            .saturating_mul(self.page_bytes)
    }
}

/// A pool's bytes by state. `ready` and `retiring` are parts of `allocated`, never added
/// to it again; `pinned` (leased) and `quarantined` (owner unreachable) are parts of `ready`
/// plus `retiring`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolUsage {
    pub capacity_bytes: u64,
    /// Granted to writers, not yet committed.
    pub reserved_bytes: u64,
    /// Holding committed bytes (READY or RETIRING).
    pub allocated_bytes: u64,
    pub ready_bytes: u64,
    pub retiring_bytes: u64,
    /// Held by replicas whose owner is suspect or fenced: hidden, not yet reclaimable.
    pub quarantined_bytes: u64,
    /// Held by replicas with at least one live lease.
    pub pinned_bytes: u64,
}

impl PoolUsage {
    /// Adds `other`'s bytes to these, state by state (saturating): the usage of several
    /// pools together.
    pub fn add(&mut self, other: &PoolUsage) {
        self.capacity_bytes = self.capacity_bytes.saturating_add(other.capacity_bytes);
        self.reserved_bytes = self.reserved_bytes.saturating_add(other.reserved_bytes);
        self.allocated_bytes = self.allocated_bytes.saturating_add(other.allocated_bytes);
        self.ready_bytes = self.ready_bytes.saturating_add(other.ready_bytes);
        self.retiring_bytes = self.retiring_bytes.saturating_add(other.retiring_bytes);
        self.quarantined_bytes = self
            .quarantined_bytes
            .saturating_add(other.quarantined_bytes);
        self.pinned_bytes = self.pinned_bytes.saturating_add(other.pinned_bytes);
    }

    /// Bytes neither reserved nor allocated.
    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes
            .saturating_sub(self.reserved_bytes)
            .saturating_sub(self.allocated_bytes)
    }
}
