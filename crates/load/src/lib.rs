//! sluice's own NFSv4.1/4.2 client ([`client`]) and NFSv3 client ([`v3`]),
//! for the load generator (`sluice-load`), the metadata benchmark
//! (`sluice-meta`) and the state benchmark (`sluice-statebench`), and
//! the command-line pieces they share ([`cli`]).

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]
// The workspace's clippy.toml routes the server's tasks through
// `sluice::tasks` (its threads may keep a caller's identity); clients
// take no identities.
#![allow(clippy::disallowed_methods)]

pub mod cli;
pub mod client;
pub mod v3;
