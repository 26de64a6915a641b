//! NFSv4 protocol definitions.

pub mod consts;
pub use consts::Nfsstat4;
pub mod msg;
