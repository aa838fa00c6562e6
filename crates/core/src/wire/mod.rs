//! The wire layer: everything that turns messages into bytes on a socket and back.
//!
//! It owns the payload codec ([`codec`], the only user of bincode), the versioned frame
//! format and its async readers and writers ([`frame`]), mutual TLS with the cluster CA
//! ([`tls`]) and its certificates ([`certs`]), QUIC endpoints and session streams ([`quic`]), Unix sockets for local clients
//! ([`uds`]) and the memory files handed over them ([`handoff`]), the bound on connections per peer certificate ([`admission`]), a pipelined
//! request/reply client ([`rpc`]) and the boundary's error type
//! ([`WireError`]). It is generic over the message types: the protocol's request and reply
//! enums are defined by their users and only need serde.

pub mod admission;
pub mod certs;
pub mod codec;
pub mod error;
pub mod etcd;
pub mod frame;
pub mod handoff;
pub mod peer;
pub mod quic;
pub mod rpc;
pub mod tls;
pub mod uds;

pub use codec::FRAME_PAYLOAD_BYTES_MAX;
pub use error::WireError;
pub use frame::{read_frame, read_raw_frame, write_frame, FrameHeader, RawFrame, PROTOCOL_VERSION};
pub use rpc::{RpcClient, RpcConfig};
pub use tls::TlsError;
