//! Object identity and locations. An object is one chunk of one shard of a prompt prefix
//! in one namespace; a location names where one replica's bytes are, never by address.

use super::ids::{AllocationId, Generation, PoolId};
use super::namespace::{hex, NamespaceId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The chained digest of a prompt prefix: `digest(chunk) = H(predecessor digest, tokens)`.
/// Equal digests mean equal token prefixes (up to 128-bit collisions).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PrefixDigest(#[serde(with = "super::digest_bytes")] pub [u8; 16]);

impl PrefixDigest {
    /// The digest before the first chunk.
    pub const ROOT: PrefixDigest = PrefixDigest([0; 16]);

    /// The digest of the chunk holding `tokens` after the prefix whose digest is `self`.
    pub fn chain(&self, tokens: &[u32]) -> PrefixDigest {
        let mut hasher = blake3::Hasher::new_derive_key("kvtier prefix v1");
        hasher.update(&self.0);
        for token in tokens {
            hasher.update(&token.to_le_bytes());
        }
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        PrefixDigest(digest)
    }
}

impl fmt::Debug for PrefixDigest {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "prefix:{}", hex(&self.0[..8]))
    }
}

/// The identity of a cached object. Workers and sessions are not part of it: the same
/// prefix stored by two engines of one namespace is the same object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectId {
    pub namespace: NamespaceId,
    pub prefix: PrefixDigest,
    /// Tensor/pipeline-parallel shard of the chunk.
    pub shard: u16,
    /// Part of a shard, when one chunk is stored as several objects.
    pub part: u16,
}

/// Where one replica's bytes are: never a virtual address, because every process maps a
/// pool at its own address. The generation makes the location unusable once the
/// allocation is freed and reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Location {
    pub pool: PoolId,
    pub allocation: AllocationId,
    pub generation: Generation,
    /// Byte offset of the object inside the pool's data area.
    pub offset_bytes: u64,
    /// Logical length of the object in bytes.
    pub length_bytes: u64,
}
