//! Verified transfers of a prompt's chunks through a client, as the demo and the live
//! replay run them: load the cached leading run into poisoned buffers and check every byte
//! against its object's content ([`super::chunk`]); store the rest with that content.

use anyhow::Context;

use super::chunk;
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::ProbeOutcome;
use kvtier_core::model::ObjectId;

/// Reusable destinations a prompt's cached chunks are loaded into, one per position.
///
/// They are kept across requests (allocating a prompt's worth per request would dominate
/// the demo's time), which is why each load poisons them first: a buffer still holding the
/// right bytes from an earlier request must not pass for a load that copied nothing. They
/// grow to the longest cached run, at most a trace's `HASH_IDS_MAX` chunks.
pub struct PrefixBuffers {
    chunk_bytes: usize,
    chunks: Vec<Vec<u8>>,
}

impl PrefixBuffers {
    /// No buffers yet; each will hold `chunk_bytes`.
    pub fn new(chunk_bytes: usize) -> Self {
        Self {
            chunk_bytes,
            chunks: Vec::new(),
        }
    }

    /// The destinations of a load of `objects`, one per object in order, each poisoned
    /// against its object ([`chunk::poison`]): until the load writes every byte of one, it
    /// fails [`PrefixBuffers::verify`].
    pub fn poisoned_targets(&mut self, objects: &[ObjectId]) -> Vec<&mut [u8]> {
        while self.chunks.len() < objects.len() {
            self.chunks.push(vec![0u8; self.chunk_bytes]);
        }
        self.chunks
            .iter_mut()
            .zip(objects)
            .map(|(buffer, object)| {
                chunk::poison(object, buffer);
                buffer.as_mut_slice()
            })
            .collect()
    }

    /// Checks that the buffers of the first `objects.len()` positions hold the content of
    /// `objects`; fails naming the first position and byte that differ. The caller passes
    /// only the objects the load reported as copied, after [`PrefixBuffers::poisoned_targets`]
    /// of at least as many.
    pub fn verify(&self, objects: &[ObjectId]) -> anyhow::Result<()> {
        anyhow::ensure!(
            objects.len() <= self.chunks.len(),
            "{} chunks to verify, {} buffers",
            objects.len(),
            self.chunks.len()
        );
        for (position, (object, buffer)) in objects.iter().zip(&self.chunks).enumerate() {
            chunk::verify(object, buffer)
                .with_context(|| format!("chunk {position} of the prefix loaded wrong bytes"))?;
        }
        Ok(())
    }
}

/// Probes a prompt's chunks, loads the leading run that is cached (in memory, or on the
/// node's SSD: the load restores it first, as an engine's would) into poisoned buffers and
/// checks every byte against its object's content. Returns the probe's outcomes and how many
/// chunks loaded (a replica retired between probe and acquire shortens the run: an expected
/// miss). Fails on a wrong or unwritten byte or a refused request.
pub async fn load_cached_prefix(
    client: &Client,
    objects: &[ObjectId],
    buffers: &mut PrefixBuffers,
) -> anyhow::Result<(Vec<ProbeOutcome>, usize)> {
    let probed = client.probe(objects).await?;
    let hits = probed
        .iter()
        .take_while(|outcome| {
            matches!(
                outcome,
                ProbeOutcome::Hit { .. } | ProbeOutcome::OnSsd { .. }
            )
        })
        .count();
    let mut targets = buffers.poisoned_targets(&objects[..hits]);
    let loaded = client
        .load_into(&objects[..hits], &mut targets)
        .await
        .context("loading a prefix")?;
    let loaded = loaded.iter().take_while(|hit| **hit).count();
    buffers.verify(&objects[..loaded])?;
    Ok((probed, loaded))
}

/// Stores the chunks of `objects`, `chunk_bytes` of each one's content, pipelined, in
/// order; one outcome per object.
pub async fn store_chunks(
    client: &Client,
    objects: &[ObjectId],
    chunk_bytes: usize,
) -> anyhow::Result<Vec<StoreOutcome>> {
    let chunks: Vec<Vec<u8>> = objects
        .iter()
        .map(|object| {
            let mut bytes = vec![0u8; chunk_bytes];
            chunk::fill(object, &mut bytes);
            bytes
        })
        .collect();
    let items: Vec<(ObjectId, &[u8])> = objects
        .iter()
        .copied()
        .zip(chunks.iter().map(Vec::as_slice))
        .collect();
    client
        .store_many(&items)
        .await
        .into_iter()
        .map(|outcome| outcome.context("storing a chunk"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::prefix::chain;
    use kvtier_core::model::NamespaceId;

    const CHUNK_BYTES: usize = 4096;

    /// What `load_cached_prefix` does around the client's copy, with the copy either done
    /// (`copy`) or skipped, as a broken load path would.
    fn load(buffers: &mut PrefixBuffers, objects: &[ObjectId], copy: bool) -> anyhow::Result<()> {
        let targets = buffers.poisoned_targets(objects);
        if copy {
            for (object, target) in objects.iter().zip(targets) {
                chunk::fill(object, target);
            }
        }
        buffers.verify(objects)
    }

    #[test]
    fn a_load_that_copies_nothing_fails_verification() {
        let namespace = NamespaceId([1; 16]);
        // Two consecutive requests sharing their first block, as 99.99% of the trace's do.
        let first = chain(namespace, &[10, 11]);
        let second = chain(namespace, &[10, 12]);
        let mut buffers = PrefixBuffers::new(CHUNK_BYTES);
        load(&mut buffers, &first, true).unwrap();
        // The buffer of position 0 still holds the right bytes for the second request's
        // first block: without poisoning, a skipped copy would pass.
        assert!(chunk::verify(&second[0], &buffers.chunks[0]).is_ok());
        let error = load(&mut buffers, &second[..1], false).unwrap_err();
        assert!(format!("{error:#}").contains("chunk 0"), "{error:#}");
        // A copy that skips only the second position is caught there.
        let targets = buffers.poisoned_targets(&second);
        chunk::fill(&second[0], targets.into_iter().next().unwrap());
        let error = buffers.verify(&second).unwrap_err();
        assert!(format!("{error:#}").contains("chunk 1"), "{error:#}");
        // The same request with the copy done passes.
        load(&mut buffers, &second, true).unwrap();
    }

    #[test]
    fn a_load_of_another_chunk_fails_verification() {
        let objects = chain(NamespaceId([2; 16]), &[1, 2]);
        let mut buffers = PrefixBuffers::new(CHUNK_BYTES);
        let targets = buffers.poisoned_targets(&objects);
        for (object, target) in objects.iter().rev().zip(targets) {
            chunk::fill(object, target);
        }
        assert!(buffers.verify(&objects).is_err());
        assert!(buffers.verify(&objects[..0]).is_ok());
        assert!(buffers
            .verify(&chain(NamespaceId([2; 16]), &[1, 2, 3]))
            .is_err());
    }
}
