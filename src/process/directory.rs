//! `kvtier directory`: the directory actor, a QUIC endpoint with mutual TLS, a session
//! actor per node connection, and the metrics exporter.

use super::{serve_metrics, shutdown_signal};
use crate::actors::directory::{DirectoryActor, NodeGrant};
use crate::actors::session::SessionActor;
use crate::config::ClusterConfig;
use crate::directory::Directory;
use crate::metrics::Metrics;
use crate::wire::{quic, tls};
use actix::prelude::*;
use anyhow::Context as _;
use std::collections::HashMap;
use std::sync::Arc;

/// Runs the directory until SIGINT or SIGTERM. Must run inside an actix `System`.
pub async fn run(config: ClusterConfig) -> anyhow::Result<()> {
    let section = &config.directory;
    let server_config = tls::server_config(&section.certs, &section.name).with_context(|| {
        format!(
            "loading the directory certificate from {}",
            section.certs.display()
        )
    })?;
    let endpoint = quic::server_endpoint(section.listen, server_config)
        .context("binding the QUIC endpoint")?;
    let metrics = Arc::new(Metrics::new()?);
    serve_metrics(section.metrics, metrics.clone()).await?;
    let grants: HashMap<String, NodeGrant> = config
        .nodes
        .iter()
        .map(|node| {
            let (domains, namespaces) = node.access();
            (
                node.name.clone(),
                NodeGrant {
                    domains,
                    namespaces,
                },
            )
        })
        .collect();
    let directory = DirectoryActor::new(
        Directory::new(section.limits.clone()),
        grants,
        metrics,
        section.tick_interval(),
    )
    .start();
    tracing::info!(address = %endpoint.local_addr()?, "directory listening");
    let accepting = endpoint.clone();
    actix_rt::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let directory = directory.clone();
            actix_rt::spawn(async move {
                if let Err(error) = accept(incoming, directory).await {
                    tracing::warn!(%error, "refused a connection");
                }
            });
        }
    });
    shutdown_signal().await?;
    endpoint.close(quinn::VarInt::from_u32(0), b"directory shutting down");
    Ok(())
}

async fn accept(incoming: quinn::Incoming, directory: Addr<DirectoryActor>) -> anyhow::Result<()> {
    let connection = incoming.await?;
    let peer = tls::peer_name(&connection).context("peer certificate names nobody")?;
    let streams = quic::accept_session(&connection).await?;
    SessionActor::new(directory, connection, peer, streams).start();
    Ok(())
}
