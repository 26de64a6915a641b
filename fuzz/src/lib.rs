//! Shared code of the sluice fuzz targets (`fuzz_targets/`) and of the
//! seed corpus generator (`examples/gen_corpus.rs`).
//!
//! - [`wire`]: RPC call headers, COMPOUND arguments and the rewriting of a
//!   leading SEQUENCE op.
//! - [`harness`]: a server over a scratch export with a live session, and
//!   the layout of `compound` inputs (first byte: mode and flags).
//! - [`msg`]: the checks of the `msg` target on the typed NFSv4 messages,
//!   and the layout of its inputs (first byte: the message type).
//! - [`v3`]: the layout of `nfs3` inputs (NFSv3 and MOUNT calls).

#![warn(missing_docs)]

pub mod harness;
pub mod msg;
pub mod v3;
pub mod wire;
