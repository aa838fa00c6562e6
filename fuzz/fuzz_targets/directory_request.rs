//! Fuzzes the `DirectoryRequest` decoder: any bytes decode to a value that round-trips, or to a typed
//! error; nothing panics.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)] // each target uses one of the checks
mod checks;

use checks::check_message;
use kvtier_core::protocol::messages::DirectoryRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Err(reason) = check_message::<DirectoryRequest>(bytes) {
        panic!("{reason}");
    }
});
