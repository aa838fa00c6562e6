//! The operator's connection to the directory: QUIC with mutual TLS under an operator
//! certificate (`[directory] operators`), for the requests only an operator may make
//! (`kvtier ctl reload`, `kvtier ctl drain`). An engine never holds that certificate, so
//! no engine can drain a node or reload the cluster, whatever user it runs as.

use anyhow::{bail, Context};
use clap::Args;
use kvtier_core::config::ClusterConfig;
use kvtier_core::protocol::messages::{DirectoryReply, DirectoryRequest, Hello};
use kvtier_core::wire::{quic, tls, RpcClient, RpcConfig};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// How long one request may take: a reload formats new CXL pools.
const OPERATOR_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Who asks the directory, and where it is.
#[derive(Args, Clone, Debug)]
pub struct OperatorTarget {
    /// The cluster's configuration: the directory's address, name and certificate folder.
    #[arg(long)]
    pub config: PathBuf,
    /// The operator certificate to present (`<certs>/<NAME>.pem`): by default the first of
    /// `[directory] operators`.
    #[arg(long = "as", value_name = "NAME")]
    pub operator: Option<String>,
    /// The directory's address when it differs from `[directory] listen`.
    #[arg(long)]
    pub directory: Option<SocketAddr>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A connection to the directory under an operator certificate.
pub(crate) struct OperatorLink {
    runtime: tokio::runtime::Runtime,
    rpc: RpcClient<DirectoryRequest, DirectoryReply>,
    /// Kept for the connection's life.
    _endpoint: quinn::Endpoint,
}

impl OperatorLink {
    /// Connects to the directory `target` names and says hello.
    pub(crate) fn connect(target: &OperatorTarget) -> anyhow::Result<OperatorLink> {
        let config = ClusterConfig::load(&target.config)?;
        let operator = match &target.operator {
            Some(name) => name.clone(),
            None => config
                .directory
                .operators
                .first()
                .cloned()
                .context("[directory] operators names no operator")?,
        };
        let address = target
            .directory
            .unwrap_or_else(|| reachable(config.directory.listen));
        let tls = tls::client_config(&config.directory.certs, &operator).with_context(|| {
            format!(
                "the operator certificate `{operator}` in {} (kvtier certs issue --names {operator})",
                config.directory.certs.display()
            )
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let bind = match address {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        };
        let (endpoint, rpc) = runtime
            .block_on(async {
                let endpoint = quic::client_endpoint(bind)?;
                let connection =
                    quic::connect(&endpoint, address, &config.directory.name, tls).await?;
                let (sender, receiver) = quic::open_session(&connection).await?;
                let rpc = RpcClient::spawn(
                    receiver,
                    sender,
                    RpcConfig {
                        inflight_requests_max: 1,
                        request_timeout: OPERATOR_REQUEST_TIMEOUT,
                    },
                )?;
                let hello = rpc.call(DirectoryRequest::Hello(Hello::ours())).await;
                let hello = hello.map_err(|error| match quic::peer_close_reason(&connection) {
                    Some(reason) => anyhow::anyhow!("closed by the directory: {reason}"),
                    None => error.into(),
                });
                match hello? {
                    DirectoryReply::Hello(_) => anyhow::Ok((endpoint, rpc)),
                    other => bail!("the directory answered hello with {other:?}"),
                }
            })
            .with_context(|| format!("connecting to the directory at {address} as `{operator}`"))?;
        Ok(OperatorLink {
            runtime,
            rpc,
            _endpoint: endpoint,
        })
    }

    /// Sends `request`; a refusal is an error.
    pub(crate) fn call(&self, request: DirectoryRequest) -> anyhow::Result<DirectoryReply> {
        match self.runtime.block_on(self.rpc.call(request))? {
            DirectoryReply::Error(error) => bail!("{error}"),
            reply => Ok(reply),
        }
    }
}

/// The address to reach a directory listening on `listen` from this host: a wildcard
/// listen is reached on loopback.
fn reachable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, listen.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, listen.port()).into(),
        _ => listen,
    }
}
