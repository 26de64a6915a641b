//! sluice's own NFSv4.1/4.2 client ([`client`]), for the load generator
//! (`sluice-load`) and the state benchmark (`sluice-statebench`).

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod client;
