//! How one `store_many` or `load_into` call is cut into sub-batches: each bounded by a
//! count of items and by bytes (at least one item, so an object larger than the byte bound
//! travels alone). Small batches let the copy of one overlap the round trips of the others.

/// The lengths of the consecutive sub-batches of `sizes` (the byte size of each item, in
/// order): each holds at most `items_max` items and at most `bytes_max` bytes, or a single
/// item larger than that. The lengths sum to `sizes.len()`; none is zero.
pub fn batch_lengths(
    sizes: impl IntoIterator<Item = u64>,
    items_max: usize,
    bytes_max: u64,
) -> Vec<usize> {
    let items_max = items_max.max(1);
    let mut lengths = Vec::new();
    let (mut items, mut bytes) = (0usize, 0u64);
    for size in sizes {
        let fits = items < items_max && bytes.saturating_add(size) <= bytes_max;
        if items > 0 && !fits {
            lengths.push(items);
            (items, bytes) = (0, 0);
        }
        items += 1;
        bytes = bytes.saturating_add(size);
    }
    if items > 0 {
        lengths.push(items);
    }
    lengths
}

#[cfg(test)]
mod tests {
    use super::batch_lengths;

    #[test]
    fn batches_are_bounded_by_bytes_and_by_count() {
        const MIB: u64 = 1 << 20;
        // 4 MiB objects under a 4 MiB bound: one a batch.
        assert_eq!(batch_lengths([4 * MIB; 3], 64, 4 * MIB), vec![1, 1, 1]);
        // 1 MiB objects: four a batch.
        assert_eq!(batch_lengths([MIB; 10], 64, 4 * MIB), vec![4, 4, 2]);
        // Small objects: the count bounds them.
        assert_eq!(batch_lengths([4096; 130], 64, 4 * MIB), vec![64, 64, 2]);
        // An object over the byte bound travels alone, between the others.
        assert_eq!(
            batch_lengths([MIB, 9 * MIB, MIB, MIB], 64, 4 * MIB),
            vec![1, 1, 2]
        );
        assert!(batch_lengths([], 64, 4 * MIB).is_empty());
        // A zero count bound still makes progress, one item a batch.
        assert_eq!(batch_lengths([1; 2], 0, 4 * MIB), vec![1, 1]);
    }
}
