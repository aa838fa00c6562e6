//! Fuzzes the `cluster.toml` parser: any text gives a configuration or an error; nothing
//! panics.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)] // each target uses one of the checks
mod checks;

use checks::check_config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Err(reason) = check_config(bytes) {
        panic!("{reason}");
    }
});
