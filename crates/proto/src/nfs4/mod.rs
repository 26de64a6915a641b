//! NFSv4 protocol definitions.

pub mod consts;
