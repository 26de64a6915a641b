//! sluice's protocol layer, with no I/O: XDR encoding and decoding
//! ([`xdr`]), ONC RPC call headers, authentication and replies ([`rpc`]),
//! and the NFSv4.1/4.2 protocol numbers ([`nfs4`]).

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod nfs4;
pub mod rpc;
pub mod xdr;
