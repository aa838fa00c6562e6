//! The tokens of network copies: a keyed hash of the target replica id under a key of the
//! directory's incarnation. Both halves of a copy carry it; a node that does not know it
//! cannot claim the transfer (`crate::node::transfers`).

use super::DirectoryConfig;
use crate::model::{ReplicaId, TransferToken};

/// The key derivation context of the tokens' key ([`DirectoryConfig::secret_key`]).
const TRANSFER_TOKEN_KEY_PURPOSE: &str = "kvtier 2026-12 network copy transfer tokens";

/// Derives the network copies' tokens.
pub(super) struct TransferTokens {
    key: [u8; 32],
}

impl TransferTokens {
    /// Tokens keyed as `config` says: a random key in service, one derived from the seed in
    /// simulations and tests.
    pub(super) fn of(config: &DirectoryConfig) -> TransferTokens {
        TransferTokens {
            key: config.secret_key(TRANSFER_TOKEN_KEY_PURPOSE),
        }
    }

    /// The token of the network copy into `target`. One incarnation never reuses a replica
    /// id, and a restart draws a new key.
    pub(super) fn token(&self, target: ReplicaId) -> TransferToken {
        let hash = blake3::keyed_hash(&self.key, &target.0.to_le_bytes());
        let mut word = [0; 8];
        word.copy_from_slice(&hash.as_bytes()[..8]);
        TransferToken(u64::from_le_bytes(word))
    }
}
