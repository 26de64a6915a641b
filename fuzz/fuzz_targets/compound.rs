//! COMPOUND processing: each input is run by [`sluice_fuzz::harness`],
//! whose first byte picks how the rest reaches `Server::handle_record`: as
//! COMPOUND arguments in the harness's session (a leading SEQUENCE gets the
//! live session id and sequence id), as COMPOUND arguments wrapped in a
//! call header as they are, or as a whole RPC record.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_fuzz::harness;

fuzz_target!(|data: &[u8]| {
    harness::with(|h| {
        let _ = h.run(data);
    });
});
