//! The decoders of the typed NFSv4 messages (`sluice::nfs4::msg`): the
//! first input byte picks a message type, the rest is decoded as it. No
//! decoder may panic, and what decodes must re-encode to the bytes it was
//! read from (padding aside) and decode again to the same value; see
//! `src/msg.rs` for the checks and the list of types.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| sluice_fuzz::msg::run(input));
