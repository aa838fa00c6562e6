//! Tenants in the simulation: two, each with an engine on every node. Tenant `a` is
//! unsalted; tenant `b` has a salt, so its namespace is another and its objects live in a
//! CPU partition of their own on every node (`PoolTenancy::Partition` of its salt group).
//! Each engine is admitted by the node core's real tenant rules (`node::tenants::Tenants`,
//! by its uid) and registers its model through them (its tenant's salt mixed in, the
//! tenant's namespace bound counted); now and then an engine names the other tenant's
//! objects, which its connection's books must refuse.
//!
//! What it checks: an object is written into a CPU partition only if it is of that
//! partition's salt group; an engine holds leases only on its own tenant's partition (or
//! a shared pool its node maps); an engine is never admitted to store or acquire objects
//! of a namespace it did not register.

use super::world::{Space, World, CPU_POOL_OBJECTS, OBJECT_BYTES};
use kvtier_core::model::{
    KvDtype, Medium, NamespaceDescriptor, NodeId, ObjectId, PoolSpec, PoolTenancy, SaltGroup, Scope,
};
use kvtier_core::node::tenants::{ModelAccess, PeerIdentity, Tenant, Tenants};
use kvtier_core::node::ClientId;

/// The tenants, by index: their names, uids and salts.
pub const TENANTS: [(&str, u32, Option<&str>); 2] =
    [("a", 1000, None), ("b", 2000, Some("tenant-b-salt"))];
/// The model every engine serves.
const MODEL: &str = "sim";
/// Percent of an engine's requests that name the other tenant's objects.
const TRESPASS_PERCENT: u64 = 3;

/// The rules every simulated node runs with.
pub fn tenant_rules() -> Tenants {
    let rules = TENANTS
        .iter()
        .map(|(name, uid, salt)| Tenant {
            name: (*name).to_string(),
            uids: vec![*uid],
            gids: Vec::new(),
            models: ModelAccess::Models(vec![MODEL.to_string()]),
            salt: salt.map(str::to_string),
        })
        .collect();
    Tenants::new(0, rules).expect("the simulation's tenant rules are valid")
}

/// The namespace an engine asks for, before its tenant's salt is mixed in.
pub fn unsalted_descriptor() -> NamespaceDescriptor {
    NamespaceDescriptor {
        model: MODEL.into(),
        revision: "1".into(),
        adapter: None,
        kv_dtype: KvDtype::Float16,
        quantization: None,
        layers: 1,
        kv_heads: 1,
        head_dim: 64,
        block_tokens: 16,
        format_version: 1,
        chunk_tokens: 16,
        tensor_parallel: 1,
        pipeline_parallel: 1,
        salt: None,
    }
}

/// Tenant `tenant`'s namespace, salted as its rule says.
pub fn descriptor_of(tenant: usize) -> NamespaceDescriptor {
    NamespaceDescriptor {
        salt: TENANTS[tenant].2.map(str::to_string),
        ..unsalted_descriptor()
    }
}

/// The salt group of tenant `tenant`'s objects.
pub fn group_of(tenant: usize) -> SaltGroup {
    SaltGroup::of(TENANTS[tenant].2)
}

/// The CPU partition of tenant `tenant` that node `node` registers (and the directory
/// declares, under any node id). Tenant `a`'s keeps the name a node without tenant rules
/// gives its one pool.
pub fn cpu_pool_spec(node: usize, host: NodeId, tenant: usize) -> PoolSpec {
    let name = match tenant {
        0 => format!("cpu{node}"),
        _ => format!("cpu{node}-{}", TENANTS[tenant].0),
    };
    PoolSpec {
        name,
        medium: Medium::Cpu,
        scope: Scope::Host(host),
        capacity_bytes: CPU_POOL_OBJECTS * OBJECT_BYTES,
        page_bytes: 4096,
        extent_bytes: None,
        tenancy: PoolTenancy::Partition(group_of(tenant)),
    }
}

impl World {
    /// The engines of node `node` connect: each admitted as its tenant by the node's rules,
    /// registering its model's namespace through them.
    pub(super) fn connect_engines(&mut self, node: usize) {
        for tenant in 0..TENANTS.len() {
            if self.nodes[node].clients[tenant].is_none() {
                self.nodes[node].clients[tenant] = self.connect_engine(node, tenant);
            }
        }
    }

    fn connect_engine(&mut self, node: usize, tenant: usize) -> Option<ClientId> {
        let seed = self.stats.seed;
        let (name, uid, _) = TENANTS[tenant];
        let peer = PeerIdentity {
            uid,
            gid: uid,
            groups: Vec::new(),
            pid: None,
        };
        let admitted = self.tenants.admit(&peer).ok()?;
        assert_eq!(
            admitted.name, name,
            "seed={seed}: uid {uid} admitted as another tenant"
        );
        let asked = unsalted_descriptor();
        if !admitted.permits(&asked) {
            return None;
        }
        let salted = admitted.salted(asked);
        let id = salted.id().ok()?;
        assert_eq!(
            id, self.namespaces[tenant],
            "seed={seed}: tenant {name}'s engine registered another namespace"
        );
        let state = &mut self.nodes[node];
        let client = state.core.connect_client(uid).ok()?;
        state.core.tenant_namespaces.admits(&admitted, id).ok()?;
        let books = state.core.client(client)?;
        books.admit_namespace().ok()?;
        books.namespace_registered(Some(id));
        state.core.tenant_namespaces.record(&admitted, id);
        Some(client)
    }

    /// The tenant whose engine acts next, and the tenant whose objects it names (now and
    /// then the other's).
    pub(super) fn pick_tenants(&mut self) -> (usize, usize) {
        let tenant = self.rng.below(TENANTS.len() as u64) as usize;
        let named = if self.rng.chance(TRESPASS_PERCENT) {
            (tenant + 1) % TENANTS.len()
        } else {
            tenant
        };
        (tenant, named)
    }

    /// An engine of `tenant` was admitted to store or acquire `objects`: all must be of its
    /// own tenant's namespace.
    pub(super) fn check_admitted(&mut self, tenant: usize, objects: &[ObjectId]) {
        let own = self.namespaces[tenant];
        assert!(
            objects.iter().all(|object| object.namespace == own),
            "seed={}: an engine of tenant {} was admitted to another tenant's objects",
            self.stats.seed,
            TENANTS[tenant].0
        );
    }

    /// Counts an engine's request for the other tenant's objects its books refused.
    pub(super) fn trespass_refused(&mut self, tenant: usize, objects: &[ObjectId]) {
        let own = self.namespaces[tenant];
        if objects.iter().any(|object| object.namespace != own) {
            self.stats.covered.trespasses_refused += 1;
        }
    }

    /// Writing `object` into `space`: a CPU partition takes only its own salt group's
    /// objects.
    pub(super) fn check_partition(&self, space: Space, object: &ObjectId) {
        if let Space::Cpu { partition, .. } = space {
            assert_eq!(
                object.namespace, self.namespaces[partition],
                "seed={}: an object of another tenant was written into tenant {}'s partition",
                self.stats.seed, TENANTS[partition].0
            );
        }
    }
}
