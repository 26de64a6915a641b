//! Shared code of the sluice fuzz targets (`fuzz_targets/`) and of the
//! seed corpus generator (`examples/gen_corpus.rs`).
//!
//! - [`wire`]: RPC call headers, COMPOUND arguments and the rewriting of a
//!   leading SEQUENCE op.
//! - [`harness`]: a server over a scratch export with a live session, and
//!   the layout of `compound` inputs (first byte: mode and flags).

#![warn(missing_docs)]

pub mod harness;
pub mod wire;
