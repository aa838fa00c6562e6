//! Fuzzes the frame reader: any byte stream gives frames or a typed error; nothing panics.
#![no_main]

use kvtier::protocol::inputs::check_frames;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Err(reason) = check_frames(bytes) {
        panic!("{reason}");
    }
});
