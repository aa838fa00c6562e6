//! The page allocator of a byte-addressable pool: a sans-I/O core (no file, no clock, no
//! lock) that owns which pages of a pool's data area are free and which allocation holds
//! each used page. The backends wrap it with the mapping and a lock.
//!
//! Design: a free-extent map keyed by first page (`BTreeMap<first, count>`) plus a size
//! index (`BTreeSet<(count, first)>`). An allocation takes the smallest free run that fits
//! (best fit, lowest offset on ties), so its pages are contiguous and one `memcpy` or one
//! DMA moves a whole object; a free merges with both neighbours, so freeing everything
//! always leaves a single run. Both are `O(log n)` in the number of free runs, which is at
//! most one more than the number of live allocations and so bounded by `allocations_max`.
//! A buddy allocator would round every object up to a power of two (KV chunks are rarely
//! one: up to ~50% waste), and a bitmap needs a linear scan to find a run; the extent map
//! has neither cost and its state is small enough to check completely in tests.
//!
//! Identity: an `AllocationId` is a slot of a bounded table; each time a slot is handed out
//! its `Generation` grows, so a location kept after a free never validates against the
//! slot's next occupant (invariant 5 of docs/design.md).

use super::error::PoolError;
use crate::model::{AllocationId, Generation};
use std::collections::{BTreeMap, BTreeSet};

/// A contiguous run of pages handed out by [`PageAllocator::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The slot in the allocation table.
    pub id: AllocationId,
    /// The slot's generation for this occupancy; a location must carry it to be valid.
    pub generation: Generation,
    /// First byte, relative to the pool's data area; a multiple of the page size.
    pub offset: u64,
    /// The length the caller asked for.
    pub length_bytes: u64,
    /// The length rounded up to whole pages; what the pool's usage counts.
    pub allocated_bytes: u64,
}

/// A pool's usage at one instant, in bytes. `allocated_bytes + free_bytes == capacity_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorUsage {
    /// Size of the data area.
    pub capacity_bytes: u64,
    /// Bytes held by live allocations (page-rounded).
    pub allocated_bytes: u64,
    /// Bytes in free runs.
    pub free_bytes: u64,
    /// The longest contiguous free run: the largest allocation that would succeed now.
    pub largest_free_run_bytes: u64,
    /// Live allocations, at most the allocator's `allocations_max`.
    pub allocation_count: u32,
}

/// One slot of the allocation table.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// The generation of the slot's latest occupancy (0: never handed out).
    generation: Generation,
    /// The pages the slot holds, or `None` while the slot is free.
    live: Option<Extent>,
}

/// The pages of a live allocation.
#[derive(Clone, Copy, Debug)]
struct Extent {
    first_page: u64,
    page_count: u64,
    length_bytes: u64,
}

/// Allocates contiguous runs of pages in a data area of `capacity_bytes`. Never hands out a
/// page twice, never more than the capacity, never more than `allocations_max` live
/// allocations; every refusal is a typed [`PoolError`]. Not thread-safe by itself: a backend
/// holds it behind one lock.
#[derive(Debug)]
pub struct PageAllocator {
    page_bytes: u64,
    capacity_pages: u64,
    /// Pages held by live allocations; kept apart from `free_pages` so that each
    /// operation can assert the pair sums to the capacity.
    allocated_pages: u64,
    /// Pages in free runs, maintained by `insert_free_run` and `remove_free_run`.
    free_pages: u64,
    allocations_max: u32,
    /// Free runs: first page -> page count. Never empty runs, never two adjacent runs.
    free_by_first_page: BTreeMap<u64, u64>,
    /// The same runs as `(page count, first page)`, for best fit.
    free_by_page_count: BTreeSet<(u64, u64)>,
    /// The allocation table; grows on demand up to `allocations_max` slots.
    slots: Vec<Slot>,
    /// Indexes of free slots in `slots`; reused before the table grows.
    free_slots: Vec<u32>,
}

impl PageAllocator {
    /// An allocator with every page free. `page_bytes` must be a power of two,
    /// `capacity_bytes` a positive multiple of it, and `allocations_max` positive; otherwise
    /// `InvalidConfig`. Memory grows with the number of live allocations, not the capacity.
    pub fn new(
        capacity_bytes: u64,
        page_bytes: u64,
        allocations_max: u32,
    ) -> Result<Self, PoolError> {
        if !page_bytes.is_power_of_two() {
            return Err(PoolError::InvalidConfig {
                reason: "page size must be a power of two",
            });
        }
        if capacity_bytes == 0 || capacity_bytes % page_bytes != 0 {
            return Err(PoolError::InvalidConfig {
                reason: "capacity must be a positive multiple of the page size",
            });
        }
        if allocations_max == 0 {
            return Err(PoolError::InvalidConfig {
                reason: "allocations_max must be positive",
            });
        }
        let capacity_pages = capacity_bytes / page_bytes;
        let mut allocator = Self {
            page_bytes,
            capacity_pages,
            allocated_pages: 0,
            free_pages: 0,
            allocations_max,
            free_by_first_page: BTreeMap::new(),
            free_by_page_count: BTreeSet::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
        };
        allocator.insert_free_run(0, capacity_pages);
        allocator.assert_page_balance();
        Ok(allocator)
    }

    /// The allocation granule, in bytes.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// The size of the data area this allocator manages.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_pages * self.page_bytes
    }

    /// Current usage; `O(log n)`.
    pub fn usage(&self) -> AllocatorUsage {
        let largest_free_run_pages = self
            .free_by_page_count
            .last()
            .map_or(0, |(page_count, _)| *page_count);
        AllocatorUsage {
            capacity_bytes: self.capacity_bytes(),
            allocated_bytes: self.allocated_pages * self.page_bytes,
            free_bytes: self.free_pages * self.page_bytes,
            largest_free_run_bytes: largest_free_run_pages * self.page_bytes,
            allocation_count: self.allocation_count(),
        }
    }

    /// Hands out the smallest free run of whole pages that holds `length_bytes`. Errors:
    /// `InvalidLength` for zero, `TooManyAllocations` when the table is full, `Full` when no
    /// run is long enough. On error nothing changed.
    pub fn allocate(&mut self, length_bytes: u64) -> Result<Allocation, PoolError> {
        if length_bytes == 0 {
            return Err(PoolError::InvalidLength { length_bytes });
        }
        if self.free_slots.is_empty() && self.slots.len() >= self.allocations_max as usize {
            return Err(PoolError::TooManyAllocations {
                allocations_max: self.allocations_max,
            });
        }
        let page_count = length_bytes.div_ceil(self.page_bytes);
        let Some(&(run_pages, first_page)) =
            self.free_by_page_count.range((page_count, 0)..).next()
        else {
            let usage = self.usage();
            return Err(PoolError::Full {
                requested_bytes: page_count.saturating_mul(self.page_bytes),
                free_bytes: usage.free_bytes,
                largest_free_run_bytes: usage.largest_free_run_bytes,
            });
        };
        self.remove_free_run(first_page, run_pages);
        if run_pages > page_count {
            self.insert_free_run(first_page + page_count, run_pages - page_count);
        }
        let extent = Extent {
            first_page,
            page_count,
            length_bytes,
        };
        let (index, generation) = self.occupy_slot(extent);
        self.allocated_pages += page_count;
        self.assert_page_balance();
        Ok(Allocation {
            id: AllocationId(u64::from(index)),
            generation,
            offset: first_page * self.page_bytes,
            length_bytes,
            allocated_bytes: page_count * self.page_bytes,
        })
    }

    /// Returns the allocation's pages to the free runs and frees its slot; returns the bytes
    /// freed (page-rounded). Refuses a stale generation (`StaleGeneration`) and anything not
    /// live (`UnknownAllocation`, which is also the answer to a repeated free). On error
    /// nothing changed.
    pub fn free(&mut self, id: AllocationId, generation: Generation) -> Result<u64, PoolError> {
        let extent = self.live_extent(id, generation)?;
        // `live_extent` proved the index is in the table, so it fits in u32.
        let index = id.0 as usize;
        self.slots[index].live = None;
        self.free_slots.push(id.0 as u32);
        assert!(self.allocated_pages >= extent.page_count);
        self.allocated_pages -= extent.page_count;
        self.insert_free_run(extent.first_page, extent.page_count);
        self.assert_page_balance();
        Ok(extent.page_count * self.page_bytes)
    }

    /// Validates a location before a read or write: the allocation is live under this
    /// generation and `offset..offset + length_bytes` (data-area relative) lies within its
    /// requested length. Changes nothing.
    pub fn check(
        &self,
        id: AllocationId,
        generation: Generation,
        offset: u64,
        length_bytes: u64,
    ) -> Result<(), PoolError> {
        let extent = self.live_extent(id, generation)?;
        let start = extent.first_page * self.page_bytes;
        let limit_bytes = start + extent.length_bytes;
        let within = offset >= start
            && offset
                .checked_add(length_bytes)
                .is_some_and(|end| end <= limit_bytes);
        if within {
            Ok(())
        } else {
            Err(PoolError::OutOfBounds {
                offset,
                length_bytes,
                limit_bytes,
            })
        }
    }

    /// Checks every structural invariant and panics on the first violation (a bug, in
    /// release builds too): free runs and live allocations tile the data area exactly (no
    /// overlap, no leak), free runs are coalesced and mirrored in the size index, the usage
    /// counter matches, and the table is within its bound. `O(n log n)`; meant for tests and
    /// simulation steps, not the hot path.
    pub fn check_invariants(&self) {
        assert_eq!(self.free_by_first_page.len(), self.free_by_page_count.len());
        for (&first_page, &page_count) in &self.free_by_first_page {
            assert!(page_count > 0, "empty free run at page {first_page}");
            assert!(self.free_by_page_count.contains(&(page_count, first_page)));
        }
        assert!(self.slots.len() <= self.allocations_max as usize);
        let live: Vec<Extent> = self.slots.iter().filter_map(|slot| slot.live).collect();
        assert_eq!(live.len() + self.free_slots.len(), self.slots.len());
        for &index in &self.free_slots {
            assert!(self.slots[index as usize].live.is_none());
        }
        let live_pages: u64 = live.iter().map(|extent| extent.page_count).sum();
        assert_eq!(live_pages, self.allocated_pages);
        let free_run_pages: u64 = self.free_by_first_page.values().sum();
        assert_eq!(free_run_pages, self.free_pages);
        self.assert_page_balance();

        // (first page, page count, is free), sorted: must tile 0..capacity_pages.
        let mut runs: Vec<(u64, u64, bool)> = live
            .iter()
            .map(|extent| (extent.first_page, extent.page_count, false))
            .chain(self.free_by_first_page.iter().map(|(&f, &c)| (f, c, true)))
            .collect();
        runs.sort_unstable();
        let mut next_page = 0;
        let mut previous_free = false;
        for (first_page, page_count, free) in runs {
            assert_eq!(first_page, next_page, "gap or overlap at page {first_page}");
            assert!(
                !(free && previous_free),
                "uncoalesced free runs at page {first_page}"
            );
            next_page = first_page + page_count;
            previous_free = free;
        }
        assert_eq!(
            next_page, self.capacity_pages,
            "runs do not cover the capacity"
        );
    }

    /// The cheap paired check run after every operation, in release builds too: free and
    /// allocated pages, counted independently, add up to the capacity.
    fn assert_page_balance(&self) {
        assert_eq!(
            self.free_pages + self.allocated_pages,
            self.capacity_pages,
            "free + allocated pages differ from the capacity"
        );
    }

    fn allocation_count(&self) -> u32 {
        // The table holds at most `allocations_max: u32` slots.
        (self.slots.len() - self.free_slots.len()) as u32
    }

    /// The live extent of `(id, generation)`, or why there is none.
    fn live_extent(&self, id: AllocationId, generation: Generation) -> Result<Extent, PoolError> {
        let unknown = PoolError::UnknownAllocation { id, generation };
        let Some(slot) = usize::try_from(id.0).ok().and_then(|i| self.slots.get(i)) else {
            return Err(unknown);
        };
        if generation < slot.generation {
            return Err(PoolError::StaleGeneration {
                id,
                found: generation,
                current: slot.generation,
            });
        }
        match slot.live {
            Some(extent) if generation == slot.generation => Ok(extent),
            _ => Err(unknown),
        }
    }

    /// Puts `extent` in a free slot (reused first, else a new one; the caller checked the
    /// bound) and returns the slot index and its new generation.
    fn occupy_slot(&mut self, extent: Extent) -> (u32, Generation) {
        let index = match self.free_slots.pop() {
            Some(index) => index,
            None => {
                assert!(self.slots.len() < self.allocations_max as usize);
                self.slots.push(Slot {
                    generation: Generation(0),
                    live: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        assert!(slot.live.is_none(), "slot {index} handed out twice");
        slot.generation = Generation(slot.generation.0 + 1);
        slot.live = Some(extent);
        (index, slot.generation)
    }

    /// Adds a free run, merging it with the runs that end where it starts and start where
    /// it ends. Panics if it overlaps a free run (a double free the table did not catch).
    fn insert_free_run(&mut self, mut first_page: u64, mut page_count: u64) {
        assert!(page_count > 0 && first_page + page_count <= self.capacity_pages);
        let before = self.free_by_first_page.range(..first_page).next_back();
        if let Some((&before_first, &before_count)) = before {
            assert!(
                before_first + before_count <= first_page,
                "free run overlap"
            );
            if before_first + before_count == first_page {
                self.remove_free_run(before_first, before_count);
                first_page = before_first;
                page_count += before_count;
            }
        }
        let after = self.free_by_first_page.range(first_page..).next();
        if let Some((&after_first, &after_count)) = after {
            assert!(first_page + page_count <= after_first, "free run overlap");
            if first_page + page_count == after_first {
                self.remove_free_run(after_first, after_count);
                page_count += after_count;
            }
        }
        self.free_by_first_page.insert(first_page, page_count);
        self.free_by_page_count.insert((page_count, first_page));
        self.free_pages += page_count;
    }

    fn remove_free_run(&mut self, first_page: u64, page_count: u64) {
        let removed_count = self.free_by_first_page.remove(&first_page);
        assert_eq!(removed_count, Some(page_count));
        assert!(self.free_by_page_count.remove(&(page_count, first_page)));
        self.free_pages -= page_count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PAGE: u64 = 4096;

    fn allocator(pages: u64, allocations_max: u32) -> PageAllocator {
        PageAllocator::new(pages * PAGE, PAGE, allocations_max).unwrap()
    }

    #[test]
    fn invalid_configurations_are_refused() {
        let rows: [(u64, u64, u32); 5] = [
            (0, PAGE, 8),            // empty pool
            (PAGE * 4, 3000, 8),     // page not a power of two
            (PAGE * 4, 0, 8),        // zero page
            (PAGE * 4 + 1, PAGE, 8), // capacity not page-aligned
            (PAGE * 4, PAGE, 0),     // no allocation slot
        ];
        for (capacity_bytes, page_bytes, allocations_max) in rows {
            let result = PageAllocator::new(capacity_bytes, page_bytes, allocations_max);
            assert!(
                matches!(result, Err(PoolError::InvalidConfig { .. })),
                "{capacity_bytes} {page_bytes} {allocations_max}: {result:?}"
            );
        }
    }

    #[test]
    fn sizes_round_to_pages_and_fill_exactly() {
        let mut pool = allocator(4, 8);
        let first = pool.allocate(1).unwrap();
        assert_eq!(
            (first.offset, first.length_bytes, first.allocated_bytes),
            (0, 1, PAGE)
        );
        let rest = pool.allocate(3 * PAGE).unwrap();
        assert_eq!(rest.offset, PAGE);
        assert_eq!(pool.usage().free_bytes, 0);
        // Exactly full: even one byte more is refused.
        assert!(matches!(pool.allocate(1), Err(PoolError::Full { .. })));
        pool.check_invariants();
    }

    #[test]
    fn one_byte_over_capacity_is_full_and_zero_is_invalid() {
        let mut pool = allocator(4, 8);
        let result = pool.allocate(4 * PAGE + 1);
        assert!(matches!(
            result,
            Err(PoolError::Full { requested_bytes, free_bytes, largest_free_run_bytes })
                if requested_bytes == 5 * PAGE && free_bytes == 4 * PAGE
                    && largest_free_run_bytes == 4 * PAGE
        ));
        assert!(matches!(
            pool.allocate(0),
            Err(PoolError::InvalidLength { length_bytes: 0 })
        ));
        assert!(matches!(
            pool.allocate(u64::MAX),
            Err(PoolError::Full { .. })
        ));
        pool.check_invariants();
    }

    #[test]
    fn fragmented_free_space_is_full_for_a_long_run() {
        let mut pool = allocator(4, 8);
        let allocations: Vec<Allocation> = (0..4).map(|_| pool.allocate(PAGE).unwrap()).collect();
        pool.free(allocations[0].id, allocations[0].generation)
            .unwrap();
        pool.free(allocations[2].id, allocations[2].generation)
            .unwrap();
        let result = pool.allocate(2 * PAGE);
        assert!(matches!(
            result,
            Err(PoolError::Full { free_bytes, largest_free_run_bytes, .. })
                if free_bytes == 2 * PAGE && largest_free_run_bytes == PAGE
        ));
        // Freeing the page between the holes coalesces three runs into one.
        pool.free(allocations[1].id, allocations[1].generation)
            .unwrap();
        assert_eq!(pool.usage().largest_free_run_bytes, 3 * PAGE);
        assert_eq!(pool.allocate(3 * PAGE).unwrap().offset, 0);
        pool.check_invariants();
    }

    #[test]
    fn best_fit_keeps_long_runs() {
        let mut pool = allocator(8, 8);
        let a = pool.allocate(PAGE).unwrap();
        let _b = pool.allocate(PAGE).unwrap();
        let c = pool.allocate(3 * PAGE).unwrap();
        let _d = pool.allocate(PAGE).unwrap();
        pool.free(a.id, a.generation).unwrap(); // 1-page hole at 0
        pool.free(c.id, c.generation).unwrap(); // 3-page hole at 2, 2-page tail at 6
        let small = pool.allocate(PAGE).unwrap();
        assert_eq!(small.offset, 0, "one page goes to the one-page hole");
        let two = pool.allocate(2 * PAGE).unwrap();
        assert_eq!(two.offset, 6 * PAGE, "two pages go to the two-page tail");
        assert_eq!(pool.usage().largest_free_run_bytes, 3 * PAGE);
        pool.check_invariants();
    }

    #[test]
    fn table_bound_and_generations() {
        let mut pool = allocator(8, 2);
        let a = pool.allocate(PAGE).unwrap();
        let _b = pool.allocate(PAGE).unwrap();
        assert!(matches!(
            pool.allocate(PAGE),
            Err(PoolError::TooManyAllocations { allocations_max: 2 })
        ));
        assert_eq!(pool.free(a.id, a.generation).unwrap(), PAGE);
        // Repeated free: the slot is free, same generation.
        assert!(matches!(
            pool.free(a.id, a.generation),
            Err(PoolError::UnknownAllocation { .. })
        ));
        let reused = pool.allocate(2 * PAGE).unwrap();
        assert_eq!(reused.id, a.id);
        assert_eq!(reused.generation, Generation(a.generation.0 + 1));
        assert!(matches!(
            pool.check(a.id, a.generation, a.offset, 1),
            Err(PoolError::StaleGeneration { .. })
        ));
        assert!(matches!(
            pool.free(a.id, a.generation),
            Err(PoolError::StaleGeneration { .. })
        ));
        let future = Generation(reused.generation.0 + 1);
        assert!(matches!(
            pool.free(reused.id, future),
            Err(PoolError::UnknownAllocation { .. })
        ));
        assert!(matches!(
            pool.free(AllocationId(99), Generation(1)),
            Err(PoolError::UnknownAllocation { .. })
        ));
        pool.check_invariants();
    }

    #[test]
    fn check_bounds_a_range_by_the_requested_length() {
        let mut pool = allocator(4, 4);
        let _first = pool.allocate(PAGE).unwrap();
        let a = pool.allocate(100).unwrap();
        let (id, generation) = (a.id, a.generation);
        pool.check(id, generation, a.offset, 100).unwrap();
        pool.check(id, generation, a.offset + 40, 60).unwrap();
        let rows = [
            (a.offset, 101),           // past the requested length
            (a.offset - 1, 1),         // before the allocation
            (a.offset + 50, u64::MAX), // overflowing end
        ];
        for (offset, length) in rows {
            assert!(matches!(
                pool.check(id, generation, offset, length),
                Err(PoolError::OutOfBounds { .. })
            ));
        }
    }

    #[derive(Clone, Debug)]
    enum Operation {
        Allocate(u64),
        Free(usize),
        FreeStale(usize),
    }

    fn operation(capacity_bytes: u64) -> impl Strategy<Value = Operation> {
        prop_oneof![
            3 => (1..=capacity_bytes).prop_map(Operation::Allocate),
            2 => any::<usize>().prop_map(Operation::Free),
            1 => any::<usize>().prop_map(Operation::FreeStale),
        ]
    }

    proptest! {
        #[test]
        fn random_sequences_keep_every_invariant(
            operations in proptest::collection::vec(operation(64 * 512), 1..200)
        ) {
            const SMALL_PAGE: u64 = 512;
            let mut pool = PageAllocator::new(64 * SMALL_PAGE, SMALL_PAGE, 16).unwrap();
            let mut live: Vec<Allocation> = Vec::new();
            let mut freed: Vec<Allocation> = Vec::new();
            for operation in operations {
                match operation {
                    Operation::Allocate(length_bytes) => match pool.allocate(length_bytes) {
                        Ok(allocation) => {
                            prop_assert!(allocation.offset + allocation.allocated_bytes
                                <= pool.capacity_bytes());
                            prop_assert_eq!(allocation.offset % SMALL_PAGE, 0);
                            prop_assert!(allocation.allocated_bytes >= length_bytes);
                            prop_assert!(allocation.allocated_bytes - length_bytes < SMALL_PAGE);
                            live.push(allocation);
                        }
                        Err(PoolError::Full { largest_free_run_bytes, .. }) => {
                            prop_assert!(largest_free_run_bytes < length_bytes);
                        }
                        Err(PoolError::TooManyAllocations { .. }) => {
                            prop_assert_eq!(live.len(), 16);
                        }
                        Err(other) => prop_assert!(false, "unexpected {other:?}"),
                    },
                    Operation::Free(pick) if !live.is_empty() => {
                        let allocation = live.swap_remove(pick % live.len());
                        let freed_bytes = pool.free(allocation.id, allocation.generation)?;
                        prop_assert_eq!(freed_bytes, allocation.allocated_bytes);
                        freed.push(allocation);
                    }
                    Operation::FreeStale(pick) if !freed.is_empty() => {
                        let old = freed[pick % freed.len()];
                        prop_assert!(pool.free(old.id, old.generation).is_err());
                        prop_assert!(pool.check(old.id, old.generation, old.offset, 1).is_err());
                    }
                    Operation::Free(_) | Operation::FreeStale(_) => {}
                }
                pool.check_invariants();
                let usage = pool.usage();
                let live_bytes: u64 = live.iter().map(|a| a.allocated_bytes).sum();
                prop_assert_eq!(usage.allocated_bytes, live_bytes);
                prop_assert_eq!(usage.allocated_bytes + usage.free_bytes, usage.capacity_bytes);
                for allocation in &live {
                    pool.check(allocation.id, allocation.generation, allocation.offset,
                        allocation.length_bytes)?;
                }
            }
            for allocation in live.drain(..) {
                pool.free(allocation.id, allocation.generation)?;
            }
            pool.check_invariants();
            let usage = pool.usage();
            prop_assert_eq!(usage.largest_free_run_bytes, usage.capacity_bytes);
            prop_assert_eq!(usage.allocation_count, 0);
        }
    }
}
