//! Per-thread file system identity.
//!
//! The server runs as root and switches the file system identity of the
//! worker thread (fsuid, fsgid and supplementary groups) to the caller's for
//! the duration of a request, so the kernel checks permissions and gives new
//! files the caller's ownership. The calls are made as raw system calls,
//! which act on the calling thread only.

use std::cell::Cell;

/// A caller's identity on the backing file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// File system user id.
    pub uid: u32,
    /// File system group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

thread_local! {
    static CURRENT_UID: Cell<u32> = const { Cell::new(0) };
}

fn set_groups(groups: &[u32]) {
    // SAFETY: the pointer and length describe a valid slice of gid_t.
    unsafe {
        libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
    }
}

fn set_fs_ids(uid: u32, gid: u32) {
    // SAFETY: plain system calls with integer arguments.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
    }
    CURRENT_UID.with(|c| c.set(uid));
}

/// Runs with `id` as the thread's file system identity until dropped.
#[must_use]
pub struct IdentityGuard {
    _private: (),
}

/// Switches the calling thread to `id`.
pub fn assume(id: &Identity) -> IdentityGuard {
    set_groups(&id.groups);
    set_fs_ids(id.uid, id.gid);
    IdentityGuard { _private: () }
}

impl Drop for IdentityGuard {
    fn drop(&mut self) {
        set_fs_ids(0, 0);
        set_groups(&[]);
    }
}

/// Runs `f` with root's file system identity (needed to open handles),
/// then restores the caller's.
pub fn as_root<T>(f: impl FnOnce() -> T) -> T {
    let uid = CURRENT_UID.with(|c| c.get());
    if uid == 0 {
        return f();
    }
    // SAFETY: plain system calls; the previous fsgid is read back by
    // setfsgid's return value.
    let (old_uid, old_gid) = unsafe {
        let g = libc::syscall(libc::SYS_setfsgid, 0u32) as u32;
        let u = libc::syscall(libc::SYS_setfsuid, 0u32) as u32;
        (u, g)
    };
    let r = f();
    set_fs_ids(old_uid, old_gid);
    r
}
