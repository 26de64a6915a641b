//! sluice's own NFSv4.1/4.2 client ([`client`]) and NFSv3 client ([`v3`]),
//! for the load generator (`sluice-load`) and the state benchmark
//! (`sluice-statebench`).

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod client;
pub mod v3;
