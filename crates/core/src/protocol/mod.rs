//! The protocol: the request and reply messages (node ↔ directory, engine ↔ node) and the
//! one dispatch of a request into each core (`directory`: a node's request into the
//! directory core; `node`: a local client's request into the node core), used by the
//! actors and by the tests and simulation alike — as quinn-proto's `handle_event` is one
//! entry point for every runtime. Bytes on sockets are `wire`'s; this module knows none.

pub mod directory;
pub mod messages;
pub mod node;
pub mod shards;
