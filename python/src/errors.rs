//! The Python exceptions, and how [`ClientError`] maps to them. A skipped store is not an
//! error: it is a status.

use kvtier::errors::{ClientRefusal, DirectoryError, ProtocolError};
use kvtier::ClientError;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    kvtier,
    KvtierError,
    PyException,
    "Base of every kvtier error. `reason` names the typed cause."
);
pyo3::create_exception!(
    kvtier,
    NodeUnreachable,
    KvtierError,
    "The node could not be reached or the connection broke: connect again."
);
pyo3::create_exception!(
    kvtier,
    Refused,
    KvtierError,
    "The node or the directory refused the request; `reason` says why (directory, tenant, client, node, ...)."
);
pyo3::create_exception!(
    kvtier,
    BatchTooLarge,
    Refused,
    "A request carried more items than the node or the directory takes in one; the message \
     names the limit. `store_many` and `load_into` split any number of keys; `load`, `probe` \
     and `prefetch` of more keys than the directory's `batch_items_max` (4096 by default) get it."
);
pyo3::create_exception!(
    kvtier,
    PoolError,
    KvtierError,
    "A pool the node named could not be mapped or verified."
);
pyo3::create_exception!(
    kvtier,
    LeaseExpired,
    KvtierError,
    "A view's lease ended: its bytes may belong to another object by now. Load again."
);
pyo3::create_exception!(
    kvtier,
    Busy,
    KvtierError,
    "Too many requests or jobs in flight: poll completions (or wait for replies) and retry."
);

/// Adds the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("KvtierError", py.get_type::<KvtierError>())?;
    module.add("NodeUnreachable", py.get_type::<NodeUnreachable>())?;
    module.add("Refused", py.get_type::<Refused>())?;
    module.add("BatchTooLarge", py.get_type::<BatchTooLarge>())?;
    module.add("PoolError", py.get_type::<PoolError>())?;
    module.add("LeaseExpired", py.get_type::<LeaseExpired>())?;
    module.add("Busy", py.get_type::<Busy>())?;
    Ok(())
}

/// The Python exception for a client error, its `reason` attribute set to the typed cause.
pub(crate) fn to_py(error: ClientError) -> PyErr {
    if let ClientError::Refused(refusal) = &error {
        if let Some((items, max)) = batch_bound(refusal) {
            let message = format!(
                "refused: a batch of {items} items is over the limit of {max} items a request \
                 may carry"
            );
            return with_reason(BatchTooLarge::new_err(message), "batch_too_large");
        }
    }
    let message = error.to_string();
    let (error, reason) = match &error {
        ClientError::Refused(ProtocolError::Busy) => (Busy::new_err(message), "busy"),
        ClientError::Refused(refusal) => (Refused::new_err(message), refusal_reason(refusal)),
        ClientError::Wire(_) => (NodeUnreachable::new_err(message), "unreachable"),
        ClientError::Pool { .. } => (PoolError::new_err(message), "pool"),
        ClientError::LeaseExpired => (LeaseExpired::new_err(message), "lease_expired"),
        ClientError::Unexpected(_) => (KvtierError::new_err(message), "unexpected"),
    };
    with_reason(error, reason)
}

/// Sets `reason` on the exception instance.
pub(crate) fn with_reason(error: PyErr, reason: &str) -> PyErr {
    Python::with_gil(|py| {
        // Setting an attribute on a fresh exception instance cannot fail in practice; if it
        // did, the exception still carries its message.
        let _ = error.value(py).setattr("reason", reason);
    });
    error
}

/// The items and the limit of a batch refused as too large, whether the node (for the
/// client) or the directory refused it: one error for Python either way.
fn batch_bound(refusal: &ProtocolError) -> Option<(usize, usize)> {
    match refusal {
        ProtocolError::Client(ClientRefusal::BatchTooLarge { items, max })
        | ProtocolError::Directory(DirectoryError::BatchTooLarge { items, max }) => {
            Some((*items, *max))
        }
        _ => None,
    }
}

fn refusal_reason(refusal: &ProtocolError) -> &'static str {
    match refusal {
        ProtocolError::Directory(_) => "directory",
        ProtocolError::UnsupportedVersion { .. } => "unsupported_version",
        ProtocolError::Sequence(_) => "sequence",
        ProtocolError::Malformed(_) => "malformed",
        ProtocolError::UnknownPeer(_) => "unknown_peer",
        ProtocolError::Busy => "busy",
        ProtocolError::Node(_) => "node",
        ProtocolError::Tenant(_) => "tenant",
        ProtocolError::Client(_) => "client",
        ProtocolError::Reload(_) => "reload",
        ProtocolError::NotPermitted(_) => "not_permitted",
    }
}
