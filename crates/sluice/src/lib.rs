//! sluice: a user-space NFSv4.1/4.2 file server.
//!
//! Layers, from the socket inwards: [`net`] (TCP and record marking),
//! [`rpc`] (ONC RPC headers and authentication), [`nfs4`] (protocol
//! numbers), [`server`] (COMPOUND, sessions, state and ops) and [`engine`]
//! (exports, handles, readahead and file system access, free of NFS);
//! [`metrics`] serves counters in the Prometheus text format.

#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod engine;
pub mod metrics;
pub mod net;
pub mod nfs4;
pub mod rpc;
pub mod server;
pub mod xdr;
