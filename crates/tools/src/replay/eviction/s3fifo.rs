//! S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO with a 2-bit
//! frequency and reinsertion, and a ghost FIFO of ids recently evicted from the small
//! queue; a ghost hit enters the main queue directly.

use std::collections::{HashMap, HashSet, VecDeque};

use super::{Access, Eviction};
use kvtier_core::policy::history::History;
use kvtier_core::policy::BlockId;

/// Share of the capacity given to the small queue, in percent (the paper's 10%).
const SMALL_PERCENT: usize = 10;
/// Frequency saturates here (the paper's 2 bits).
const FREQUENCY_MAX: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    queue: Queue,
    frequency: u8,
    /// Distinguishes this entry from stale queue slots left by `remove`.
    stamp: u64,
}

/// S3-FIFO over blocks. Queues hold `(block, stamp)`; a slot whose stamp no longer matches
/// the entry is stale and skipped, so `remove` is O(1). Stale slots are bounded by the
/// number of removes since they are popped.
#[derive(Debug)]
pub struct S3Fifo {
    capacity: usize,
    small_target: usize,
    stamp: u64,
    entries: HashMap<BlockId, Entry>,
    small: VecDeque<(BlockId, u64)>,
    main: VecDeque<(BlockId, u64)>,
    small_len: usize,
    ghost: VecDeque<BlockId>,
    ghost_set: HashSet<BlockId>,
}

impl S3Fifo {
    /// An empty S3-FIFO holding at most `capacity` blocks; its ghost remembers as many ids
    /// as the main queue holds.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            small_target: (capacity * SMALL_PERCENT / 100).max(1),
            stamp: 0,
            entries: HashMap::new(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_len: 0,
            ghost: VecDeque::new(),
            ghost_set: HashSet::new(),
        }
    }

    fn push(&mut self, block: BlockId, queue: Queue, frequency: u8) {
        self.stamp += 1;
        self.entries.insert(
            block,
            Entry {
                queue,
                frequency,
                stamp: self.stamp,
            },
        );
        match queue {
            Queue::Small => {
                self.small.push_back((block, self.stamp));
                self.small_len += 1;
            }
            Queue::Main => self.main.push_back((block, self.stamp)),
        }
    }

    fn remember_ghost(&mut self, block: BlockId) {
        let ghost_max = self.capacity - self.small_target.min(self.capacity);
        if ghost_max == 0 {
            return;
        }
        while self.ghost.len() >= ghost_max {
            if let Some(old) = self.ghost.pop_front() {
                self.ghost_set.remove(&old);
            }
        }
        if self.ghost_set.insert(block) {
            self.ghost.push_back(block);
        }
    }

    /// Pops the live entry at the head of `queue`, skipping stale slots.
    fn pop_live(&mut self, queue: Queue) -> Option<(BlockId, Entry)> {
        loop {
            let slot = match queue {
                Queue::Small => self.small.pop_front(),
                Queue::Main => self.main.pop_front(),
            };
            let (block, stamp) = slot?;
            if let Some(entry) = self.entries.get(&block).copied() {
                if entry.stamp == stamp {
                    if queue == Queue::Small {
                        self.small_len -= 1;
                    }
                    return Some((block, entry));
                }
            }
        }
    }

    fn evict_small(&mut self) -> Option<BlockId> {
        while let Some((block, entry)) = self.pop_live(Queue::Small) {
            if entry.frequency > 0 {
                self.push(block, Queue::Main, 0);
            } else {
                self.entries.remove(&block);
                self.remember_ghost(block);
                return Some(block);
            }
        }
        None
    }

    fn evict_main(&mut self) -> Option<BlockId> {
        // Each pass lowers a frequency or evicts, so this ends within 4 * len pops.
        while let Some((block, entry)) = self.pop_live(Queue::Main) {
            if entry.frequency > 0 {
                self.push(block, Queue::Main, entry.frequency - 1);
            } else {
                self.entries.remove(&block);
                return Some(block);
            }
        }
        None
    }
}

impl Eviction for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    /// S3-FIFO admits everything (the small queue is its filter).
    fn admit(&self, _access: &Access, _now_ms: u64, _history: &History) -> bool {
        self.capacity > 0
    }

    fn insert(&mut self, access: &Access) {
        let queue = if self.ghost_set.remove(&access.block) {
            Queue::Main
        } else {
            Queue::Small
        };
        self.push(access.block, queue, 0);
    }

    fn touch(&mut self, access: &Access) {
        if let Some(entry) = self.entries.get_mut(&access.block) {
            entry.frequency = (entry.frequency + 1).min(FREQUENCY_MAX);
        }
    }

    fn evict(&mut self, _now_ms: u64, _history: &History) -> Option<BlockId> {
        if self.small_len >= self.small_target || self.entries.len() == self.small_len {
            if let Some(block) = self.evict_small() {
                return Some(block);
            }
        }
        self.evict_main().or_else(|| self.evict_small())
    }

    fn remove(&mut self, block: BlockId) -> bool {
        match self.entries.remove(&block) {
            Some(entry) => {
                if entry.queue == Queue::Small {
                    self.small_len -= 1;
                }
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::eviction::tests::{access, contract};

    #[test]
    fn contract_holds() {
        contract(Box::new(S3Fifo::new(2)));
    }

    #[test]
    fn one_hit_wonders_leave_and_reused_blocks_stay() {
        let history = History::new();
        let mut cache = S3Fifo::new(10);
        for block in 0..10 {
            cache.insert(&access(block, 0));
        }
        cache.touch(&access(0, 1));
        // Block 0 was reused in the small queue: it moves to main; the others go.
        let victims: Vec<_> = (0..9).filter_map(|_| cache.evict(2, &history)).collect();
        assert!(!victims.contains(&0), "{victims:?}");
        assert_eq!(cache.len(), 1);
        // A ghost hit enters main directly.
        cache.insert(&access(5, 3));
        assert_eq!(
            cache.entries.get(&5).map(|entry| entry.queue),
            Some(Queue::Main)
        );
    }
}
