//! What the directory and node processes share: the metrics endpoint and the signals that
//! end them.

use std::net::SocketAddr;
use std::sync::Arc;

/// Serves `/metrics` on `address` in the background, when configured.
pub async fn serve_metrics(
    address: Option<SocketAddr>,
    metrics: Arc<crate::metrics::Metrics>,
) -> anyhow::Result<()> {
    if let Some(address) = address {
        let listener = tokio::net::TcpListener::bind(address).await?;
        tracing::info!(address = %listener.local_addr()?, "serving /metrics");
        actix_rt::spawn(crate::metrics::serve(listener, metrics));
    }
    Ok(())
}

/// Resolves when the process receives SIGINT or SIGTERM.
pub async fn shutdown_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
