//! Object keys from Python: a key is `bytes`. A 16-byte key is used as the prefix digest
//! itself (as [`prefix_digest`] returns); any other key (an engine's block hash, e.g.
//! vLLM's 32-byte SHA-256) is hashed to one, so equal keys name equal objects everywhere.

use kvtier::{NamespaceId, ObjectId, PrefixDigest};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The longest key accepted, in bytes: keys are hashes, never payloads.
pub(crate) const KEY_BYTES_MAX: usize = 1024;

/// The prefix digest of a key (see the module documentation).
pub(crate) fn digest(key: &[u8]) -> PyResult<PrefixDigest> {
    if key.len() > KEY_BYTES_MAX {
        return Err(PyValueError::new_err(format!(
            "a key is at most {KEY_BYTES_MAX} bytes, this one is {}",
            key.len()
        )));
    }
    if let Ok(digest) = <[u8; 16]>::try_from(key) {
        return Ok(PrefixDigest(digest));
    }
    let mut hasher = blake3::Hasher::new_derive_key("kvtier python key v1");
    hasher.update(key);
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    Ok(PrefixDigest(digest))
}

/// The object ids of `keys` in `namespace` (shard and part 0).
pub(crate) fn objects(
    namespace: NamespaceId,
    keys: &[Bound<'_, PyBytes>],
) -> PyResult<Vec<ObjectId>> {
    keys.iter().map(|key| object(namespace, key)).collect()
}

/// The object id of one key in `namespace` (shard and part 0).
pub(crate) fn object(namespace: NamespaceId, key: &Bound<'_, PyBytes>) -> PyResult<ObjectId> {
    Ok(ObjectId {
        namespace,
        prefix: digest(key.as_bytes())?,
        shard: 0,
        part: 0,
    })
}

/// The chained prefix digest of a chunk of `tokens` after the prefix `parent` (None: the
/// start of the prompt), as 16 bytes: `digest = H(parent, tokens)`. Use it as the key of
/// the chunk to share it with every engine that chains its prompts the same way.
#[pyfunction]
#[pyo3(signature = (tokens, parent=None))]
pub(crate) fn prefix_digest<'py>(
    py: Python<'py>,
    tokens: Vec<u32>,
    parent: Option<Vec<u8>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let parent = match parent {
        None => PrefixDigest::ROOT,
        Some(parent) => PrefixDigest(<[u8; 16]>::try_from(parent.as_slice()).map_err(|_| {
            PyValueError::new_err("a parent digest is 16 bytes, as prefix_digest returns")
        })?),
    };
    Ok(PyBytes::new(py, &parent.chain(&tokens).0))
}
