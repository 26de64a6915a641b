//! Per-thread file system identity.
//!
//! The server runs as root and switches the file system identity of the
//! worker thread (fsuid, fsgid and supplementary groups) to the caller's for
//! the duration of a request, so the kernel checks permissions and gives new
//! files the caller's ownership. The calls are made as raw system calls,
//! which act on the calling thread only.

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
    /// The calling thread's file system identity, so switching to the
    /// identity it already has costs no system calls. Read from the
    /// kernel when the thread first switches: a thread inherits the
    /// identity of the one that started it, which need not be root, and
    /// the process may have supplementary groups of its own.
    static CURRENT: std::cell::RefCell<(u32, u32, Vec<u32>)> =
        std::cell::RefCell::new(kernel_identity());
    /// Credential changes this thread has asked the kernel for.
    static CHANGES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The thread's capability sets, read from the kernel on first use.
    static CAPS: std::cell::Cell<Option<CapSets>> = const { std::cell::Cell::new(None) };
    /// Identity guards alive on this thread.
    static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// CAP_SYS_RESOURCE: lets its holder past disk quotas and into the blocks
/// a file system reserves (ext4's reserved blocks for root).
const CAP_SYS_RESOURCE: u32 = 24;

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit halves.
const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

type CapSets = [CapData; 2];

/// capget or capset (`nr`) of the calling thread's sets: version 3 takes
/// a header and two data elements.
fn capcall(nr: libc::c_long, data: *mut CapData) -> libc::c_long {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0, // the calling thread
    };
    // SAFETY: callers pass a two-element array; the kernel reads or
    // writes that and the header, nothing else.
    unsafe { libc::syscall(nr, &mut header as *mut CapHeader, data) }
}

fn thread_caps() -> CapSets {
    if let Some(c) = CAPS.with(|c| c.get()) {
        return c;
    }
    let mut data = [CapData::default(); 2];
    capcall(libc::SYS_capget, data.as_mut_ptr());
    CAPS.with(|c| c.set(Some(data)));
    data
}

/// Puts CAP_SYS_RESOURCE in the thread's effective set or takes it out,
/// when the thread is permitted it and does not already have it so.
fn set_resource_cap(want: bool) {
    let mut caps = thread_caps();
    let bit = 1u32 << CAP_SYS_RESOURCE;
    let have = caps[0].effective & bit != 0;
    if have == want || (want && caps[0].permitted & bit == 0) {
        return;
    }
    if want {
        caps[0].effective |= bit;
    } else {
        caps[0].effective &= !bit;
    }
    let r = capcall(libc::SYS_capset, caps.as_mut_ptr());
    counted(1);
    if r == 0 {
        CAPS.with(|c| c.set(Some(caps)));
    } else {
        // Read again rather than trust what was asked.
        CAPS.with(|c| c.set(None));
    }
}

/// Whether the calling thread has CAP_SYS_RESOURCE in its effective set.
pub fn has_resource_cap() -> bool {
    thread_caps()[0].effective & (1 << CAP_SYS_RESOURCE) != 0
}

/// The credential changes (setgroups, setfsgid, setfsuid) the calling
/// thread has made so far. Each costs the kernel a new credential
/// (prepare_creds, commit_creds and an RCU free): at tens of thousands of
/// requests a second that shows, so tests count them.
pub fn changes() -> u64 {
    CHANGES.with(|c| c.get())
}

/// The calling thread's fsuid, fsgid and supplementary groups as the
/// kernel has them.
fn kernel_identity() -> (u32, u32, Vec<u32>) {
    // SAFETY: plain system calls; setfsuid and setfsgid with an id that
    // cannot be valid change nothing and answer the current one;
    // getgroups writes at most `n` entries into a buffer of `n`.
    unsafe {
        let uid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        let gid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        let n = libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>());
        let mut groups = vec![0u32; n.max(0) as usize];
        let got = libc::syscall(libc::SYS_getgroups, groups.len(), groups.as_mut_ptr());
        groups.truncate(got.max(0) as usize);
        (uid, gid, groups)
    }
}

/// Gives up the process's own supplementary groups, in every thread
/// (the C library's setgroups applies to all of them). The server calls
/// it at start: a root started by `sudo` or a service manager often has
/// group 0 in its list, which every request that takes on a caller's
/// identity would otherwise have to drop and take back.
pub fn drop_supplementary_groups() -> std::io::Result<()> {
    // SAFETY: an empty list; no pointer is read.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    CURRENT.with(|c| c.borrow_mut().2.clear());
    Ok(())
}

fn counted(n: u64) {
    CHANGES.with(|c| c.set(c.get() + n));
}

fn set_groups(groups: &[u32]) {
    let same = CURRENT.with(|c| c.borrow().2 == groups);
    if same {
        return;
    }
    // SAFETY: the pointer and length describe a valid slice of gid_t.
    unsafe {
        libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
    }
    counted(1);
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        c.2.clear();
        c.2.extend_from_slice(groups);
    });
}

fn set_fs_ids(uid: u32, gid: u32) {
    let (cur_uid, cur_gid) = CURRENT.with(|c| {
        let c = c.borrow();
        (c.0, c.1)
    });
    // SAFETY: plain system calls with integer arguments.
    unsafe {
        if gid != cur_gid {
            libc::syscall(libc::SYS_setfsgid, gid);
        }
        if uid != cur_uid {
            libc::syscall(libc::SYS_setfsuid, uid);
        }
    }
    counted(u64::from(gid != cur_gid) + u64::from(uid != cur_uid));
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        c.0 = uid;
        c.1 = gid;
    });
}

/// Runs with `id` as the thread's file system identity until dropped,
/// then gives the thread back the identity it had before. Guards nest: an
/// op that takes the caller's identity for one step inside a COMPOUND
/// that already runs as the caller leaves it so.
#[must_use]
pub struct IdentityGuard {
    uid: u32,
    gid: u32,
    /// The groups before, when they differ from the ones taken on.
    groups: Option<Vec<u32>>,
    /// Whether the thread had CAP_SYS_RESOURCE before, for a guard taken
    /// inside another.
    resource: Option<bool>,
    /// The guard acts on the thread that took it.
    _thread: std::marker::PhantomData<*const ()>,
}

/// Switches the calling thread to `id`: its fsuid, fsgid and groups, and
/// CAP_SYS_RESOURCE only for root.
///
/// The outermost guard leaves CAP_SYS_RESOURCE as `id` had it when it is
/// dropped: what the server does as itself between requests needs no
/// quota exemption, and a thread that serves callers other than root then
/// changes it once, not twice a request. A guard taken inside another
/// gives it back as it was.
pub fn assume(id: &Identity) -> IdentityGuard {
    let (uid, gid, groups) = CURRENT.with(|c| {
        let c = c.borrow();
        (c.0, c.1, (c.2 != id.groups).then(|| c.2.clone()))
    });
    if groups.is_some() {
        set_groups(&id.groups);
    }
    set_fs_ids(id.uid, id.gid);
    let nested = DEPTH.with(|d| {
        let n = d.get();
        d.set(n + 1);
        n > 0
    });
    let resource = nested.then(has_resource_cap);
    set_resource_cap(id.uid == 0);
    IdentityGuard {
        uid,
        gid,
        groups,
        resource,
        _thread: std::marker::PhantomData,
    }
}

impl Drop for IdentityGuard {
    fn drop(&mut self) {
        set_fs_ids(self.uid, self.gid);
        if let Some(g) = &self.groups {
            set_groups(g);
        }
        if let Some(had) = self.resource {
            set_resource_cap(had);
        }
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Runs `f` with root's file system identity (needed to open handles),
/// then restores the caller's. CAP_SYS_RESOURCE stays as it is: the
/// server's own work needs no quota exemption.
pub fn as_root<T>(f: impl FnOnce() -> T) -> T {
    let (old_uid, old_gid) = CURRENT.with(|c| {
        let c = c.borrow();
        (c.0, c.1)
    });
    if old_uid == 0 && old_gid == 0 {
        return f();
    }
    set_fs_ids(0, 0);
    let r = f();
    set_fs_ids(old_uid, old_gid);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs_ids() -> (u32, u32) {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let field = |name: &str| -> u32 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            // Real, effective, saved, file system: the fourth.
            line.split_whitespace().nth(4).unwrap().parse().unwrap()
        };
        (field("Uid:"), field("Gid:"))
    }

    /// The kernel's view follows every switch, also when an identity is
    /// assumed twice in a row (which skips the system calls) and around
    /// `as_root`. Runs on a thread of its own; needs root, like the server.
    #[test]
    fn identity_switches_reach_the_kernel() {
        std::thread::spawn(|| {
            let a = Identity {
                uid: 1234,
                gid: 5678,
                groups: vec![5678, 42],
            };
            {
                let _g = assume(&a);
                assert_eq!(fs_ids(), (1234, 5678));
                let _g2 = assume(&a);
                assert_eq!(fs_ids(), (1234, 5678));
                as_root(|| assert_eq!(fs_ids(), (0, 0)));
                assert_eq!(fs_ids(), (1234, 5678));
            }
            assert_eq!(fs_ids(), (0, 0));
            let root = Identity {
                uid: 0,
                gid: 0,
                groups: vec![],
            };
            let _g = assume(&root);
            assert_eq!(fs_ids(), (0, 0));
        })
        .join()
        .unwrap();
    }

    /// A thread started while another ran as a caller has the caller's
    /// identity from the kernel: `as_root` still gets it root, and the
    /// guard of an identity it takes gives the inherited one back.
    /// Groups the thread has before its first switch are dropped for a
    /// caller with none (a process started with group 0 must not lend
    /// it to every caller).
    #[test]
    fn the_kernels_identity_is_where_a_thread_starts() {
        std::thread::spawn(|| {
            let a = Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![],
            };
            let _g = assume(&a);
            std::thread::spawn(|| {
                assert_eq!(fs_ids(), (1000, 1000), "not inherited");
                as_root(|| assert_eq!(fs_ids(), (0, 0)));
                assert_eq!(fs_ids(), (1000, 1000));
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
        std::thread::spawn(|| {
            // SAFETY: raw setgroups on this thread only, before the
            // thread's first switch.
            unsafe {
                let g: [u32; 2] = [0, 4];
                libc::syscall(libc::SYS_setgroups, 2, g.as_ptr());
            }
            assert_eq!(groups(), vec![0, 4]);
            let nobody = Identity {
                uid: 65534,
                gid: 65534,
                groups: vec![],
            };
            {
                let _g = assume(&nobody);
                assert_eq!(fs_ids(), (65534, 65534));
                assert!(groups().is_empty(), "the caller kept groups 0 and 4");
            }
            assert_eq!(groups(), vec![0, 4]);
        })
        .join()
        .unwrap();
    }

    /// CAP_SYS_RESOURCE in the thread's effective set, as the kernel
    /// shows it.
    fn resource_cap() -> bool {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        let eff = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
        eff & (1 << CAP_SYS_RESOURCE) != 0
    }

    /// A caller other than root runs without CAP_SYS_RESOURCE, so quotas
    /// and a file system's reserved blocks hold for them, as the Linux
    /// server does; root (a caller not squashed) has it. The outermost
    /// guard leaves it as the caller had it, so a thread serving callers
    /// other than root drops it once; a guard inside another gives it
    /// back. Needs root; where root lacks CAP_SYS_RESOURCE (containers
    /// often do), the test runs again in a user namespace of its own, in
    /// which it has every capability.
    #[test]
    fn callers_other_than_root_lose_cap_sys_resource() {
        const NAME: &str = "cred::tests::callers_other_than_root_lose_cap_sys_resource";
        const INNER: &str = "SLUICE_TEST_IN_USER_NAMESPACE";
        if !resource_cap() {
            assert!(
                std::env::var_os(INNER).is_none(),
                "no CAP_SYS_RESOURCE even in a user namespace"
            );
            let out = std::process::Command::new("unshare")
                .args(["--user", "--map-root-user"])
                .arg(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--test-threads=1"])
                .env(INNER, "1")
                .output()
                .expect("unshare (util-linux) runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "in a user namespace: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        std::thread::spawn(|| {
            let user = Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![],
            };
            let root = Identity {
                uid: 0,
                gid: 0,
                groups: vec![],
            };
            {
                let _g = assume(&user);
                assert!(
                    !resource_cap(),
                    "a caller other than root kept CAP_SYS_RESOURCE"
                );
                assert!(!has_resource_cap());
                let before = changes();
                as_root(|| assert!(!resource_cap()));
                assert_eq!(changes() - before, 4, "as_root changed more than the ids");
            }
            assert!(
                !resource_cap(),
                "dropped and taken back around every request"
            );
            let before = changes();
            {
                let _g = assume(&user);
                assert!(!resource_cap());
            }
            assert_eq!(
                changes() - before,
                4,
                "fsuid and fsgid there and back, nothing else"
            );
            {
                let _g = assume(&root);
                assert!(resource_cap(), "root, not squashed, lacks CAP_SYS_RESOURCE");
                {
                    let _inner = assume(&user);
                    assert!(!resource_cap());
                }
                assert!(resource_cap(), "the inner guard did not give it back");
                assert_eq!(fs_ids(), (0, 0));
            }
            assert!(resource_cap());
        })
        .join()
        .unwrap();
    }

    fn groups() -> Vec<u32> {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
        line.split_whitespace()
            .skip(1)
            .map(|g| g.parse().unwrap())
            .collect()
    }

    /// A guard gives back the identity before it, not root: one taken
    /// inside another leaves the outer one in force, groups included.
    /// Taking the identity the thread already has costs nothing.
    #[test]
    fn guards_nest() {
        std::thread::spawn(|| {
            let a = Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![1000, 7],
            };
            let b = Identity {
                uid: 2000,
                gid: 2000,
                groups: vec![],
            };
            let outer = assume(&a);
            {
                let _inner = assume(&b);
                assert_eq!(fs_ids(), (2000, 2000));
                assert!(groups().is_empty());
            }
            assert_eq!(fs_ids(), (1000, 1000));
            assert_eq!(groups(), vec![7, 1000]);
            let before = changes();
            {
                let _same = assume(&a);
                assert_eq!(fs_ids(), (1000, 1000));
            }
            assert_eq!(changes(), before, "re-taking the same identity made calls");
            assert_eq!(fs_ids(), (1000, 1000));
            drop(outer);
            assert_eq!(fs_ids(), (0, 0));
            assert!(groups().is_empty());
        })
        .join()
        .unwrap();
    }
}
