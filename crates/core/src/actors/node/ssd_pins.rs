//! The SSD pins of one client connection: where objects' bytes are in the node's SSD
//! files, for a reader that reads them itself (GPUDirect Storage), each object's region
//! protected from reuse until its pin ends — asked for, timed out, or the connection gone.
//! Bounded per connection.

use super::ssd::NodeSsd;
use crate::backends::ssd::PinnedObject;
use crate::model::ObjectId;
use crate::node::ClientRefusal;
use crate::protocol::messages::SsdExtent;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Pins one connection holds at most. A pin keeps a whole region from reuse, so the bound
/// keeps one reader from stopping the store's reclaim: a pinned region's spills go
/// elsewhere, and a store whose every region is pinned skips spills (counted as full).
pub const SSD_PINS_PER_CLIENT_MAX: usize = 256;
/// How long a pin lasts unless ended earlier: a reader reads one object in well under it.
pub const SSD_PIN_LASTS: Duration = Duration::from_secs(30);

/// One connection's pins, each with the instant it lapses.
#[derive(Default)]
pub struct SsdPins {
    pins: HashMap<u64, (PinnedObject, Instant)>,
    next: u64,
}

impl SsdPins {
    /// Pins each object the store holds (`None` for one it does not), all or nothing
    /// against [`SSD_PINS_PER_CLIENT_MAX`].
    pub fn pin(
        &mut self,
        ssd: &NodeSsd,
        objects: &[ObjectId],
        now: Instant,
    ) -> Result<Vec<Option<SsdExtent>>, ClientRefusal> {
        let max = SSD_PINS_PER_CLIENT_MAX;
        if self.pins.len().saturating_add(objects.len()) > max {
            return Err(ClientRefusal::TooManySsdPins { max });
        }
        Ok(objects
            .iter()
            .map(|object| {
                let pinned = ssd.store.pin_for_reader(object)?;
                let Some(path) = pinned.path.to_str().map(str::to_owned) else {
                    // A file a client could not name: not offered.
                    ssd.store.unpin(pinned);
                    return None;
                };
                self.next += 1;
                let extent = SsdExtent {
                    pin: self.next,
                    path,
                    offset: pinned.offset,
                    length_bytes: pinned.length_bytes,
                    data_crc: pinned.data_crc,
                    lasts_ms: SSD_PIN_LASTS.as_millis() as u64,
                };
                self.pins.insert(self.next, (pinned, now + SSD_PIN_LASTS));
                Some(extent)
            })
            .collect())
    }

    /// Ends the pins of `pins` this connection holds; how many it ended.
    pub fn unpin(&mut self, ssd: &NodeSsd, pins: &[u64]) -> u32 {
        let mut ended = 0;
        for pin in pins {
            if let Some((pinned, _)) = self.pins.remove(pin) {
                ssd.store.unpin(pinned);
                ended += 1;
            }
        }
        ended
    }

    /// Ends the pins whose time is up at `now`.
    pub fn expire(&mut self, ssd: &NodeSsd, now: Instant) {
        let lapsed: Vec<u64> = self
            .pins
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(pin, _)| *pin)
            .collect();
        self.unpin(ssd, &lapsed);
    }

    /// Ends every pin (the connection is gone).
    pub fn end_all(&mut self, ssd: &NodeSsd) {
        for (_, (pinned, _)) in self.pins.drain() {
            ssd.store.unpin(pinned);
        }
    }
}
