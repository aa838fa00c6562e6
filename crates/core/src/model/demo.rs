//! The namespace of the tools' synthetic model (the demo, the benchmarks, the replay and the
//! tests): one fixed descriptor, so every tool and
//! test that stores chunks under it names the same objects.

use crate::model::{KvDtype, NamespaceDescriptor};

/// The namespace of the synthetic model the demo, the live replay and the benchmarks store
/// their chunks under. Promises: valid (its `id()` succeeds) and the same on every call.
pub fn demo_namespace() -> NamespaceDescriptor {
    NamespaceDescriptor {
        model: "kvtier-demo".into(),
        revision: "1".into(),
        adapter: None,
        kv_dtype: KvDtype::BFloat16,
        quantization: None,
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        block_tokens: 16,
        format_version: 1,
        chunk_tokens: 512,
        tensor_parallel: 1,
        pipeline_parallel: 1,
        salt: None,
    }
}
