//! NFSv3 and MOUNT calls to a server over a scratch export: see
//! `src/v3.rs` for the layout of the inputs.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_fuzz::{harness, v3};

fuzz_target!(|data: &[u8]| {
    harness::with(|h| v3::run(h, data));
});
