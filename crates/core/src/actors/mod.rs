//! The actors: thin shells that receive messages, call a sans-I/O core, and send what the
//! core returned. Every decision lives in `directory`, `node`, `backends` or `policy`; a
//! handler here reads the clock, calls, replies and re-arms a timer.
//!
//! * `directory`: the directory process, its actor and its node sessions.
//! * `node`: the node process, its actor, client sessions, pools and link.
//! * `busy_poll`: keeps a process's thread polling while replies are due.
//! * `frames`: the frame stream and writer task shared by both kinds of session.
//! * `process`: what both processes share (metrics endpoint, shutdown signals).

pub mod busy_poll;
pub mod directory;
pub mod frames;
pub mod node;
pub mod process;
