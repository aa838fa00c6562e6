//! The SSD pins of one client connection, as books: which pins it holds, what each one
//! pins, and when each lapses on the node's clock. A pin hands a reader that reads the
//! node's SSD files itself (GPUDirect Storage) where an object's bytes lie, and keeps their
//! region from reuse until the pin ends: asked for, lapsed, or the connection gone.
//!
//! Sans-I/O: the session shell pins and unpins the store's regions; these books decide the
//! bound, number the pins and say which have ended. `P` is what the shell needs to unpin
//! (the store's pinned object; a plain value in the tests).

use super::ClientRefusal;
use crate::model::Timestamp;
use std::collections::HashMap;
use std::time::Duration;

/// Pins one connection holds at most. A pin keeps a whole region from reuse, so the bound
/// keeps one reader from stopping the store's reclaim: a pinned region's spills go
/// elsewhere, and a store whose every region is pinned skips spills (counted as full).
pub const SSD_PINS_PER_CLIENT_MAX: usize = 256;
/// How long a pin lasts unless ended earlier: a reader reads one object in well under it.
pub const SSD_PIN_LASTS: Duration = Duration::from_secs(30);

/// One connection's pins (at most [`SSD_PINS_PER_CLIENT_MAX`]), each with the instant it
/// lapses. Pin numbers are never reused within a connection.
#[derive(Debug)]
pub struct SsdPinBooks<P> {
    pins: HashMap<u64, (P, Timestamp)>,
    last: u64,
}

impl<P> Default for SsdPinBooks<P> {
    fn default() -> Self {
        SsdPinBooks {
            pins: HashMap::new(),
            last: 0,
        }
    }
}

impl<P> SsdPinBooks<P> {
    /// Whether `count` more pins fit: all of a request's objects or none.
    pub fn admit(&self, count: usize) -> Result<(), ClientRefusal> {
        let max = SSD_PINS_PER_CLIENT_MAX;
        if self.pins.len().saturating_add(count) > max {
            return Err(ClientRefusal::TooManySsdPins { max });
        }
        Ok(())
    }

    /// Books `pinned` until [`SSD_PIN_LASTS`] after `now`; its pin number.
    pub fn book(&mut self, pinned: P, now: Timestamp) -> u64 {
        self.last += 1;
        self.pins.insert(self.last, (pinned, now + SSD_PIN_LASTS));
        self.last
    }

    /// Ends the pins of `pins` this connection holds (others are ignored): what they
    /// pinned, for the shell to unpin.
    pub fn end(&mut self, pins: &[u64]) -> Vec<P> {
        pins.iter()
            .filter_map(|pin| self.pins.remove(pin))
            .map(|(pinned, _)| pinned)
            .collect()
    }

    /// Ends the pins lapsed at `now`.
    pub fn end_lapsed(&mut self, now: Timestamp) -> Vec<P> {
        let lapsed: Vec<u64> = self
            .pins
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(pin, _)| *pin)
            .collect();
        self.end(&lapsed)
    }

    /// What the pins held pin, in no order.
    pub fn held(&self) -> impl Iterator<Item = &P> {
        self.pins.values().map(|(pinned, _)| pinned)
    }

    /// Ends every pin (the connection is gone).
    pub fn end_all(&mut self) -> Vec<P> {
        self.pins.drain().map(|(_, (pinned, _))| pinned).collect()
    }

    /// How many pins the connection holds.
    pub fn len(&self) -> usize {
        self.pins.len()
    }

    /// Whether the connection holds no pin.
    pub fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: u64) -> Timestamp {
        Timestamp(0) + Duration::from_secs(seconds)
    }

    #[test]
    fn pins_lapse_on_the_injected_clock_and_end_once() {
        let mut books = SsdPinBooks::default();
        let first = books.book("a", at(0));
        let second = books.book("b", at(10));
        assert_ne!(first, second);
        assert!(books.end_lapsed(at(29)).is_empty());
        assert_eq!(books.end_lapsed(at(30)), vec!["a"]);
        // Ending a lapsed, unknown or already ended pin ends nothing.
        assert!(books.end(&[first, 999]).is_empty());
        assert_eq!(books.end(&[second, second]), vec!["b"]);
        assert!(books.is_empty());
        // Numbers are not reused after pins end.
        assert!(books.book("c", at(40)) > second);
    }

    #[test]
    fn the_bound_refuses_a_whole_request() {
        let mut books = SsdPinBooks::default();
        for object in 0..SSD_PINS_PER_CLIENT_MAX - 1 {
            books.book(object, at(0));
        }
        assert!(books.admit(1).is_ok());
        assert_eq!(
            books.admit(2),
            Err(ClientRefusal::TooManySsdPins {
                max: SSD_PINS_PER_CLIENT_MAX
            })
        );
        assert_eq!(books.end_all().len(), SSD_PINS_PER_CLIENT_MAX - 1);
        assert!(books.admit(SSD_PINS_PER_CLIENT_MAX).is_ok());
    }

    proptest! {
        /// Whatever the order of pins, ends and lapses, every booked pin is handed back to
        /// be unpinned exactly once, and a lapse never hands back a pin before its time.
        #[test]
        fn every_pin_is_handed_back_exactly_once(
            steps in proptest::collection::vec((0u8..3, 0u64..4, 0u64..6), 1..200)
        ) {
            let mut books = SsdPinBooks::default();
            let mut now = 0u64;
            // Each booking's value is its index; when it was booked and under which number.
            let mut booked: Vec<(u64, u64)> = Vec::new();
            let mut handed = std::collections::HashSet::new();
            for (action, pick, advance) in steps {
                now += advance * 7;
                let ended = match action {
                    0 => {
                        let pin = books.book(booked.len(), at(now));
                        booked.push((now, pin));
                        Vec::new()
                    }
                    1 => {
                        let pins: Vec<u64> =
                            booked.iter().map(|(_, pin)| *pin).filter(|pin| pin % 4 == pick).collect();
                        books.end(&pins)
                    }
                    _ => {
                        let ended = books.end_lapsed(at(now));
                        for index in &ended {
                            prop_assert!(booked[*index].0 + SSD_PIN_LASTS.as_secs() <= now);
                        }
                        ended
                    }
                };
                for index in ended {
                    prop_assert!(handed.insert(index), "pin {index} handed back twice");
                }
            }
            for index in books.end_all() {
                prop_assert!(handed.insert(index), "pin {index} handed back twice");
            }
            prop_assert_eq!(handed.len(), booked.len());
        }
    }
}
