//! What a local cluster makes on this host besides its processes — its folder, pool files,
//! network namespaces, veth pairs and the bridge joining them — and how each is removed
//! again.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// What a local cluster created on this machine, so that every way out of it (a failed or
/// cancelled start, a drop, a shutdown) removes it. Removing is safe to repeat.
#[derive(Debug, Default)]
pub(super) struct Created {
    pub(super) root: Option<PathBuf>,
    /// Pool files the processes create under `/dev/shm`.
    pub(super) files: Vec<PathBuf>,
    namespaces: Vec<String>,
    /// The bridge joining a cluster's veth pairs, and the pairs' root-side ends (gone with
    /// their namespace once the other end is in it).
    links: Vec<String>,
}

impl Created {
    /// Removes everything (the processes using it must be gone) and returns what is still
    /// there afterwards, each with why; empty when everything is gone.
    pub(super) fn remove(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        for file in self.files.drain(..) {
            if let Err(error) = remove_path(&file, |path| std::fs::remove_file(path)) {
                left.push(error);
            }
        }
        for namespace in self.namespaces.drain(..) {
            let deleted = ip(&["netns", "del", &namespace]);
            if Path::new("/run/netns").join(&namespace).exists() {
                let why = deleted.err().unwrap_or_else(|| "still there".into());
                left.push(format!("network namespace {namespace}: {why}"));
            }
        }
        for link in self.links.drain(..) {
            let device = Path::new("/sys/class/net").join(&link);
            if device.exists() {
                let deleted = ip(&["link", "del", &link]);
                if device.exists() {
                    let why = deleted.err().unwrap_or_else(|| "still there".into());
                    left.push(format!("network link {link}: {why}"));
                }
            }
        }
        if let Some(root) = self.root.take() {
            if let Err(error) = remove_path(&root, |path| std::fs::remove_dir_all(path)) {
                left.push(error);
            }
        }
        left
    }
}

/// Removes `path` with `remove`; `Err` names the path and why when it is still there.
fn remove_path(path: &Path, remove: fn(&Path) -> std::io::Result<()>) -> Result<(), String> {
    match remove(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: {error}", path.display()))
        }
        _ if path.exists() => Err(format!("{}: still there", path.display())),
        _ => Ok(()),
    }
}

/// Runs `ip` with `arguments`; `Err` says which command failed and what it printed.
fn ip(arguments: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(arguments)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("cannot run `ip`: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            arguments.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Adds network namespace `name` and a veth pair whose `node_end` lives in it and whose
/// `host_end` is a port of `bridge`, both ends as wide as [`LINK_MTU_BYTES`], recording in
/// `created` each thing as it is made, so a failure part way removes exactly those.
fn add_namespace_with_link(
    created: &mut Created,
    name: &str,
    bridge: &str,
    host_end: &str,
    node_end: &str,
) -> Result<(), String> {
    ip(&["netns", "add", name])?;
    created.namespaces.push(name.to_string());
    ip(&[
        "link", "add", host_end, "mtu", LINK_MTU, "type", "veth", "peer", "name", node_end, "mtu",
        LINK_MTU,
    ])?;
    created.links.push(host_end.to_string());
    ip(&["link", "set", host_end, "master", bridge])?;
    ip(&["link", "set", host_end, "up"])?;
    ip(&["link", "set", node_end, "netns", name])
}

/// Why this process cannot give nodes network namespaces of their own (`None`: it can). It
/// makes and removes a scratch network of one namespace, as [`ClusterSpec::netns`] does;
/// without root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) or without `ip`, it cannot.
///
/// [`ClusterSpec::netns`]: super::ClusterSpec::netns
pub fn network_namespaces_unavailable() -> Option<String> {
    let tag = format!(
        "check-{}-{}",
        std::process::id(),
        CHECKS.fetch_add(1, Ordering::Relaxed)
    );
    // Only what this call made goes into `created`: a name another process holds stays.
    let mut created = Created::default();
    let refused = create_network(&tag, 1, &mut created).err();
    let left = created.remove();
    match refused {
        Some(reason) => Some(reason),
        None if left.is_empty() => None,
        None => Some(format!(
            "cannot remove a scratch namespace: {}",
            left.join("; ")
        )),
    }
}

/// A node's network namespace and its address there.
pub(super) struct Namespace {
    pub(super) name: String,
    pub(super) address: Ipv4Addr,
}

/// The network of a cluster whose nodes are separate hosts: a bridge in the root namespace
/// (the switch) with an address of its own, which the directory and the benchmarks use,
/// and one namespace per node whose veth pair is a port of the bridge. Every address is in
/// one /26, so nodes reach each other, and the root namespace reaches them, without routes
/// or IP forwarding (no sysctl changes).
pub(super) struct Network {
    pub(super) bridge_address: Ipv4Addr,
    pub(super) namespaces: Vec<Namespace>,
}

/// MTU of every veth pair and bridge a cluster makes: as wide as loopback's, so a
/// `peer_datagram_bytes` means the same whether nodes share loopback or not.
const LINK_MTU: &str = "65535";
/// The /26 blocks of 10.232.0.0/16 (test hosts this process makes itself), one per cluster.
const BLOCKS: u32 = 1024;
/// Blocks a cluster tries before giving up: each taken one is a running (or crashed)
/// cluster's, and there are never many.
const BLOCK_TRIES: u32 = 64;
/// Nodes in one /26: its 64 addresses less the network, the broadcast and the bridge.
pub(super) const NODES_MAX: usize = 61;

static NETWORKS: AtomicU32 = AtomicU32::new(0);
static CHECKS: AtomicU32 = AtomicU32::new(0);

/// Claims a free /26 block for a cluster by creating its bridge `kvtb<block>` (a name
/// that exists is a block another cluster holds: the next one is tried), records the bridge
/// in `created` and gives it the block's first address. Returns the block's base address.
fn claim_block(created: &mut Created) -> Result<(String, Ipv4Addr), String> {
    let first = (std::process::id() % 1000) * 16 + NETWORKS.fetch_add(1, Ordering::Relaxed);
    for attempt in 0..BLOCK_TRIES {
        let block = (first + attempt) % BLOCKS;
        let bridge = format!("kvtb{block}");
        if Path::new("/sys/class/net").join(&bridge).exists() {
            continue;
        }
        if let Err(reason) = ip(&["link", "add", &bridge, "mtu", LINK_MTU, "type", "bridge"]) {
            if Path::new("/sys/class/net").join(&bridge).exists() {
                continue;
            }
            return Err(reason);
        }
        created.links.push(bridge.clone());
        let base = Ipv4Addr::new(10, 232, (block / 4) as u8, ((block % 4) * 64) as u8);
        let address = Ipv4Addr::from(u32::from(base) + 1);
        ip(&["addr", "add", &format!("{address}/26"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        return Ok((bridge, address));
    }
    Err(format!(
        "no free /26 among {BLOCK_TRIES} tried in 10.232.0.0/16"
    ))
}

/// Creates the [`Network`] of a cluster of `nodes` nodes, recording each thing in
/// `created` as soon as it exists. Fails, naming the step, when any step does (not root,
/// no `ip`, more than [`NODES_MAX`] nodes); the caller then removes what `created` holds.
pub(super) fn create_network(
    tag: &str,
    nodes: usize,
    created: &mut Created,
) -> Result<Network, String> {
    if nodes > NODES_MAX {
        return Err(format!(
            "{nodes} nodes, more than the {NODES_MAX} of one network"
        ));
    }
    let (bridge, bridge_address) = claim_block(created)?;
    let block = &bridge["kvtb".len()..];
    let mut namespaces = Vec::new();
    for index in 0..nodes {
        let name = format!("kvtier-{tag}-{index}");
        // Interface names hold 15 bytes; the claimed block makes these unique.
        let (host_end, node_end) = (format!("kvh{block}n{index}"), format!("kvn{block}n{index}"));
        let address = Ipv4Addr::from(u32::from(bridge_address) + 1 + index as u32);
        add_namespace_with_link(created, &name, &bridge, &host_end, &node_end)?;
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{address}/26"),
            "dev",
            &node_end,
        ])?;
        ip(&["-n", &name, "link", "set", &node_end, "up"])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        namespaces.push(Namespace { name, address });
    }
    Ok(Network {
        bridge_address,
        namespaces,
    })
}
