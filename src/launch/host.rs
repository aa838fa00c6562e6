//! What a local cluster makes on this host besides its processes — its folder, pool files,
//! network namespaces and veth pairs — and how each is removed again.

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
    /// Root-side ends of veth pairs (gone with their namespace once the other end is in it).
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

/// Adds network namespace `name` and a veth pair whose `node_end` lives in it, recording
/// in `created` each thing as it is made, so a failure part way removes exactly those.
fn add_namespace_with_link(
    created: &mut Created,
    name: &str,
    host_end: &str,
    node_end: &str,
) -> Result<(), String> {
    ip(&["netns", "add", name])?;
    created.namespaces.push(name.to_string());
    ip(&[
        "link", "add", host_end, "type", "veth", "peer", "name", node_end,
    ])?;
    created.links.push(host_end.to_string());
    ip(&["link", "set", node_end, "netns", name])
}

/// Why this process cannot give nodes network namespaces of their own (`None`: it can). It
/// creates and deletes a scratch namespace and veth pair, as [`ClusterSpec::netns`] does;
/// without root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) or without `ip`, it cannot.
pub fn network_namespaces_unavailable() -> Option<String> {
    let (process, number) = (
        std::process::id(),
        NAMESPACES.fetch_add(1, Ordering::Relaxed),
    );
    let name = format!("kvtier-check-{process}-{number}");
    // Interface names hold 15 bytes: eight hex digits of this process and the count.
    let unique = format!("{:08x}", (process << 8) ^ (number & 0xff));
    let (host_end, node_end) = (format!("kvch{unique}"), format!("kvcn{unique}"));
    // Only what this call made goes into `created`: a name another process holds stays.
    let mut created = Created::default();
    let refused = add_namespace_with_link(&mut created, &name, &host_end, &node_end).err();
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

/// A node's network namespace and the root-side address of its veth pair.
pub(super) struct Namespace {
    pub(super) name: String,
    pub(super) host_address: std::net::Ipv4Addr,
}

static NAMESPACES: AtomicU32 = AtomicU32::new(0);

/// Creates one namespace per node, each joined to the root namespace by a veth pair on its
/// own /30 of 10.231.0.0/16 (test hosts this process makes itself), recording each in
/// `created` as soon as it exists. Fails, naming the step, when any step does (not root,
/// no `ip`); the caller then removes what `created` holds.
pub(super) fn create_namespaces(
    tag: &str,
    nodes: usize,
    created: &mut Created,
) -> Result<Vec<Namespace>, String> {
    let mut namespaces = Vec::new();
    for index in 0..nodes {
        let number = NAMESPACES.fetch_add(1, Ordering::Relaxed) + std::process::id() % 1000 * 16;
        let (high, low) = (((number / 64) % 250) as u8, ((number % 64) * 4) as u8);
        let name = format!("kvtier-{tag}-{index}");
        let (host_end, node_end) = (format!("kvh{number}"), format!("kvn{number}"));
        let host_address = std::net::Ipv4Addr::new(10, 231, high, low + 1);
        let node_address = std::net::Ipv4Addr::new(10, 231, high, low + 2);
        let (host_cidr, node_cidr) = (format!("{host_address}/30"), format!("{node_address}/30"));
        add_namespace_with_link(created, &name, &host_end, &node_end)?;
        ip(&["addr", "add", &host_cidr, "dev", &host_end])?;
        ip(&["link", "set", &host_end, "up"])?;
        ip(&["-n", &name, "addr", "add", &node_cidr, "dev", &node_end])?;
        ip(&["-n", &name, "link", "set", &node_end, "up"])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        namespaces.push(Namespace { name, host_address });
    }
    Ok(namespaces)
}
