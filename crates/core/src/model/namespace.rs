//! The namespace: the compatibility boundary of cached KV state. Two engines share
//! cached objects only when every field here is equal; the canonical encoding of the
//! descriptor hashes to the 128-bit [`NamespaceId`] carried in every [`crate::model::ObjectId`].

use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// The longest accepted text field (model name, revision, adapter, quantization), in bytes.
/// Model identifiers are short; a longer field is a malformed descriptor, not a model.
pub const NAMESPACE_TEXT_BYTES_MAX: usize = 256;

/// The storage format versions this build reads and writes.
pub const SUPPORTED_FORMAT_VERSIONS: &[u32] = &[1];

/// The element type of the stored KV tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvDtype {
    Float32,
    Float16,
    BFloat16,
    Float8E4M3,
    Float8E5M2,
    Int8,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::Float32 => 4,
            KvDtype::Float16 | KvDtype::BFloat16 => 2,
            KvDtype::Float8E4M3 | KvDtype::Float8E5M2 | KvDtype::Int8 => 1,
        }
    }
}

/// Everything that decides whether two engines may read each other's KV chunks.
/// Incomplete descriptors are rejected by [`NamespaceDescriptor::id`], never guessed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NamespaceDescriptor {
    /// Model name, e.g. `meta-llama/Llama-3.1-8B-Instruct`.
    pub model: String,
    /// Exact weights revision (commit hash or release tag).
    pub revision: String,
    /// LoRA or other adapter applied on top of the weights; `None` for the base model.
    pub adapter: Option<String>,
    pub kv_dtype: KvDtype,
    /// Quantization scheme of the KV tensors, e.g. `per-tensor-fp8`; `None` when unquantized.
    pub quantization: Option<String>,
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// The engine's paged-attention block size in tokens.
    pub block_tokens: u32,
    /// Layout version of the stored chunk bytes.
    pub format_version: u32,
    /// Tokens per stored chunk (one object per chunk per shard).
    pub chunk_tokens: u32,
    pub tensor_parallel: u32,
    pub pipeline_parallel: u32,
    /// The tenant's salt (as vLLM's `cache_salt`), set by the node from its tenant rules and
    /// never by the client: descriptors differing only in salt are different namespaces, so
    /// one tenant's probes reveal nothing of another's prompts. `None`: unsalted.
    #[serde(default)]
    pub salt: Option<String>,
}

/// Why a namespace descriptor was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceError {
    /// A required field is empty or zero; the engine must send a complete descriptor.
    #[error("namespace field `{field}` is missing or zero")]
    Missing { field: String },
    /// A text field is longer than [`NAMESPACE_TEXT_BYTES_MAX`].
    #[error("namespace field `{field}` is longer than {NAMESPACE_TEXT_BYTES_MAX} bytes")]
    TooLong { field: String },
    /// The storage format version is not one this build supports.
    #[error("storage format version {version} is not supported")]
    UnsupportedFormat { version: u32 },
    /// Chunk tokens must be a whole number of engine blocks.
    #[error("chunk of {chunk_tokens} tokens is not a multiple of the block size {block_tokens}")]
    ChunkNotBlockAligned {
        chunk_tokens: u32,
        block_tokens: u32,
    },
}

/// The 128-bit hash of a namespace's canonical encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NamespaceId(#[serde(with = "super::digest_bytes")] pub [u8; 16]);

impl fmt::Debug for NamespaceId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "ns:{}", hex(&self.0[..8]))
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl NamespaceDescriptor {
    /// Validates the descriptor and returns its id. Equal descriptors give equal ids; any
    /// change of a field gives a different id (up to 128-bit hash collisions).
    pub fn id(&self) -> Result<NamespaceId, NamespaceError> {
        self.validate()?;
        let mut hasher = blake3::Hasher::new_derive_key("kvtier namespace v1");
        for text in [&self.model, &self.revision] {
            hash_text(&mut hasher, Some(text));
        }
        hash_text(&mut hasher, self.adapter.as_ref());
        hasher.update(&[self.kv_dtype as u8]);
        hash_text(&mut hasher, self.quantization.as_ref());
        for number in [
            self.layers,
            self.kv_heads,
            self.head_dim,
            self.block_tokens,
            self.format_version,
            self.chunk_tokens,
            self.tensor_parallel,
            self.pipeline_parallel,
        ] {
            hasher.update(&number.to_le_bytes());
        }
        // Only a salted descriptor hashes its salt: unsalted ids stay as they were.
        if self.salt.is_some() {
            hash_text(&mut hasher, self.salt.as_ref());
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        Ok(NamespaceId(id))
    }

    /// Bytes of one chunk of one shard: K and V for every layer of this pipeline stage and
    /// every KV head of this tensor-parallel rank.
    pub fn chunk_bytes(&self) -> u64 {
        let heads_per_rank = u64::from(self.kv_heads).div_ceil(u64::from(self.tensor_parallel));
        let layers_per_stage = u64::from(self.layers).div_ceil(u64::from(self.pipeline_parallel));
        2 * layers_per_stage
            * heads_per_rank
            * u64::from(self.head_dim)
            * u64::from(self.chunk_tokens)
            * self.kv_dtype.bytes()
    }

    fn validate(&self) -> Result<(), NamespaceError> {
        for (field, text) in [("model", &self.model), ("revision", &self.revision)] {
            if text.is_empty() {
                return Err(NamespaceError::Missing {
                    field: field.into(),
                });
            }
        }
        for (field, text) in [
            ("model", Some(&self.model)),
            ("revision", Some(&self.revision)),
            ("adapter", self.adapter.as_ref()),
            ("quantization", self.quantization.as_ref()),
            ("salt", self.salt.as_ref()),
        ] {
            if text.is_some_and(|text| text.len() > NAMESPACE_TEXT_BYTES_MAX) {
                return Err(NamespaceError::TooLong {
                    field: field.into(),
                });
            }
        }
        for (field, number) in [
            ("layers", self.layers),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("block_tokens", self.block_tokens),
            ("chunk_tokens", self.chunk_tokens),
            ("tensor_parallel", self.tensor_parallel),
            ("pipeline_parallel", self.pipeline_parallel),
        ] {
            if number == 0 {
                return Err(NamespaceError::Missing {
                    field: field.into(),
                });
            }
        }
        if !SUPPORTED_FORMAT_VERSIONS.contains(&self.format_version) {
            return Err(NamespaceError::UnsupportedFormat {
                version: self.format_version,
            });
        }
        if self.chunk_tokens % self.block_tokens != 0 {
            return Err(NamespaceError::ChunkNotBlockAligned {
                chunk_tokens: self.chunk_tokens,
                block_tokens: self.block_tokens,
            });
        }
        Ok(())
    }
}

/// Hashes an optional text with its length, so `("ab", "c")` and `("a", "bc")` differ and
/// `None` differs from `Some("")`.
fn hash_text(hasher: &mut blake3::Hasher, text: Option<&String>) {
    match text {
        None => {
            hasher.update(&[0]);
        }
        Some(text) => {
            hasher.update(&[1]);
            hasher.update(&(text.len() as u64).to_le_bytes());
            hasher.update(text.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn llama() -> NamespaceDescriptor {
        NamespaceDescriptor {
            model: "meta-llama/Llama-3.1-8B-Instruct".into(),
            revision: "0e9e39f".into(),
            adapter: None,
            kv_dtype: KvDtype::BFloat16,
            quantization: None,
            layers: 32,
            kv_heads: 8,
            head_dim: 128,
            block_tokens: 16,
            format_version: 1,
            chunk_tokens: 256,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            salt: None,
        }
    }

    #[test]
    fn equal_descriptors_hash_equal_and_every_field_matters() {
        let base = llama();
        assert_eq!(base.id(), base.clone().id());
        let variants: Vec<NamespaceDescriptor> = vec![
            NamespaceDescriptor {
                model: "other".into(),
                ..llama()
            },
            NamespaceDescriptor {
                revision: "1".into(),
                ..llama()
            },
            NamespaceDescriptor {
                adapter: Some(String::new()),
                ..llama()
            },
            NamespaceDescriptor {
                kv_dtype: KvDtype::Float16,
                ..llama()
            },
            NamespaceDescriptor {
                quantization: Some("fp8".into()),
                ..llama()
            },
            NamespaceDescriptor {
                layers: 31,
                ..llama()
            },
            NamespaceDescriptor {
                kv_heads: 4,
                ..llama()
            },
            NamespaceDescriptor {
                head_dim: 64,
                ..llama()
            },
            NamespaceDescriptor {
                block_tokens: 32,
                ..llama()
            },
            NamespaceDescriptor {
                chunk_tokens: 512,
                ..llama()
            },
            NamespaceDescriptor {
                tensor_parallel: 2,
                ..llama()
            },
            NamespaceDescriptor {
                pipeline_parallel: 2,
                ..llama()
            },
            NamespaceDescriptor {
                salt: Some("tenant".into()),
                ..llama()
            },
        ];
        for variant in variants {
            assert_ne!(base.id().unwrap(), variant.id().unwrap(), "{variant:?}");
        }
    }

    #[test]
    fn incomplete_or_unsupported_descriptors_are_rejected() {
        let cases = [
            (
                NamespaceDescriptor {
                    model: String::new(),
                    ..llama()
                },
                NamespaceError::Missing {
                    field: "model".into(),
                },
            ),
            (
                NamespaceDescriptor {
                    layers: 0,
                    ..llama()
                },
                NamespaceError::Missing {
                    field: "layers".into(),
                },
            ),
            (
                NamespaceDescriptor {
                    format_version: 99,
                    ..llama()
                },
                NamespaceError::UnsupportedFormat { version: 99 },
            ),
            (
                NamespaceDescriptor {
                    chunk_tokens: 100,
                    ..llama()
                },
                NamespaceError::ChunkNotBlockAligned {
                    chunk_tokens: 100,
                    block_tokens: 16,
                },
            ),
            (
                NamespaceDescriptor {
                    adapter: Some("a".repeat(300)),
                    ..llama()
                },
                NamespaceError::TooLong {
                    field: "adapter".into(),
                },
            ),
        ];
        for (descriptor, expected) in cases {
            assert_eq!(descriptor.id(), Err(expected));
        }
    }

    #[test]
    fn chunk_bytes_follow_geometry() {
        assert_eq!(llama().chunk_bytes(), 2 * 32 * 8 * 128 * 256 * 2);
    }
}
