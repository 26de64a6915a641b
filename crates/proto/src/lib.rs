//! sluice's protocol layer, with no I/O: XDR encoding and decoding
//! ([`xdr`]), ONC RPC call headers, authentication and replies ([`rpc`]),
//! the NFSv4.1/4.2 protocol numbers ([`nfs4`]), NFSv3 ([`nfs3`]), and
//! MOUNT and the portmapper ([`mount`]), NLM and NSM ([`nlm`]).

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod mount;
pub mod nfs3;
pub mod nfs4;
pub mod nlm;
pub mod rpc;
pub mod xdr;
