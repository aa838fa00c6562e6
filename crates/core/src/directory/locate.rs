//! Where a prompt's prefix is cached, for routers: for each node, the longest leading run of
//! the prompt's chunks it can load without a transfer over the network, and from which
//! tiers.
//!
//! A node can load a chunk without a transfer when a READY replica sits in a memory pool it
//! maps (its own CPU pool, a CXL pool of one of its domains) or on its own SSD (restored
//! into memory first): exactly what a probe from that node would call a hit or "on SSD".
//! The answer is read from the directory's index in one pass over the chunks, stopping at
//! the first chunk no node can load; it reserves nothing and notes no demand (a router asks
//! on behalf of every node, not as a consumer).

use super::load::ReadView;
use super::{Directory, DirectoryError, ProbeOutcome, SessionState};
use crate::model::{Medium, NodeId, ObjectId, SessionId};
use serde::{Deserialize, Serialize};

/// One node's run in a [`Directory::locate`] answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRun {
    /// The node's name, as `cluster.toml` declares it.
    pub node: String,
    /// Leading chunks of the asked prefix this node can load without a network transfer.
    pub chunks: u32,
    /// Of those, how many it would load from its CPU pool, from a CXL pool and from its SSD
    /// (the cheapest replica it can read, as a probe from it would answer).
    pub cpu: u32,
    pub cxl: u32,
    pub ssd: u32,
}

/// One live node while its run lasts.
struct Candidate {
    node: NodeId,
    view: ReadView,
    /// Chunks from the CPU, CXL and SSD tiers.
    counts: [u32; 3],
    running: bool,
}

impl Directory {
    /// Every live node that can load at least the first of `objects` without a transfer,
    /// with its [`NodeRun`], longest run first (ties by name). At most `batch_items_max`
    /// objects, in namespaces the asking session registered (a tenant locates only its own
    /// prefixes); one entry per node at most. Costs one probe per chunk and live node while
    /// that node's run lasts.
    pub fn locate(
        &self,
        session_id: SessionId,
        objects: &[ObjectId],
    ) -> Result<Vec<NodeRun>, DirectoryError> {
        self.locate_in(session_id, objects, |_| self)
    }

    /// [`Directory::locate`] where `owner_of` names the core that holds each object's
    /// replicas (a sharded directory's shard; nodes, sessions and pools are alike in all).
    pub fn locate_in<'a>(
        &self,
        session_id: SessionId,
        objects: &[ObjectId],
        owner_of: impl Fn(&ObjectId) -> &'a Directory,
    ) -> Result<Vec<NodeRun>, DirectoryError> {
        self.check_batch(objects.len())?;
        let session = self.open_session(session_id)?;
        self.check_namespaces(session, objects.iter().map(|object| object.namespace))?;
        let mut candidates: Vec<Candidate> = self
            .nodes
            .iter()
            .filter_map(|record| self.sessions.get(&record.session?))
            .filter(|live| live.state == SessionState::Live)
            .map(|live| Candidate {
                node: live.node,
                view: self.read_view(live),
                counts: [0; 3],
                running: true,
            })
            .collect();
        for object in objects {
            let mut any = false;
            for candidate in candidates.iter_mut().filter(|candidate| candidate.running) {
                let tier = match owner_of(object).probe_one(&candidate.view, object) {
                    ProbeOutcome::Hit { medium, .. } => Some(medium),
                    ProbeOutcome::OnSsd { .. } => Some(Medium::Ssd),
                    ProbeOutcome::Pending | ProbeOutcome::Miss => None,
                };
                match tier {
                    Some(medium) => {
                        candidate.counts[tier_slot(medium)] += 1;
                        any = true;
                    }
                    None => candidate.running = false,
                }
            }
            if !any {
                break;
            }
        }
        let names = self.node_names();
        let mut runs: Vec<NodeRun> = candidates
            .into_iter()
            .filter(|candidate| candidate.counts.iter().any(|count| *count > 0))
            .map(|candidate| {
                let [cpu, cxl, ssd] = candidate.counts;
                NodeRun {
                    node: names
                        .get(candidate.node.0 as usize)
                        .map(|name| name.to_string())
                        .unwrap_or_default(),
                    chunks: cpu + cxl + ssd,
                    cpu,
                    cxl,
                    ssd,
                }
            })
            .collect();
        runs.sort_by(|a, b| b.chunks.cmp(&a.chunks).then_with(|| a.node.cmp(&b.node)));
        Ok(runs)
    }

    /// Each declared node's name, by node id.
    fn node_names(&self) -> Vec<&str> {
        let mut names = vec![""; self.nodes.len()];
        for (name, node) in &self.node_ids {
            if let Some(slot) = names.get_mut(node.0 as usize) {
                *slot = name;
            }
        }
        names
    }
}

fn tier_slot(medium: Medium) -> usize {
    match medium {
        Medium::Cpu => 0,
        Medium::Cxl => 1,
        Medium::Ssd => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Fixture, MIB};
    use super::*;
    use crate::model::DomainId;

    fn run(node: &str, cpu: u32, cxl: u32) -> NodeRun {
        NodeRun {
            node: node.into(),
            chunks: cpu + cxl,
            cpu,
            cxl,
            ssd: 0,
        }
    }

    #[test]
    fn each_node_gets_the_leading_run_it_can_load_without_a_transfer() {
        let mut fixture = Fixture::new();
        fixture.cxl(64 * MIB);
        let a = fixture.node("a", 64 * MIB);
        let b = fixture.node_with(
            "b",
            64 * MIB,
            vec![Medium::Cxl, Medium::Cpu],
            vec![DomainId(0)],
        );
        let c = fixture.node_with("c", 64 * MIB, vec![Medium::Cpu], vec![DomainId(1)]);
        let objects: Vec<ObjectId> = (0..5).map(|index| fixture.object(index)).collect();
        // a holds 0..3 in its CPU pool; b wrote 3 into the CXL pool of domain 0; 4 is nowhere.
        for object in &objects[..3] {
            fixture.store(&a, *object, MIB);
        }
        fixture.store(&b, objects[3], MIB);
        let located = fixture.directory.locate(c.session, &objects).unwrap();
        // c (domain 1) maps neither a's CPU pool nor domain 0's CXL pool: it is left out.
        assert_eq!(located, vec![run("a", 3, 1)]);
        // From the CXL chunk first, b's run is one chunk: a's CPU pool is not b's.
        let located = fixture
            .directory
            .locate(a.session, &[objects[3], objects[0], objects[1]])
            .unwrap();
        assert_eq!(located, vec![run("a", 2, 1), run("b", 0, 1)]);
        // A prefix whose first chunk nobody holds has no run anywhere.
        assert!(fixture
            .directory
            .locate(a.session, &objects[4..])
            .unwrap()
            .is_empty());
        assert!(fixture.directory.locate(a.session, &[]).unwrap().is_empty());
    }

    #[test]
    fn a_locate_is_bounded_and_limited_to_the_askers_namespaces() {
        let mut fixture = Fixture::new();
        let a = fixture.node("a", 64 * MIB);
        let max = fixture.directory.config.batch_items_max as usize;
        let too_many = vec![fixture.object(0); max + 1];
        assert!(matches!(
            fixture.directory.locate(a.session, &too_many),
            Err(DirectoryError::BatchTooLarge { .. })
        ));
        let mut foreign = fixture.object(0);
        foreign.namespace = crate::model::NamespaceId([7; 16]);
        assert!(fixture.directory.locate(a.session, &[foreign]).is_err());
    }
}
