//! The SSD pins of one client connection, the shell: it pins and unpins the store's
//! regions as the connection's books ([`crate::node::ssd_pins`]) decide, on the node's
//! clock.

use super::ssd::NodeSsd;
use crate::backends::ssd::PinnedObject;
use crate::model::{ObjectId, Timestamp};
use crate::node::ssd_pins::{SsdPinBooks, SSD_PIN_LASTS};
use crate::node::ClientRefusal;
use crate::protocol::messages::SsdExtent;

/// One connection's pins: its books, and the store's pinned objects they hold.
#[derive(Default)]
pub struct SsdPins {
    books: SsdPinBooks<PinnedObject>,
}

impl SsdPins {
    /// Pins each object the store holds (`None` for one it does not), all or nothing
    /// against the books' bound.
    pub fn pin(
        &mut self,
        ssd: &NodeSsd,
        objects: &[ObjectId],
        now: Timestamp,
    ) -> Result<Vec<Option<SsdExtent>>, ClientRefusal> {
        self.books.admit(objects.len())?;
        Ok(objects
            .iter()
            .map(|object| {
                let pinned = ssd.store.pin_for_reader(object)?;
                let Some(path) = pinned.path.to_str().map(str::to_owned) else {
                    // A file a client could not name: not offered.
                    ssd.store.unpin(pinned);
                    return None;
                };
                let (offset, length_bytes, data_crc) =
                    (pinned.offset, pinned.length_bytes, pinned.data_crc);
                let pin = self.books.book(pinned, now);
                Some(SsdExtent {
                    pin,
                    path,
                    offset,
                    length_bytes,
                    data_crc,
                    lasts_ms: SSD_PIN_LASTS.as_millis() as u64,
                })
            })
            .collect())
    }

    /// Ends the pins of `pins` this connection holds; how many it ended.
    pub fn unpin(&mut self, ssd: &NodeSsd, pins: &[u64]) -> u32 {
        unpin_each(ssd, self.books.end(pins))
    }

    /// Ends the pins whose time is up at `now`.
    pub fn expire(&mut self, ssd: &NodeSsd, now: Timestamp) {
        unpin_each(ssd, self.books.end_lapsed(now));
    }

    /// Ends every pin (the connection is gone).
    pub fn end_all(&mut self, ssd: &NodeSsd) {
        unpin_each(ssd, self.books.end_all());
    }
}

/// Unpins each ended pin's region; how many.
fn unpin_each(ssd: &NodeSsd, ended: Vec<PinnedObject>) -> u32 {
    let count = ended.len() as u32;
    for pinned in ended {
        ssd.store.unpin(pinned);
    }
    count
}
