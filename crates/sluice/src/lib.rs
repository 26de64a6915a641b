//! sluice: a user-space NFSv4.1/4.2 file server.
//!
//! Layers, from the socket inwards: [`net`] (TCP and record marking),
//! the protocol crate `sluice-proto` ([`rpc`]: ONC RPC headers and
//! authentication, [`xdr`], [`nfs4`]: protocol numbers; no I/O),
//! [`server`] (COMPOUND, the op table, sessions, state and ops) and the
//! engine crate `sluice-engine` ([`engine`]: exports, handles, readahead
//! and file system access, free of NFS); [`metrics`] serves counters in
//! the Prometheus text format; `cluster` (the `cluster` feature, on by
//! default) makes several nodes one server.

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod config;
pub mod metrics;
pub mod net;
pub mod rules;
pub mod server;
pub mod tasks;

pub use sluice_engine as engine;
pub use sluice_engine::tune_allocator;
pub use sluice_proto::{mount, nfs3, nfs4, nlm, rpc, xdr};
