//! Fuzzes the SSD store's recovery scan: any region file gives only sound objects inside the
//! region, never a panic (forged or torn headers included).
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)] // each target uses one of the checks
mod checks;

use checks::check_region_scan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Err(reason) = check_region_scan(bytes) {
        panic!("{reason}");
    }
});
