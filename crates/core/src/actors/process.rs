//! What the directory and node processes share: the metrics endpoint and the signals that
//! end them.

use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;

/// Binds the metrics endpoint's address, when configured: first thing at start, so an
/// address in use fails the start at once, naming the address, before anything else is
/// created (a pool pre-faulted, a session opened).
pub fn bind_metrics(address: Option<SocketAddr>) -> anyhow::Result<Option<std::net::TcpListener>> {
    address
        .map(|address| {
            let listener = std::net::TcpListener::bind(address).with_context(|| {
                format!("binding the metrics address {address} (`metrics` in cluster.toml)")
            })?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .transpose()
}

/// Serves `/metrics` in the background on `listener` (from [`bind_metrics`]), when there
/// is one.
pub fn serve_metrics(
    listener: Option<std::net::TcpListener>,
    metrics: Arc<crate::metrics::Metrics>,
) -> anyhow::Result<()> {
    if let Some(listener) = listener {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tracing::info!(address = %listener.local_addr()?, "serving /metrics");
        actix_rt::spawn(crate::metrics::serve(listener, metrics));
    }
    Ok(())
}

/// Resolves when the process receives SIGINT or SIGTERM, with the signal's name.
pub async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(tokio::select! {
        result = tokio::signal::ctrl_c() => result.map(|()| "SIGINT")?,
        _ = terminate.recv() => "SIGTERM",
    })
}
