//! The storage engine: exports, file handles, identities and file system
//! access. It knows nothing about NFS.

pub mod ahead;
pub mod bufcache;
pub mod cred;
pub mod export;
pub mod extents;
pub mod fs;
pub mod handle;
pub mod hugebuf;
pub mod rangelock;
pub mod readahead;
