//! The simulated cluster: one directory core (restarted now and then as a new incarnation
//! over the same shared pools), the nodes, the network, the bytes each pool holds, and the
//! checks run after every step.

use super::election::Election;
use super::network::{Faults, Message, Network, Payload};
use super::node::{HeldLease, SimNode};
use super::SeedReport;
use kvtier_core::directory::{DirectoryConfig, DirectoryError, NamespaceAccess};
use kvtier_core::model::extent_owner::OwnerWordsInMemory;
use kvtier_core::model::{
    DomainId, Medium, NamespaceId, ObjectId, PoolId, PoolSpec, PrefixDigest, Scope, SessionId,
    Timestamp,
};
use kvtier_core::policy::lifecycle::LifecyclePolicy;
use kvtier_core::protocol::directory::{NodeGrant, PeerRole};
use kvtier_core::protocol::messages::{DirectoryReply, ProtocolError};
use kvtier_core::protocol::shards::Shards;
use kvtier_core::rng::SplitMix64;
use std::collections::HashMap;
use std::time::Duration;

/// Nodes of the simulated cluster; node `i` maps the CXL domains `NODE_DOMAINS[i]`.
pub const NODE_DOMAINS: [&[u32]; 3] = [&[0], &[0, 1], &[1]];
/// Distinct objects the clients store and load.
pub const OBJECTS: u32 = 48;
/// Every object's size.
pub const OBJECT_BYTES: u64 = 64 << 10;
/// Each node's CPU pool, in objects.
pub const CPU_POOL_OBJECTS: u64 = 6;
/// Each shared pool, in objects, and its extents, in objects.
pub const CXL_POOL_OBJECTS: u64 = 16;
pub const EXTENT_OBJECTS: u64 = 4;
/// Steps in a thousand at which the directory restarts.
const DIRECTORY_RESTART_PER_MILLE: u64 = 1;
/// Steps in a thousand at which a bit of a node's disk rots.
const DISK_ROT_PER_MILLE: u64 = 1;
/// Steps in a thousand at which a node is cut off from the directory for a while.
const NODE_CUT_OFF_PER_MILLE: u64 = 1;
/// The longest step of virtual time.
pub const STEP_MS_MAX: u64 = 20;
/// Items of one rejoin report, and rejoin items the directory takes per tick: small, so
/// that the few replicas a simulated node holds are paced.
pub const BATCH_ITEMS_MAX: u32 = 4;
pub const ADOPT_ITEMS_PER_TICK: u32 = 6;

/// Where bytes live: a node process's CPU partition of a tenant (a restarted process keeps
/// the pool's id but not its memory), one of the shared pools, or a node's SSD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    Cpu {
        node: usize,
        incarnation: u64,
        partition: usize,
    },
    Cxl(u32),
    /// A node's SSD store: its disk outlives the node's processes. Nothing maps it.
    Ssd {
        node: usize,
    },
}

/// The simulated cluster. See the module documentation.
pub struct World {
    pub rng: SplitMix64,
    pub now: Timestamp,
    /// The directory's shards (one unless `kvtier sim --shards`).
    pub directory: Shards,
    pub(super) config: DirectoryConfig,
    /// How many shards each directory incarnation has.
    pub(super) shards: usize,
    /// Whether the seed's faults (directory restarts, node crashes) happen.
    pub faults: bool,
    /// Rejoin report items the directory took since its last tick.
    pub tick_items: u32,
    pub network: Network,
    pub nodes: Vec<SimNode>,
    /// The directory's id of each shared pool (by domain), in its current incarnation.
    pub cxl_pools: HashMap<PoolId, u32>,
    /// The space behind each pool id.
    pub spaces: HashMap<PoolId, Space>,
    /// The object whose bytes begin at each offset of each space.
    pub memory: HashMap<(Space, u64), ObjectId>,
    /// Each shared pool's extent owner words (by domain), in its shared memory: they
    /// outlive directory incarnations and node processes.
    pub owner_words: HashMap<u32, OwnerWordsInMemory>,
    /// Which directory serves: etcd's lease and the leaders' cores.
    pub election: Election,
    /// Leases still read by engines whose node process died.
    pub orphan_leases: Vec<HeldLease>,
    /// Copies under way on the nodes (`super::copies`).
    pub copies: Vec<super::copies::LocalCopy>,
    /// Each node's disk (by node), which outlives its processes.
    pub disks: Vec<super::ssd::SimDisk>,
    /// Each tenant's namespace (by tenant), and the rules every node admits engines by.
    pub namespaces: Vec<NamespaceId>,
    pub tenants: kvtier_core::node::Tenants,
    pub stats: SeedReport,
}

fn config(seed: u64) -> DirectoryConfig {
    let ttl = |resident_ttl_ms, expiring_grace_ms, spill_on_expiry| LifecyclePolicy {
        resident_ttl_ms,
        expiring_grace_ms,
        spill_on_expiry,
    };
    DirectoryConfig {
        lease_duration: Duration::from_millis(800),
        reservation_duration: Duration::from_millis(800),
        suspect_after: Duration::from_millis(400),
        fence_after: Duration::from_millis(1200),
        ledger_entries_per_session_max: 256,
        batch_items_max: BATCH_ITEMS_MAX,
        adopt_items_per_tick: ADOPT_ITEMS_PER_TICK,
        hash_seed: Some(seed),
        ttl: [
            (Medium::Cpu, ttl(1_500, 500, true)),
            (Medium::Cxl, ttl(3_000, 0, true)),
        ]
        .into(),
        ..DirectoryConfig::default()
    }
}

impl World {
    /// A cluster of `NODE_DOMAINS.len()` nodes, none started, and a fresh directory of
    /// `shards` shards.
    pub fn new(seed: u64, shards: usize) -> World {
        let config = config(seed);
        let mut world = World {
            rng: SplitMix64::new(seed),
            now: Timestamp::ZERO,
            directory: Shards::new(config.clone(), shards),
            config,
            shards,
            faults: true,
            tick_items: 0,
            network: Network::new(Faults {
                drop_percent: 5,
                duplicate_percent: 3,
                delay_ms_max: 60,
            }),
            nodes: NODE_DOMAINS
                .iter()
                .enumerate()
                .map(|(index, domains)| SimNode::new(index, domains))
                .collect(),
            cxl_pools: HashMap::new(),
            spaces: HashMap::new(),
            memory: HashMap::new(),
            owner_words: (0..2u32)
                .map(|domain| (domain, owner_words(domain)))
                .collect(),
            election: Election::new(Timestamp::ZERO),
            orphan_leases: Vec::new(),
            copies: Vec::new(),
            disks: (0..NODE_DOMAINS.len() as u64)
                .map(|node| super::ssd::SimDisk::new(seed ^ (0xd15c << 16) ^ node))
                .collect(),
            namespaces: (0..super::tenants::TENANTS.len())
                .map(|tenant| {
                    super::tenants::descriptor_of(tenant)
                        .id()
                        .expect("the simulation's namespaces are valid")
                })
                .collect(),
            tenants: super::tenants::tenant_rules(),
            stats: SeedReport {
                seed,
                ..SeedReport::default()
            },
        };
        world.register_cxl_pools();
        world.declare_nodes();
        let until = world.now + world.directory.recovery_window();
        world.directory.recover_until(until);
        world
    }

    /// Declares the nodes and their CPU pools in configuration order, as the directory
    /// process does at every start: each node and pool gets the id it had before.
    fn declare_nodes(&mut self) {
        for node in 0..self.nodes.len() {
            let name = self.nodes[node].name.clone();
            let host = kvtier_core::model::NodeId(0);
            let mut pools: Vec<PoolSpec> = (0..super::tenants::TENANTS.len())
                .map(|tenant| super::tenants::cpu_pool_spec(node, host, tenant))
                .collect();
            pools.push(super::ssd::ssd_pool_spec(node, host));
            self.directory
                .declare_node(&name, pools)
                .expect("a configured node declares");
        }
    }

    fn register_cxl_pools(&mut self) {
        for domain in 0..2u32 {
            let spec = PoolSpec {
                name: format!("cxl{domain}"),
                medium: Medium::Cxl,
                scope: Scope::Domain(DomainId(domain)),
                capacity_bytes: CXL_POOL_OBJECTS * OBJECT_BYTES,
                page_bytes: 4096,
                extent_bytes: Some(EXTENT_OBJECTS * OBJECT_BYTES),
                tenancy: kvtier_core::model::PoolTenancy::Shared,
            };
            let pool = self
                .directory
                .register_shared_pool(spec)
                .expect("a valid shared pool registers");
            self.cxl_pools.insert(pool, domain);
            self.spaces.insert(pool, Space::Cxl(domain));
        }
    }

    /// The directory process dies and a new incarnation starts over the same shared pools:
    /// every session is gone, and no extent is granted before the previous incarnation's
    /// leases, grants and fences have run out.
    /// Nodes and pools are declared in the same order, so every id stays (checked here for
    /// the shared pools, and by each node's rejoin for its own).
    pub fn restart_directory(&mut self) {
        self.stats.covered.directory_restarts += 1;
        self.network.break_connections();
        self.election.restarted(self.now);
        self.new_incarnation();
    }

    /// A new directory incarnation serves (after a restart or a failover) over the same
    /// shared pools, holding their extents for its recovery window.
    pub(super) fn new_incarnation(&mut self) {
        self.config.incarnation = self.config.incarnation.wrapping_add(1).max(1);
        self.directory = Shards::new(self.config.clone(), self.shards);
        let before = std::mem::take(&mut self.cxl_pools);
        self.register_cxl_pools();
        assert_eq!(
            before, self.cxl_pools,
            "seed={}: a restarted directory gave a shared pool another id",
            self.stats.seed
        );
        self.declare_nodes();
        let until = self.now + self.directory.recovery_window();
        let pools: Vec<PoolId> = self.cxl_pools.keys().copied().collect();
        for pool in pools {
            self.directory
                .hold_extents_until(pool, until)
                .expect("shared pools hold extents");
        }
        self.directory.recover_until(until);
        for node in 0..self.nodes.len() {
            self.nodes[node].directory_killed();
        }
    }

    /// Object `index` of tenant `tenant`'s namespace.
    pub fn object(&self, tenant: usize, index: u32) -> ObjectId {
        ObjectId {
            namespace: self.namespaces[tenant],
            prefix: PrefixDigest::ROOT.chain(&[index]),
            shard: 0,
            part: 0,
        }
    }

    pub fn random_object(&mut self, tenant: usize) -> ObjectId {
        let index = self.rng.below(u64::from(OBJECTS)) as u32;
        self.object(tenant, index)
    }

    /// The grant the configuration gives node `node`.
    pub fn grant(&self, node: usize) -> NodeGrant {
        NodeGrant {
            domains: self.nodes[node].domains.clone(),
            namespaces: NamespaceAccess::Any,
        }
    }

    /// One step: time moves, the directory ticks, due messages arrive, one node acts.
    pub fn step(&mut self) {
        self.now = self.now + Duration::from_millis(1 + self.rng.below(STEP_MS_MAX));
        self.election_step();
        if self.election.serving(self.now) {
            let ticked = self.directory.tick(self.now);
            self.stats.covered.expired += u64::from(ticked.expired);
            self.stats.covered.evicted += u64::from(ticked.evicted);
        }
        self.tick_items = 0;
        if self.faults && self.rng.below(1000) < DIRECTORY_RESTART_PER_MILLE {
            self.restart_directory();
        }
        if self.faults && self.rng.below(1000) < DISK_ROT_PER_MILLE {
            self.rot();
        }
        if self.faults && self.rng.below(1000) < NODE_CUT_OFF_PER_MILLE {
            // Long enough, often, for the directory to fence the node and grant its
            // extents on.
            let node = self.rng.below(self.nodes.len() as u64) as usize;
            let cut = Duration::from_millis(500 + self.rng.below(4_000));
            self.network.cut_off(node, self.now + cut);
            self.stats.covered.node_cut_offs += 1;
        }
        for message in self.network.due(self.now) {
            self.deliver(message);
            self.directory.check_invariants();
        }
        // Rejoins run beside the node's other work, every node's at once (a storm).
        let first = self.rng.below(self.nodes.len() as u64) as usize;
        for offset in 0..self.nodes.len() {
            let rejoining = (first + offset) % self.nodes.len();
            if self.nodes[rejoining].rejoin.is_some() {
                self.rejoin_step(rejoining);
            }
        }
        self.run_copies();
        for pushing in 0..self.nodes.len() {
            self.push_timeouts(pushing);
        }
        let node = self.rng.below(self.nodes.len() as u64) as usize;
        self.node_step(node);
        self.node_timeouts(node);
        self.check();
    }

    fn deliver(&mut self, message: Message) {
        if self.nodes[message.node].connection != message.connection {
            // That process's connection is closed.
            return;
        }
        match message.payload {
            // A request reaching no serving directory is refused unanswered (a leader past
            // its lease, or a standby).
            Payload::Request(_) if !self.election.serving(self.now) => {}
            Payload::Request(request) => {
                let node = message.node;
                let reply = self.call(node, request);
                self.network.send(
                    &mut self.rng,
                    self.now,
                    node,
                    message.connection,
                    message.request_id,
                    Payload::Reply(reply),
                );
            }
            Payload::Reply(reply) => self.on_reply(message.node, message.request_id, reply),
            Payload::Peer(peer) => self.on_peer(message.node, peer),
        }
    }

    /// The session node `node`'s connection is bound to: the one it opened, as long as the
    /// directory knows it as that node's (a connection to a restarted directory resumes
    /// its session by id and name, and is refused when either does not match).
    fn bound_session(&self, node: usize) -> Result<Option<SessionId>, DirectoryReply> {
        let Some(session) = self.nodes[node].session else {
            return Ok(None);
        };
        if self.directory.session_node_name(session) == Some(self.nodes[node].name.as_str()) {
            Ok(Some(session))
        } else {
            Err(DirectoryReply::Error(ProtocolError::Directory(
                DirectoryError::UnknownSession,
            )))
        }
    }

    /// Answers one request of node `node` at the directory, on the connection bound to its
    /// session (start-up calls it directly; other requests arrive through the network).
    pub fn call(
        &mut self,
        node: usize,
        request: kvtier_core::protocol::messages::DirectoryRequest,
    ) -> DirectoryReply {
        if !self.election.serving(self.now) {
            return DirectoryReply::Error(ProtocolError::Node("no directory serves".into()));
        }
        let peer = self.nodes[node].name.clone();
        let role = PeerRole::Node(self.grant(node));
        match self.bound_session(node) {
            Ok(session) => self
                .directory
                .handle(self.now, &peer, role, session, request),
            Err(refusal) => refusal,
        }
    }

    /// Every lease some engine still reads under: the live nodes' and the orphans'.
    fn trusted_leases(&self) -> impl Iterator<Item = &HeldLease> {
        self.nodes
            .iter()
            .flat_map(|node| node.leases.iter())
            .chain(self.orphan_leases.iter())
            .filter(|held| held.trusted_until > self.now)
    }

    /// A writer puts `object`'s bytes at `offset` of `space`: nobody may still read other
    /// bytes there.
    pub fn write(&mut self, space: Space, offset: u64, object: ObjectId) {
        self.check_partition(space, &object);
        for held in self.trusted_leases() {
            assert!(
                held.space != space || held.lease.location.offset_bytes != offset || held.object == object,
                "seed={}: a write into {space:?}+{offset} overwrote bytes a reader holds a lease on ({:?})",
                self.stats.seed,
                held.lease.replica
            );
        }
        self.memory.insert((space, offset), object);
    }

    /// Bytes at `offset` of `space` go (`what`: freed): nobody may still read them.
    pub fn check_unread(&self, space: Space, offset: u64, what: &str) {
        for held in self.trusted_leases() {
            assert!(
                held.space != space || held.lease.location.offset_bytes != offset,
                "seed={}: {space:?}+{offset} was {what} under a lease a reader trusts ({:?}, until {:?}, now {:?})",
                self.stats.seed,
                held.lease.replica,
                held.trusted_until,
                self.now,
            );
        }
    }

    /// A reader checks the bytes under its lease.
    pub fn verify(&mut self, held: &HeldLease) {
        let found = self
            .memory
            .get(&(held.space, held.lease.location.offset_bytes));
        assert_eq!(
            found,
            Some(&held.object),
            "seed={}: a lease on {:?} reads wrong bytes",
            self.stats.seed,
            held.lease.replica
        );
        self.stats.covered.reads_verified += 1;
    }

    /// The cluster-wide checks after a step.
    fn check(&mut self) {
        self.directory.check_invariants();
        self.orphan_leases
            .retain(|held| held.trusted_until > self.now);
        let held: Vec<HeldLease> = self.trusted_leases().cloned().collect();
        for lease in &held {
            self.verify(lease);
        }
        self.check_single_writer();
    }

    /// No two running nodes hold overlapping extents of one shared pool. A node opening its
    /// new session is not counted: it writes nothing before it claims its extents.
    fn check_single_writer(&self) {
        let mut extents: Vec<(u32, u64, u64, usize)> = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if node
                .rejoin
                .as_ref()
                .is_some_and(|rejoin| rejoin.is_opening())
            {
                continue;
            }
            for (domain, allocator) in &node.cxl {
                for (offset, length) in allocator.extents() {
                    extents.push((*domain, offset, offset + length, index));
                }
            }
        }
        extents.sort_unstable();
        for pair in extents.windows(2) {
            let (first, second) = (pair[0], pair[1]);
            assert!(
                first.0 != second.0 || first.2 <= second.1,
                "seed={}: nodes {} and {} both allocate in cxl{} at {}..{}",
                self.stats.seed,
                first.3,
                second.3,
                first.0,
                second.1,
                first.2
            );
        }
    }

    /// The seed's figures.
    pub fn report(&self, steps: u32) -> SeedReport {
        SeedReport {
            steps,
            ..self.stats.clone()
        }
    }
}

/// A shared pool's extent owner words. Domain 1's table stops one extent short of the
/// pool, as a header page too small for its pool would, so untracked extents are
/// exercised too.
fn owner_words(domain: u32) -> OwnerWordsInMemory {
    let extents = CXL_POOL_OBJECTS / EXTENT_OBJECTS;
    let reached = if domain == 1 { extents - 1 } else { extents };
    OwnerWordsInMemory::new(reached as usize)
}
