//! Per-thread file system identity.
//!
//! The server runs as root and switches the file system identity of the
//! worker thread (fsuid, fsgid and supplementary groups) to the caller's for
//! the duration of a request, so the kernel checks permissions and gives new
//! files the caller's ownership. The calls are made as raw system calls,
//! which act on the calling thread only. A thread that serves requests may
//! keep the last caller's identity for that caller's next request
//! ([`lending`]); everything else it does first takes the server's back
//! ([`reclaim`]).

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
    /// Whether the outermost guard, when dropped, leaves the caller's
    /// identity on the thread (see [`lending`]).
    static LENDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The identity to give back (fsuid, fsgid, groups) while the thread
    /// keeps a caller's identity that no guard holds (see [`lending`]).
    static LENT: std::cell::RefCell<Option<(u32, u32, Vec<u32>)>> =
        const { std::cell::RefCell::new(None) };
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

/// The server's own identity (fsuid, fsgid, groups), once the server
/// has said which it is ([`drop_supplementary_groups`]).
static HOME: std::sync::OnceLock<(u32, u32, Vec<u32>)> = std::sync::OnceLock::new();

/// Gives up the process's own supplementary groups, in every thread
/// (the C library's setgroups applies to all of them). The server calls
/// it at start: a root started by `sudo` or a service manager often has
/// group 0 in its list, which every request that takes on a caller's
/// identity would otherwise have to drop and take back.
///
/// The calling thread's identity then is the server's own: [`reclaim`]
/// gives it to a thread that started with another (a thread inherits the
/// identity of the one that starts it, which may have been a caller's).
pub fn drop_supplementary_groups() -> std::io::Result<()> {
    // SAFETY: an empty list; no pointer is read.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    CURRENT.with(|c| c.borrow_mut().2.clear());
    let _ = HOME.set(CURRENT.with(|c| c.borrow().clone()));
    Ok(())
}

/// Takes the calling thread's identity as the server's own, unless one
/// was taken already ([`drop_supplementary_groups`] takes it) or the
/// thread holds or keeps a caller's. For a server started without
/// dropping its groups (in tests, say): [`reclaim`] then has an identity
/// to give back to threads that started with a caller's.
pub fn settle_home() {
    if DEPTH.with(|d| d.get()) == 0 && !lent() {
        let _ = HOME.set(CURRENT.with(|c| c.borrow().clone()));
    }
}

/// Whether the thread's identity is not the server's own while no guard
/// holds one (see [`drop_supplementary_groups`]).
fn strayed() -> bool {
    let Some(home) = HOME.get() else {
        return false;
    };
    DEPTH.with(|d| d.get()) == 0
        && CURRENT.with(|c| {
            let c = c.borrow();
            c.0 != home.0 || c.1 != home.1 || !same_groups(&c.2, &home.2)
        })
}

/// Credential changes of all threads (see [`changes_total`]).
static TOTAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The credential changes all threads have made so far (see
/// [`changes`]), for the server's metrics.
pub fn changes_total() -> u64 {
    TOTAL.load(std::sync::atomic::Ordering::Relaxed)
}

fn counted(n: u64) {
    if n == 0 {
        return;
    }
    CHANGES.with(|c| c.set(c.get() + n));
    TOTAL.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// Whether two lists of groups are the same. Two empty lists are told
/// apart by their lengths alone: an empty `Vec`'s pointer is dangling,
/// and the C library's `memcmp` that `==` calls for it took 70-140 ns
/// on an AMD EPYC virtual machine (its vector load of the dangling
/// address, masked off but faulting) against about 1 ns for one group;
/// callers squashed to nobody, or with no groups, compare empty lists
/// several times a request.
fn same_groups(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

fn set_groups(groups: &[u32]) {
    let same = CURRENT.with(|c| same_groups(&c.borrow().2, groups));
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
    /// Whether a thread that lends keeps the identity after the guard
    /// (see [`assume_kept`]).
    keep: bool,
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
    assume_with(id, false)
}

/// [`assume`] for a request's own identity: the guard a COMPOUND or an
/// NFSv3 procedure runs under. When it is the outermost guard of a
/// thread that lends (see [`lending`]), the thread keeps the identity
/// after it. Guards taken for one step of a request (an open, a lock
/// check) give the identity back whatever the thread does: what follows
/// them may be the server's own work.
pub fn assume_kept(id: &Identity) -> IdentityGuard {
    assume_with(id, true)
}

fn assume_with(id: &Identity, keep: bool) -> IdentityGuard {
    // A caller's identity left on the thread: this guard gives back the
    // one from before it, as if it had been given back already.
    let (uid, gid, groups) = match LENT.with(|l| l.borrow_mut().take()) {
        Some((uid, gid, groups)) => (
            uid,
            gid,
            (!same_groups(&groups, &id.groups)).then_some(groups),
        ),
        None => CURRENT.with(|c| {
            let c = c.borrow();
            (
                c.0,
                c.1,
                (!same_groups(&c.2, &id.groups)).then(|| c.2.clone()),
            )
        }),
    };
    set_groups(&id.groups);
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
        keep,
        _thread: std::marker::PhantomData,
    }
}

impl Drop for IdentityGuard {
    fn drop(&mut self) {
        let outermost = DEPTH.with(|d| {
            let n = d.get();
            d.set(n.saturating_sub(1));
            n <= 1
        });
        if outermost && self.keep && LENDING.with(|l| l.get()) {
            // The identity stays (see `lending`); what to give back is
            // remembered instead.
            let groups = self
                .groups
                .take()
                .unwrap_or_else(|| CURRENT.with(|c| c.borrow().2.clone()));
            LENT.with(|l| *l.borrow_mut() = Some((self.uid, self.gid, groups)));
            return;
        }
        set_fs_ids(self.uid, self.gid);
        if let Some(g) = &self.groups {
            set_groups(g);
        }
        if let Some(had) = self.resource {
            set_resource_cap(had);
        }
    }
}

/// Runs `f` with the thread lending its callers' identities: the
/// outermost guard dropped in `f` leaves the caller's identity on the
/// thread rather than giving back the one from before, and remembers
/// that one. The next guard then costs nothing when it takes the same
/// identity again (and gives back the remembered one when it is dropped
/// outside `lending`); anything else the thread does must first call
/// [`reclaim`], or [`keep_lent_for`] where it would run as a caller.
///
/// For the threads that serve requests: two requests of one caller in
/// a row then change no credentials, where each took four (the fsuid and
/// fsgid there and back), at about 2 us each on a 2-CPU machine.
pub fn lending<T>(f: impl FnOnce() -> T) -> T {
    // A thread started by one that ran as a caller has that caller's
    // identity: as good as lent.
    if !lent() && strayed() {
        let home = HOME.get().cloned();
        LENT.with(|l| *l.borrow_mut() = home);
    }
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            LENDING.with(|l| l.set(self.0));
        }
    }
    let _reset = Reset(LENDING.with(|l| l.replace(true)));
    f()
}

/// Gives the thread back the identity a caller's was lent over (see
/// [`lending`]), or the server's own to a thread that started with
/// another (see [`drop_supplementary_groups`]); nothing while a guard
/// holds an identity, or when the thread has its own.
pub fn reclaim() {
    if DEPTH.with(|d| d.get()) > 0 {
        return;
    }
    let lent = LENT.with(|l| l.borrow_mut().take());
    if let Some((uid, gid, groups)) = HOME.get().or(lent.as_ref()) {
        set_fs_ids(*uid, *gid);
        set_groups(groups);
    }
}

/// Whether the thread keeps a caller's identity that no guard holds
/// (see [`lending`]).
pub fn lent() -> bool {
    LENT.with(|l| l.borrow().is_some())
}

/// Keeps the identity the thread was lent when `id` is that identity
/// and `as_caller` says the work to come would take it at once (its
/// first guard then costs nothing); otherwise gives the thread back its
/// own ([`reclaim`]). Nothing runs as a caller it would not run as.
pub fn keep_lent_for(id: &Identity, as_caller: bool) {
    if !lent() {
        return;
    }
    let same = as_caller
        && CURRENT.with(|c| {
            let c = c.borrow();
            c.0 == id.uid && c.1 == id.gid && same_groups(&c.2, &id.groups)
        });
    if !same {
        reclaim();
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
    // Given back also when `f` panics.
    struct Back(u32, u32);
    impl Drop for Back {
        fn drop(&mut self) {
            set_fs_ids(self.0, self.1);
        }
    }
    set_fs_ids(0, 0);
    let _back = Back(old_uid, old_gid);
    f()
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

    #[test]
    fn lists_of_groups_are_the_same_when_their_groups_are() {
        let none: Vec<u32> = Vec::new();
        let with_room: Vec<u32> = Vec::with_capacity(4);
        assert!(same_groups(&none, &with_room));
        assert!(same_groups(&[5, 6], &[5, 6]));
        assert!(!same_groups(&none, &[0]));
        assert!(!same_groups(&[5, 6], &[6, 5]));
        assert!(!same_groups(&[5], &[5, 6]));
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
            let root = id(0, &[]);
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
            let a = id(1000, &[]);
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
            let nobody = id(65534, &[]);
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
            let user = id(1000, &[]);
            let root = id(0, &[]);
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

    /// Identity `uid`, group `uid`, with `groups`.
    fn id(uid: u32, groups: &[u32]) -> Identity {
        Identity {
            uid,
            gid: uid,
            groups: groups.to_vec(),
        }
    }

    /// A thread that lends its callers' identities keeps the caller's
    /// after the outermost guard: the same caller again changes nothing,
    /// and the identity from before comes back at `reclaim`, at a guard
    /// dropped outside `lending`, and at `keep_lent_for` with another
    /// caller or for work that would not run as the caller.
    #[test]
    fn lending_keeps_a_callers_identity_until_reclaimed() {
        std::thread::spawn(|| {
            let (a, b) = (id(1000, &[1000, 7]), id(2000, &[]));
            let before = changes();
            lending(|| drop(assume_kept(&a)));
            assert_eq!(fs_ids(), (1000, 1000), "the identity was given back");
            assert_eq!(groups(), vec![7, 1000]);
            assert!(lent());
            assert_eq!(changes() - before, 3, "groups, fsgid and fsuid, once");
            // The same caller again: no calls, there or back.
            let before = changes();
            lending(|| {
                keep_lent_for(&a, true);
                let _g = assume_kept(&a);
                assert_eq!(fs_ids(), (1000, 1000));
                as_root(|| assert_eq!(fs_ids(), (0, 0)));
                // A guard inside keeps the outer one's identity.
                {
                    let _inner = assume_kept(&b);
                    assert_eq!(fs_ids(), (2000, 2000));
                }
                assert_eq!(fs_ids(), (1000, 1000));
            });
            assert_eq!(fs_ids(), (1000, 1000));
            // as_root: fsuid and fsgid there and back; the inner guard:
            // those and the groups.
            assert_eq!(changes() - before, 10, "as_root and the inner guard only");
            let before = changes();
            lending(|| drop(assume_kept(&a)));
            assert_eq!(
                changes(),
                before,
                "the same caller again changed credentials"
            );
            // Work that would not take the caller's identity gets the
            // server's back.
            keep_lent_for(&a, false);
            assert!(!lent());
            assert_eq!(fs_ids(), (0, 0));
            assert!(groups().is_empty());
            // Another caller: the same.
            lending(|| drop(assume_kept(&a)));
            keep_lent_for(&b, true);
            assert_eq!((fs_ids(), lent()), ((0, 0), false));
            // `reclaim`, and a guard dropped outside `lending`.
            lending(|| drop(assume_kept(&b)));
            assert_eq!(fs_ids(), (2000, 2000));
            reclaim();
            assert_eq!((fs_ids(), lent()), ((0, 0), false));
            lending(|| drop(assume_kept(&b)));
            drop(assume_kept(&b));
            assert_eq!((fs_ids(), lent()), ((0, 0), false));
            assert!(groups().is_empty());
            // A guard for one step of a request gives the identity back
            // even on a thread that lends, also one it kept before.
            lending(|| drop(assume(&a)));
            assert_eq!(
                (fs_ids(), lent()),
                ((0, 0), false),
                "a step's guard kept its identity"
            );
            lending(|| drop(assume_kept(&a)));
            lending(|| drop(assume(&a)));
            assert_eq!((fs_ids(), lent()), ((0, 0), false));
            // A panic inside `lending` ends it.
            let r = std::panic::catch_unwind(|| lending(|| panic!("in a request")));
            assert!(r.is_err());
            drop(assume_kept(&a));
            assert_eq!(
                (fs_ids(), lent()),
                ((0, 0), false),
                "still lending after a panic"
            );
        })
        .join()
        .unwrap();
    }

    /// Once the server has said which identity is its own, a thread
    /// started by one that ran as a caller gets it back at `reclaim`, and
    /// `lending` takes the inherited identity for a lent one: kept for
    /// that caller, given back for any other. Runs in a process of its
    /// own (the groups are dropped for every thread of the process).
    #[test]
    fn threads_started_as_a_caller_find_the_servers_identity() {
        const NAME: &str = "cred::tests::threads_started_as_a_caller_find_the_servers_identity";
        const INNER: &str = "SLUICE_TEST_SERVERS_IDENTITY";
        if std::env::var_os(INNER).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--test-threads=1"])
                .env(INNER, "1")
                .output()
                .expect("the test binary runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "in a process of its own: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        drop_supplementary_groups().unwrap();
        let (a, b) = (id(1000, &[]), id(2000, &[]));
        std::thread::spawn(move || {
            let _g = assume(&a);
            let (a2, b2) = (a.clone(), b.clone());
            std::thread::spawn(move || {
                assert_eq!(fs_ids(), (1000, 1000), "not inherited");
                reclaim();
                assert_eq!(fs_ids(), (0, 0), "reclaim left the inherited identity");
            })
            .join()
            .unwrap();
            std::thread::spawn(move || {
                let before = changes();
                lending(|| {
                    keep_lent_for(&a2, true);
                    drop(assume_kept(&a2));
                });
                assert_eq!(
                    changes(),
                    before,
                    "the inherited caller's identity taken again"
                );
                assert!(lent());
                reclaim();
                assert_eq!((fs_ids(), lent()), ((0, 0), false));
            })
            .join()
            .unwrap();
            std::thread::spawn(move || {
                lending(|| keep_lent_for(&b2, true));
                assert_eq!(
                    (fs_ids(), lent()),
                    ((0, 0), false),
                    "kept for another caller"
                );
            })
            .join()
            .unwrap();
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
            let a = id(1000, &[1000, 7]);
            let b = id(2000, &[]);
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
