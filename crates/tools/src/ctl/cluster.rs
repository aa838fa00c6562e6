//! `kvtier ctl status|reload|drain`: the cluster half of `kvtier ctl`. `status` connects to
//! a node's Unix socket (`--socket`, or `--config` and `--node`), says hello as an engine
//! does, and asks the node, which forwards to the directory and answers only a process of
//! its own user. `reload` and `drain` ask the directory itself under an operator
//! certificate ([`super::operator`]).

use super::operator::{OperatorLink, OperatorTarget};
use anyhow::{bail, Context};
use clap::Args;
use kvtier_core::config::ClusterConfig;
use kvtier_core::directory::{DrainProgress, DrainState};
use kvtier_core::model::Scope;
use kvtier_core::protocol::messages::{
    ClientReply, ClientRequest, ClusterStatus, DirectoryReply, DirectoryRequest, Hello,
};
use kvtier_core::wire::{handoff, uds, RpcClient, RpcConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long one request may take: a reload formats new CXL pools.
const CTL_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How often `drain --wait` looks at the drain's progress.
const DRAIN_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Which node to speak to.
#[derive(Args, Clone, Debug)]
pub struct Target {
    /// The node's Unix socket.
    #[arg(long, conflicts_with_all = ["config", "node"])]
    pub socket: Option<PathBuf>,
    /// The cluster's configuration: `--node`'s socket, or without it the first node of
    /// the file that answers (as `kvtier top` picks one).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The node (in `--config`) whose socket to use.
    #[arg(long, requires = "config")]
    pub node: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `kvtier ctl status`.
#[derive(Args, Clone, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: Target,
}

/// `kvtier ctl reload`.
#[derive(Args, Clone, Debug)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub target: OperatorTarget,
}

/// `kvtier ctl drain`.
#[derive(Args, Clone, Debug)]
pub struct DrainArgs {
    /// The node to drain.
    pub name: String,
    #[command(flatten)]
    pub target: OperatorTarget,
    /// Wait until the drain ends (drained, interrupted or stuck), printing its progress.
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: give up (non-zero exit) after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
}

impl Target {
    fn socket(&self) -> anyhow::Result<PathBuf> {
        match (&self.socket, &self.config, &self.node) {
            (Some(socket), _, _) => Ok(socket.clone()),
            (None, Some(config), Some(node)) => {
                Ok(ClusterConfig::load(config)?.node(node)?.socket.clone())
            }
            _ => bail!("say which node to ask: --socket PATH, or --config FILE [--node NAME]"),
        }
    }
}

/// A connection to a node for control requests (and `kvtier top`'s status requests).
pub(crate) struct Control {
    runtime: tokio::runtime::Runtime,
    rpc: RpcClient<ClientRequest, ClientReply>,
}

impl Control {
    fn connect(target: &Target) -> anyhow::Result<Control> {
        match (&target.socket, &target.config, &target.node) {
            (None, Some(config), None) => Control::connect_first(config),
            _ => Control::connect_socket(&target.socket()?, CTL_REQUEST_TIMEOUT),
        }
    }

    /// The first node of the configuration at `config` that answers, as `kvtier top` picks
    /// one; the error names why each did not.
    fn connect_first(config: &std::path::Path) -> anyhow::Result<Control> {
        let config = ClusterConfig::load(config)?;
        let mut failures = Vec::new();
        for node in &config.nodes {
            match Control::connect_socket(&node.socket, CTL_REQUEST_TIMEOUT) {
                Ok(control) => return Ok(control),
                Err(error) => failures.push(format!("{}: {error:#}", node.name)),
            }
        }
        bail!("no node answered ({})", failures.join("; "))
    }

    /// Connects to the node at `socket` and says hello; each later request may take
    /// `request_timeout`.
    pub(crate) fn connect_socket(
        socket: &std::path::Path,
        request_timeout: Duration,
    ) -> anyhow::Result<Control> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let rpc = runtime.block_on(async {
            let stream = uds::connect(socket)
                .await
                .with_context(|| format!("connecting to the node at {}", socket.display()))?;
            // The pools' memory files are for engines; this connection maps none.
            drop(handoff::receive(&stream, request_timeout).await?);
            let (reader, writer) = stream.into_split();
            let config = RpcConfig {
                inflight_requests_max: 1,
                request_timeout,
            };
            let rpc = RpcClient::spawn(reader, writer, config)?;
            match rpc.call(ClientRequest::Hello(Hello::ours())).await? {
                ClientReply::Hello(_) => Ok::<_, anyhow::Error>(rpc),
                other => bail!("the node answered hello with {other:?}"),
            }
        })?;
        Ok(Control { runtime, rpc })
    }

    fn call(&self, request: ClientRequest) -> anyhow::Result<ClientReply> {
        match self.runtime.block_on(self.rpc.call(request))? {
            ClientReply::Error(error) => bail!("{error}"),
            reply => Ok(reply),
        }
    }

    /// The cluster as the directory sees it.
    pub(crate) fn status(&self) -> anyhow::Result<ClusterStatus> {
        match self.call(ClientRequest::ClusterStatus)? {
            ClientReply::ClusterStatus(status) => Ok(status),
            other => bail!("unexpected reply {other:?}"),
        }
    }
}

/// `kvtier ctl status`: prints every node and pool.
pub fn status(args: &StatusArgs) -> anyhow::Result<()> {
    let status = Control::connect(&args.target)?.status()?;
    if args.target.json {
        println!("{}", serde_json::to_string(&status)?);
        return Ok(());
    }
    println!(
        "{:<16} {:>5} {:>6} {:>8}  {:<10} drain",
        "node", "id", "epoch", "session", "state"
    );
    for node in &status.nodes {
        let session = node
            .session
            .map_or_else(|| "-".to_string(), |session| session.to_string());
        let drain = node.drain.as_ref().map_or_else(String::new, describe_drain);
        println!(
            "{:<16} {:>5} {:>6} {:>8}  {:<10} {drain}",
            node.name,
            node.node.to_string(),
            node.epoch.to_string(),
            session,
            node.state
        );
    }
    println!();
    println!(
        "{:<20} {:>5} {:<6} {:<10} {:>12} {:>12} {:>12}",
        "pool", "id", "medium", "scope", "capacity", "ready", "reserved"
    );
    for pool in &status.pools {
        let scope = match pool.spec.scope {
            Scope::Host(node) => format!("node {node}"),
            Scope::Domain(domain) => format!("domain {}", domain.0),
        };
        println!(
            "{:<20} {:>5} {:<6} {:<10} {:>12} {:>12} {:>12}",
            pool.spec.name,
            pool.pool.to_string(),
            pool.spec.medium.name(),
            scope,
            pool.usage.capacity_bytes,
            pool.usage.ready_bytes,
            pool.usage.reserved_bytes
        );
    }
    Ok(())
}

/// `kvtier ctl reload`: prints what the reload applied, or fails with the refusal.
pub fn reload(args: &ReloadArgs) -> anyhow::Result<()> {
    let change = match OperatorLink::connect(&args.target)?.call(DirectoryRequest::Reload)? {
        DirectoryReply::Reloaded(change) => change,
        other => bail!("unexpected reply {other:?}"),
    };
    if args.target.json {
        println!("{}", serde_json::to_string(&change)?);
    } else if change.is_empty() {
        println!("reloaded: nothing changed");
    } else {
        println!(
            "reloaded: nodes added {:?}, removed (draining) {:?}, regranted {:?}; CXL pools added {:?}; namespaces repriced {:?}",
            change.added_nodes,
            change.removed_nodes,
            change.regranted_nodes,
            change.added_cxl_pools,
            change.repriced_namespaces
        );
    }
    Ok(())
}

/// `kvtier ctl drain NAME`: starts the drain and prints its progress; with `--wait`,
/// until it ends (an interrupted or stuck drain fails the command, saying why).
pub fn drain(args: &DrainArgs) -> anyhow::Result<()> {
    let operator = OperatorLink::connect(&args.target)?;
    let mut progress = match operator.call(DirectoryRequest::Drain {
        node: args.name.clone(),
    })? {
        DirectoryReply::Draining(progress) => progress,
        other => bail!("unexpected reply {other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    loop {
        if args.target.json {
            println!("{}", serde_json::to_string(&progress)?);
        } else {
            println!("{}: {}", args.name, describe_drain(&progress));
        }
        if !args.wait || !progress.state.is_active() {
            break;
        }
        if let Some(reason) = &progress.stuck {
            bail!("the drain of {} is stuck: {reason}", args.name);
        }
        if Instant::now() >= deadline {
            bail!("{} not drained after {} s", args.name, args.timeout_s);
        }
        std::thread::sleep(DRAIN_POLL_INTERVAL);
        let status = match operator.call(DirectoryRequest::ClusterStatus)? {
            DirectoryReply::ClusterStatus(status) => status,
            other => bail!("unexpected reply {other:?}"),
        };
        let node = status.nodes.iter().find(|node| node.name == args.name);
        progress = node
            .and_then(|node| node.drain.clone())
            .with_context(|| format!("the directory no longer reports {}", args.name))?;
    }
    if progress.state == DrainState::Interrupted {
        bail!(
            "the drain of {} was interrupted: its session was fenced or replaced",
            args.name
        );
    }
    Ok(())
}

/// One line of a drain's progress: `relocating (...)`, or `stuck: <reason> (...)`.
fn describe_drain(progress: &DrainProgress) -> String {
    let state = match &progress.stuck {
        Some(reason) => format!("stuck: {reason}"),
        None => progress.state.name().to_string(),
    };
    format!(
        "{state} ({} replicas to relocate, {} demotions in flight, {} leases, {} reservations)",
        progress.replicas_left,
        progress.demotions_in_flight,
        progress.leases_outstanding,
        progress.reservations_outstanding
    )
}
