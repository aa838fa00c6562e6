//! The object ids a workload names: the prefix chain of a prompt's blocks, as an engine
//! connector names them, and seeded sets of distinct ids for benchmarks.

use anyhow::Context;

use kvtier_core::model::{NamespaceDescriptor, NamespaceId, ObjectId, PrefixDigest};
use kvtier_core::rng::SplitMix64;

/// The object ids of a prompt's blocks in `namespace`, chained from the root: the id of the
/// block at position `i` is determined by `hash_ids[..=i]`, so two prompts share the ids of
/// their common leading blocks and no others (up to 128-bit digest collisions). Shard and
/// part are 0. Pure; one id per hash id, in order.
pub fn chain(namespace: NamespaceId, hash_ids: &[u64]) -> Vec<ObjectId> {
    let mut digest = PrefixDigest::ROOT;
    hash_ids
        .iter()
        .map(|hash_id| {
            digest = digest.chain(&[(*hash_id & 0xffff_ffff) as u32, (*hash_id >> 32) as u32]);
            ObjectId {
                namespace,
                prefix: digest,
                shard: 0,
                part: 0,
            }
        })
        .collect()
}

/// `count` object ids of `namespace` with random prefixes drawn from `seed`: the same seed
/// gives the same ids, distinct up to 128-bit collisions. Fails only when the descriptor is
/// invalid.
pub fn seeded_ids(
    namespace: &NamespaceDescriptor,
    count: u64,
    seed: u64,
) -> anyhow::Result<Vec<ObjectId>> {
    let namespace = namespace.id().context("benchmark namespace")?;
    let mut rng = SplitMix64::new(seed);
    Ok((0..count)
        .map(|_| {
            let mut prefix = [0u8; 16];
            prefix[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
            prefix[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
            ObjectId {
                namespace,
                prefix: PrefixDigest(prefix),
                shard: 0,
                part: 0,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::model::demo_namespace;

    #[test]
    fn prompts_share_the_ids_of_their_common_leading_blocks() {
        let namespace = NamespaceId([3; 16]);
        let first = chain(namespace, &[1, 2, 3]);
        let second = chain(namespace, &[1, 2, 4]);
        let moved = chain(namespace, &[9, 2, 3]);
        assert_eq!(first[..2], second[..2]);
        assert_ne!(first[2], second[2]);
        assert!(first.iter().all(|id| !moved.contains(id)));
        let ids = seeded_ids(&demo_namespace(), 100, 7).unwrap();
        assert_eq!(ids, seeded_ids(&demo_namespace(), 100, 7).unwrap());
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), 100);
    }
}
