//! Per-file reader/writer locks held for the duration of backing I/O, so a
//! read (and the extent map it reports) sees each write entirely or not at
//! all. Locks are striped: files hash onto a fixed set of locks.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

const STRIPES: usize = 1024;

/// The lock table.
#[derive(Debug)]
pub struct FileLocks {
    stripes: Vec<RwLock<()>>,
}

impl Default for FileLocks {
    fn default() -> Self {
        FileLocks {
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
        }
    }
}

impl FileLocks {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn stripe(&self, key: (u64, u64)) -> &RwLock<()> {
        let h =
            key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ key.1.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        &self.stripes[(h >> 32) as usize % STRIPES]
    }

    /// Shared access for reading the file.
    pub fn read(&self, key: (u64, u64)) -> RwLockReadGuard<'_, ()> {
        self.stripe(key).read().unwrap_or_else(|e| e.into_inner())
    }

    /// Exclusive access for changing the file.
    pub fn write(&self, key: (u64, u64)) -> RwLockWriteGuard<'_, ()> {
        self.stripe(key).write().unwrap_or_else(|e| e.into_inner())
    }
}
