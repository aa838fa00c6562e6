//! The copy engine's queue, as books: copies cut into pieces that workers take in queue
//! order (so one long copy uses every worker, and a run of copies ends about in the order
//! they were asked for), and each copy's progress (the first failure skips the rest; the
//! worker that ends the last piece answers). Sans-I/O: the node's copy engine owns the
//! threads, the wake-ups and the bytes; `J` is its handle on a copy.

use std::collections::VecDeque;

/// What a worker takes next from a [`PieceQueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken<J> {
    /// Copy piece `piece` of the copy `J`.
    Piece(J, u64),
    /// Nothing queued: wait for a copy.
    Idle,
    /// Nothing queued and the queue is closed: the worker ends.
    Closed,
}

/// Copies waiting for workers, each with its next piece. Bounded by the caller (the copy
/// engine admits at most its queue's room of copies).
#[derive(Debug)]
pub struct PieceQueue<J> {
    copies: VecDeque<(J, u64, u64)>,
    closed: bool,
}

impl<J> Default for PieceQueue<J> {
    fn default() -> Self {
        PieceQueue {
            copies: VecDeque::new(),
            closed: false,
        }
    }
}

impl<J: Clone> PieceQueue<J> {
    /// Queues a copy of `pieces` pieces behind the others (none: nothing is queued).
    pub fn push(&mut self, copy: J, pieces: u64) {
        if pieces > 0 {
            self.copies.push_back((copy, 0, pieces));
        }
    }

    /// The front copy's next piece (the copy leaves the queue with its last piece).
    pub fn take(&mut self) -> Taken<J> {
        let Some((copy, next, pieces)) = self.copies.front_mut() else {
            return if self.closed {
                Taken::Closed
            } else {
                Taken::Idle
            };
        };
        let taken = Taken::Piece(copy.clone(), *next);
        *next += 1;
        if *next >= *pieces {
            self.copies.pop_front();
        }
        taken
    }

    /// No more copies come: the workers take what is queued, then end.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Whether the queue was closed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

/// One copy's pieces still to end, and its first failure.
#[derive(Debug)]
pub struct CopyProgress {
    pieces_left: u64,
    failure: Option<String>,
}

impl CopyProgress {
    /// A copy of `pieces` pieces, none ended.
    pub fn new(pieces: u64) -> CopyProgress {
        CopyProgress {
            pieces_left: pieces,
            failure: None,
        }
    }

    /// Whether a piece taken now is skipped: an earlier one failed.
    pub fn skips(&self) -> bool {
        self.failure.is_some()
    }

    /// A piece ended (`Err`: it failed). The copy's outcome when it was the last one (its
    /// first failure, if any); `None` while pieces are left, and after the outcome was given.
    pub fn piece_ended(&mut self, ended: Result<(), String>) -> Option<Result<(), String>> {
        if let Err(reason) = ended {
            self.failure.get_or_insert(reason);
        }
        if self.pieces_left == 0 {
            return None;
        }
        self.pieces_left -= 1;
        (self.pieces_left == 0).then(|| self.failure.take().map_or(Ok(()), Err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_take_pieces_in_queue_order_and_end_when_closed() {
        let mut queue = PieceQueue::default();
        assert_eq!(queue.take(), Taken::<char>::Idle);
        queue.push('a', 2);
        queue.push('b', 0);
        queue.push('c', 1);
        let taken: Vec<Taken<char>> = (0..4).map(|_| queue.take()).collect();
        assert_eq!(
            taken,
            vec![
                Taken::Piece('a', 0),
                Taken::Piece('a', 1),
                Taken::Piece('c', 0),
                Taken::Idle
            ]
        );
        queue.push('d', 1);
        queue.close();
        assert!(queue.is_closed());
        // What was queued before the close is still copied.
        assert_eq!(queue.take(), Taken::Piece('d', 0));
        assert_eq!(queue.take(), Taken::Closed);
    }

    #[test]
    fn the_last_piece_answers_with_the_first_failure() {
        let mut progress = CopyProgress::new(3);
        assert_eq!(progress.piece_ended(Ok(())), None);
        assert!(!progress.skips());
        assert_eq!(progress.piece_ended(Err("first".into())), None);
        assert!(progress.skips());
        assert_eq!(
            progress.piece_ended(Err("second".into())),
            Some(Err("first".into()))
        );
        // Answered once: a stray end after the last changes nothing.
        assert_eq!(progress.piece_ended(Ok(())), None);
        let mut whole = CopyProgress::new(1);
        assert_eq!(whole.piece_ended(Ok(())), Some(Ok(())));
    }
}
