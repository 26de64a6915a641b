//! The attributes of files a listing stat'ed, kept for a moment so that
//! the next listings of the directory need not stat every entry again:
//! the stat is most of what a listing with attributes costs (on btrfs,
//! 59% of the server's CPU), and many clients list the same directory.
//!
//! What is kept stays right because a fanotify group with a mark on the
//! whole file system hears of every change to a kept inode: its data or
//! size (`FAN_MODIFY`: write, truncate, fallocate, copy and clone into
//! it), its attributes (`FAN_ATTRIB`: mode, owner, times, extended
//! attributes, link count), a rename (`FAN_MOVE_SELF`, which changes its
//! ctime) and its delete (`FAN_DELETE_SELF`). The kernel queues the
//! event inside the system call that made the change, so reading the
//! group before answering from the cache sees every change that ended
//! before. The same ticket as the memo of handles ([`crate::handle_memo`])
//! keeps a stat from being kept when a change of its inode was read
//! between the stat and the keeping.
//!
//! What no event reports is kept at most [`KEEP_FOR`]: data written
//! through a shared mapping (the kernel updates the times at the first
//! write to a page, without an event), access times, and changes to
//! allocated blocks made by the file system on its own (xfs trimming the
//! space it allocated ahead). Clients cache attributes for longer than
//! that (Linux: 3 s at least).
//!
//! Only non-directories are kept (a directory may have a file system
//! mounted on it, which has no event), only inodes of the watched
//! device, and only on ext4, xfs and btrfs (file ids this module reads,
//! and no changes made by other machines), where the number a directory
//! entry gives is the one a stat gives: a listing looks an entry up by
//! that number. Nothing is kept without CAP_SYS_ADMIN.

use crate::fs::Stat;
use crate::handle_memo::{drain, mark, watch_on, Inner};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long attributes are kept at most (see the module's text).
pub const KEEP_FOR: Duration = Duration::from_secs(1);

/// Inodes kept at most; the cache starts again empty when full.
const LIMIT: usize = 256 * 1024;

/// The events that change what a stat shows.
const EVENTS: u64 =
    libc::FAN_MODIFY | libc::FAN_ATTRIB | libc::FAN_MOVE_SELF | libc::FAN_DELETE_SELF;

/// The cache of one exported file system.
///
/// The mark on the file system is there only while listings use the
/// cache: with it, every write on the file system queues an event (16
/// clients creating files on btrfs, each mark kept: 153-185 us of server
/// CPU per create, against 129-148 without the cache). The
/// server's timer calls [`AttrCache::rest`] every second, which takes the
/// mark away when no listing came since; the next listing puts it back.
#[derive(Debug)]
pub struct AttrCache {
    /// The fanotify group (non-blocking), and a descriptor on the file
    /// system to mark it through; None: nothing is kept.
    group: Option<(OwnedFd, OwnedFd)>,
    /// The device of the watched directory: only its inodes are kept.
    dev: u64,
    /// How long an inode's attributes are kept.
    keep_for: Duration,
    inner: Mutex<Kept>,
    /// Whether a listing used the cache since the last [`AttrCache::rest`].
    used: AtomicBool,
    /// Attributes answered from the cache (for tests and metrics).
    hits: AtomicU64,
}

/// The attributes kept, and whether the file system is marked.
#[derive(Debug, Default)]
struct Kept {
    inner: Inner<(Stat, Instant)>,
    marked: bool,
}

/// The count of events read when the stats to keep were about to be made
/// (see [`AttrCache::get_all`]).
#[derive(Debug, Clone, Copy)]
pub struct Ticket(u64);

impl AttrCache {
    /// A cache that keeps nothing.
    pub fn off() -> Self {
        AttrCache {
            group: None,
            dev: 0,
            keep_for: Duration::ZERO,
            inner: Mutex::default(),
            used: AtomicBool::new(false),
            hits: AtomicU64::new(0),
        }
    }

    /// A cache for the file system holding `dir` (not an O_PATH
    /// descriptor) that keeps attributes for `keep_for`; one that keeps
    /// nothing when `keep_for` is zero or fanotify cannot watch the file
    /// system, saying why.
    pub fn watch(dir: BorrowedFd<'_>, keep_for: Duration) -> Self {
        if keep_for.is_zero() {
            return Self::off();
        }
        let marked_through = match crate::fs::reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::info!("listings stat every entry: {e}");
                return Self::off();
            }
        };
        match watch_on(dir, EVENTS) {
            Ok((group, dev)) => AttrCache {
                group: Some((group, marked_through)),
                dev,
                keep_for,
                inner: Mutex::new(Kept {
                    inner: Inner::default(),
                    marked: true,
                }),
                used: AtomicBool::new(false),
                hits: AtomicU64::new(0),
            },
            Err(why) => {
                tracing::info!("listings stat every entry: {why}");
                Self::off()
            }
        }
    }

    /// Whether the cache keeps attributes at all.
    pub fn on(&self) -> bool {
        self.group.is_some()
    }

    /// Reads the events queued so far, then gives the kept attributes of
    /// each inode number asked, entries of a directory on device `dev`
    /// (None: not asked, or not kept), and the ticket to keep the stats
    /// made next with.
    pub fn get_all(
        &self,
        dev: u64,
        inos: impl IntoIterator<Item = Option<u64>>,
    ) -> (Vec<Option<Stat>>, Ticket) {
        let Some((group, fs)) = self.group.as_ref().filter(|_| dev == self.dev) else {
            return (inos.into_iter().map(|_| None).collect(), Ticket(0));
        };
        self.used.store(true, Ordering::Relaxed);
        let mut k = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !k.marked {
            // Back in use: stats made from now on are watched.
            if let Err(e) = mark(group, fs.as_fd(), libc::FAN_MARK_ADD, EVENTS) {
                tracing::warn!("the attribute cache cannot watch the file system again: {e}");
                return (inos.into_iter().map(|_| None).collect(), Ticket(0));
            }
            k.marked = true;
            k.inner.forget_all();
        }
        let g = &mut k.inner;
        drain(group, g);
        let now = Instant::now();
        let mut hits = 0;
        let found = inos
            .into_iter()
            .map(|ino| {
                let (st, at) = g.kept.get(&ino?)?;
                if now.saturating_duration_since(*at) >= self.keep_for {
                    return None;
                }
                hits += 1;
                Some(*st)
            })
            .collect();
        let ticket = Ticket(g.events());
        drop(k);
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
        (found, ticket)
    }

    /// Keeps `stats`, made after `ticket` was taken, of the inodes they
    /// describe that may be kept (non-directories of the watched device),
    /// but not those of inodes whose change was read since: the stat may
    /// be older than the change.
    pub fn keep<'s>(&self, ticket: Ticket, stats: impl IntoIterator<Item = &'s Stat>) {
        let Some((group, _)) = &self.group else {
            return;
        };
        let now = Instant::now();
        let mut stats = stats
            .into_iter()
            .filter(|st| st.dev == self.dev && !st.is_dir())
            .peekable();
        if stats.peek().is_none() {
            return;
        }
        let mut k = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !k.marked {
            return;
        }
        let g = &mut k.inner;
        drain(group, g);
        let gone = g.gone_since(ticket.0);
        if g.kept.len() >= LIMIT {
            g.kept.clear();
        }
        for st in stats {
            if !gone.has(st.ino) {
                g.kept.insert(st.ino, (*st, now));
            }
        }
    }

    /// From the server's timer, every second: reads the events queued
    /// (a short queue keeps each new event cheap: the kernel compares it
    /// with those queued), and when no listing used the cache since the
    /// last call, forgets everything and takes the mark away.
    pub fn rest(&self) {
        let Some((group, fs)) = &self.group else {
            return;
        };
        let used = self.used.swap(false, Ordering::Relaxed);
        let mut k = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !k.marked {
            return;
        }
        if !used {
            if let Err(e) = mark(group, fs.as_fd(), libc::FAN_MARK_REMOVE, EVENTS) {
                tracing::warn!("the attribute cache cannot stop watching the file system: {e}");
            }
            k.marked = false;
            k.inner.kept.clear();
        }
        // Also what was queued before the mark went: a stale queue.
        drain(group, &mut k.inner);
        if !used {
            k.inner.forget_all();
        }
    }

    /// Whether the file system is marked (for tests).
    pub fn watching(&self) -> bool {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).marked
    }

    /// Inodes kept, and attributes answered from the cache (for tests
    /// and metrics).
    pub fn counts(&self) -> (usize, u64) {
        let kept = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .inner
            .kept
            .len();
        (kept, self.hits.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs;
    use std::ffi::CStr;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// A directory next to the build (a disk file system, as exports
    /// are), removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str, files: &[&str]) -> Dir {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!(".sluice-attrs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).expect("a directory next to the build");
            for n in files {
                std::fs::write(p.join(n), n).unwrap();
            }
            Dir(p)
        }

        fn file(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A cache watching `d`, which must keep attributes (tests run as
    /// root, on a disk file system).
    fn cache_on(d: &Dir, keep_for: Duration) -> (std::fs::File, AttrCache) {
        let dir = std::fs::File::open(&d.0).unwrap();
        let c = AttrCache::watch(dir.as_fd(), keep_for);
        assert!(
            c.on(),
            "fanotify cannot watch the build's file system (tests run as root)"
        );
        (dir, c)
    }

    /// The device of directory `dir`.
    fn dev_of(dir: &std::fs::File) -> u64 {
        fs::stat(dir.as_fd()).unwrap().dev
    }

    /// Looks `name` up in the cache as a listing does: by its number,
    /// then stats it and keeps the stat when it was not found. Gives what
    /// the listing would answer.
    fn list(c: &AttrCache, dir: &std::fs::File, name: &CStr) -> (Stat, bool) {
        let ino = fs::stat_at(dir.as_fd(), name).unwrap().ino;
        let (found, ticket) = c.get_all(dev_of(dir), [Some(ino)]);
        if let Some(st) = found[0] {
            return (st, true);
        }
        let st = fs::stat_at(dir.as_fd(), name).unwrap();
        c.keep(ticket, [&st]);
        (st, false)
    }

    /// What a listing answers for `name` now: kept attributes must be
    /// the ones a stat gives.
    fn listed_right(c: &AttrCache, dir: &std::fs::File, name: &CStr, what: &str) {
        let (st, from_cache) = list(c, dir, name);
        assert!(from_cache, "{what}: not kept");
        assert_eq!(st, fs::stat_at(dir.as_fd(), name).unwrap(), "{what}: stale");
    }

    /// A change a local process makes to a file, and what it is.
    type Change<'a> = (&'static str, Box<dyn Fn() + 'a>);

    #[test]
    fn kept_attributes_follow_every_change_made_through_a_system_call() {
        let d = Dir::new("changes", &["a", "b"]);
        let (dir, c) = cache_on(&d, Duration::from_secs(3600));
        let (_, from_cache) = list(&c, &dir, c"a");
        assert!(!from_cache);
        listed_right(&c, &dir, c"a", "unchanged");
        let changes: [Change<'_>; 7] = [
            (
                "write",
                Box::new(|| std::fs::write(d.file("a"), b"longer data").unwrap()),
            ),
            (
                "truncate",
                Box::new(|| {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(d.file("a"))
                        .unwrap()
                        .set_len(3)
                        .unwrap()
                }),
            ),
            (
                "chmod",
                Box::new(|| {
                    std::fs::set_permissions(d.file("a"), std::fs::Permissions::from_mode(0o600))
                        .unwrap()
                }),
            ),
            (
                "times",
                Box::new(|| {
                    let f = std::fs::File::open(d.file("a")).unwrap();
                    f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(7))
                        .unwrap()
                }),
            ),
            (
                "link",
                Box::new(|| std::fs::hard_link(d.file("a"), d.file("a2")).unwrap()),
            ),
            (
                "unlink",
                Box::new(|| std::fs::remove_file(d.file("a2")).unwrap()),
            ),
            (
                "rename",
                Box::new(|| std::fs::rename(d.file("a"), d.file("a3")).unwrap()),
            ),
        ];
        let mut name = c"a";
        for (what, change) in changes {
            // Kept first, then changed: the next listing must see it.
            list(&c, &dir, name);
            listed_right(&c, &dir, name, "kept");
            change();
            if what == "rename" {
                name = c"a3";
            }
            let (st, from_cache) = list(&c, &dir, name);
            assert!(
                !from_cache,
                "{what}: answered from the cache after the change"
            );
            assert_eq!(st, fs::stat_at(dir.as_fd(), name).unwrap(), "{what}: stale");
            listed_right(&c, &dir, name, what);
        }
        // Another file's change does not cost this one its place.
        list(&c, &dir, c"b");
        std::fs::write(d.file("a3"), b"again").unwrap();
        listed_right(&c, &dir, c"b", "another file changed");
    }

    #[test]
    fn a_change_read_between_the_stat_and_the_keeping_is_not_kept_over() {
        let d = Dir::new("race", &["a"]);
        let (dir, c) = cache_on(&d, Duration::from_secs(3600));
        let ino = fs::stat_at(dir.as_fd(), c"a").unwrap().ino;
        let (_, ticket) = c.get_all(dev_of(&dir), [Some(ino)]);
        let old = fs::stat_at(dir.as_fd(), c"a").unwrap();
        // Changed after the stat; another listing reads the event before
        // this one keeps its stat.
        std::fs::write(d.file("a"), b"changed meanwhile").unwrap();
        c.get_all(dev_of(&dir), [None]);
        c.keep(ticket, [&old]);
        let (st, _) = list(&c, &dir, c"a");
        assert_eq!(
            st,
            fs::stat_at(dir.as_fd(), c"a").unwrap(),
            "the older stat was kept"
        );
    }

    #[test]
    fn attributes_are_kept_for_their_time_only() {
        let d = Dir::new("time", &["a"]);
        let (dir, c) = cache_on(&d, Duration::from_millis(1));
        list(&c, &dir, c"a");
        let kept_at = Instant::now();
        // Not a wait for something to happen: the time kept must pass.
        while kept_at.elapsed() < Duration::from_millis(2) {
            std::thread::yield_now();
        }
        let (_, from_cache) = list(&c, &dir, c"a");
        assert!(!from_cache, "kept past its time");
    }

    #[test]
    fn an_unused_cache_stops_watching_and_starts_again_when_used() {
        let d = Dir::new("rest", &["a"]);
        let (dir, c) = cache_on(&d, Duration::from_secs(3600));
        list(&c, &dir, c"a");
        c.rest();
        assert!(c.watching(), "used since the start, yet the mark went");
        listed_right(&c, &dir, c"a", "after a rest while in use");
        c.rest();
        c.rest();
        assert!(!c.watching(), "unused, yet still watching");
        assert_eq!(c.counts().0, 0, "kept while nothing watches");
        // Changed while nothing watched: the next listing stats it.
        std::fs::write(d.file("a"), b"changed while unwatched").unwrap();
        let (st, from_cache) = list(&c, &dir, c"a");
        assert!(c.watching());
        assert!(!from_cache);
        assert_eq!(st, fs::stat_at(dir.as_fd(), c"a").unwrap());
        listed_right(&c, &dir, c"a", "watched again");
        std::fs::write(d.file("a"), b"and changed again").unwrap();
        assert!(
            !list(&c, &dir, c"a").1,
            "a change missed once watched again"
        );
    }

    #[test]
    fn directories_and_other_devices_are_not_kept() {
        let d = Dir::new("dirs", &["a"]);
        std::fs::create_dir(d.file("sub")).unwrap();
        let (dir, c) = cache_on(&d, Duration::from_secs(3600));
        let sub = fs::stat_at(dir.as_fd(), c"sub").unwrap();
        let a = fs::stat_at(dir.as_fd(), c"a").unwrap();
        let elsewhere = Stat {
            dev: a.dev + 1,
            ino: a.ino + 1_000_000,
            ..a
        };
        let (_, t) = c.get_all(dev_of(&dir), [None]);
        c.keep(t, [&sub, &elsewhere]);
        assert_eq!(c.counts().0, 0);
        // Nor is a kept inode answered for a directory of another device
        // (a btrfs subvolume numbers its inodes on its own).
        list(&c, &dir, c"a");
        assert_eq!(c.counts().0, 1);
        let (found, _) = c.get_all(a.dev + 1, [Some(a.ino)]);
        assert_eq!(found, [None]);
        assert_eq!(c.get_all(a.dev, [Some(a.ino)]).0, [Some(a)]);
    }

    #[test]
    fn a_cache_that_is_off_keeps_nothing() {
        let d = Dir::new("off", &["a"]);
        let dir = std::fs::File::open(&d.0).unwrap();
        for c in [
            AttrCache::off(),
            AttrCache::watch(dir.as_fd(), Duration::ZERO),
        ] {
            assert!(!c.on());
            list(&c, &dir, c"a");
            assert!(!list(&c, &dir, c"a").1);
            assert_eq!(c.counts(), (0, 0));
        }
    }
}
