//! The protocol: the request and reply messages (node ↔ directory, engine ↔ node) and the
//! one dispatch of a request into the directory core, used by the directory's actors and
//! by the whole-cluster simulation alike — as quinn-proto's `handle_event` is one entry
//! point for every runtime. Bytes on sockets are `wire`'s; this module knows none.

pub mod directory;
pub mod inputs;
pub mod messages;
