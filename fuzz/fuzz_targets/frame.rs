//! Fuzzes the frame reader: any byte stream gives frames or a typed error; nothing panics.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)] // each target uses one of the checks
mod checks;

use checks::check_frames;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Err(reason) = check_frames(bytes) {
        panic!("{reason}");
    }
});
