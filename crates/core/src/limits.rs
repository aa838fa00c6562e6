//! Bounds that more than one layer reads: the configuration refuses a value past them when
//! it loads `cluster.toml`, and the actors that apply the value clamp to them again. Kept
//! here, below both, so that neither layer imports the other for a constant.

use std::time::Duration;

/// The most a busy poll may be configured to spin after the last request or reply
/// (`[nodes] busy_poll_us`): past this, polling costs more CPU than any wake-up it saves.
pub const BUSY_POLL_TAIL_MAX: Duration = Duration::from_millis(10);

/// Most copy worker threads a node may ask for (`[nodes] copy_threads`): 16.
pub const COPY_THREADS_MAX: usize = 16;
