//! When a connection's own task may run a request's quick ops
//! ([`super::optable::flags::QUICK`]: creating, renaming and removing
//! names, small page-cache writes, listing directories) instead of handing
//! them to a worker thread.
//!
//! A hand-over costs a wake-up of another thread and two context
//! switches, as much as the op itself when the kernel has the directory
//! and inodes cached (about 13 us of a 45 us REMOVE on a 2-core machine).
//! But a task that runs an op cannot read its connection's next request,
//! nor run other connections' tasks, until the op is done. So a task runs
//! quick ops itself only:
//!
//! - when none of its connection's requests is on a worker (a count
//!   the connection keeps). Its other requests in flight are then answered
//!   on this task too, before or after, so none waits for a thread while
//!   this one runs: those buffered behind it wait for the op as they
//!   would for a cached READ answered here, and a client that keeps
//!   several small WRITEs in flight has all of them done here, without a
//!   wake-up each. While one is on a worker the quick ops go there too:
//!   beside it, they would contend for the same files' locks, the task
//!   asleep in the kernel meanwhile (pipelined 8 KiB WRITEs ran slower
//!   that way than all on workers);
//! - while fewer than `max` tasks (see [`Inline::new`]) are doing so (by default one
//!   per CPU, as many as the runtime has threads for connections);
//! - and not for [`PAUSE`] after an op run this way waited for storage:
//!   it slept in the kernel and took longer than [`SLOW`] while reading
//!   from storage itself (cold inodes or directories), or longer than
//!   [`LONG`] whatever it waited for (a full journal, writeback
//!   throttling, a lock held by a thread that waits for storage). Its ops
//!   then go to the workers, where waiting holds up no one else.
//!
//! A shorter wait that read nothing is most often for a lock that
//! another of the server's threads holds while it changes the same
//! directory: many clients creating or removing files in one directory
//! queue on the directory's lock. Sending the quick ops to the workers
//! then would put more threads in that queue, each wait with two context
//! switches more. On btrfs, 16 clients creating 3,000 files each in one
//! directory set the pause off 17-28 times a phase with such waits (4 to
//! 10 ms each), which kept the quick path off most of the time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// An op run on a connection's task that took this long, slept in the
/// kernel and read from storage meanwhile turns the quick path off for
/// [`PAUSE`].
pub const SLOW: Duration = Duration::from_millis(4);
/// An op run on a connection's task that took this long and slept in the
/// kernel, for whatever, turns the quick path off for [`PAUSE`].
pub const LONG: Duration = Duration::from_millis(20);
/// How long the quick path stays off after a slow op.
pub const PAUSE: Duration = Duration::from_millis(200);

/// WRITEs of at most this many bytes may be quick (UNSTABLE ones, into
/// the page cache).
pub const QUICK_WRITE: usize = 64 * 1024;

/// Whether an UNSTABLE WRITE of `len` bytes goes only into the page cache
/// and is small enough to be quick (not past it, see
/// `Config::direct_write_min`).
pub(super) fn small_cached_write(srv: &super::Server, len: usize) -> bool {
    let direct = srv.config.direct_write_min;
    len <= QUICK_WRITE && (direct == 0 || (len as u64) < direct)
}

/// How many connection tasks may be running quick ops, and whether any may.
#[derive(Debug)]
pub struct Inline {
    max: usize,
    busy: AtomicUsize,
    /// Milliseconds after `epoch` before which none may (0: no pause).
    off_until: AtomicU64,
    epoch: Instant,
    /// Calls answered on connection tasks after quick ops, and turns that
    /// were slow.
    answered: AtomicU64,
    slow: AtomicU64,
}

impl Inline {
    /// At most `max` at once; 0 turns the quick path off.
    pub fn new(max: usize) -> Self {
        Inline {
            max,
            busy: AtomicUsize::new(0),
            off_until: AtomicU64::new(0),
            epoch: Instant::now(),
            answered: AtomicU64::new(0),
            slow: AtomicU64::new(0),
        }
    }

    /// Calls answered on their connection's task after quick ops, and
    /// turns that were slow (see [`SLOW`]).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.answered.load(Ordering::Relaxed),
            self.slow.load(Ordering::Relaxed),
        )
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// A turn to run quick ops on this task, if one is free now.
    pub fn enter(&self) -> Option<Turn<'_>> {
        self.enter_at(Instant::now())
    }

    fn enter_at(&self, now: Instant) -> Option<Turn<'_>> {
        if self.max == 0 || self.millis(now) < self.off_until.load(Ordering::Relaxed) {
            return None;
        }
        self.busy
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |b| {
                (b < self.max).then_some(b + 1)
            })
            .ok()?;
        Some(Turn {
            gate: self,
            started: now,
            usage: thread_usage(),
        })
    }

    /// Ends a turn that began at `started`, `elapsed` later, in which the
    /// thread slept in the kernel or not, and read from storage or not.
    fn leave(&self, started: Instant, elapsed: Duration, slept: bool, read: bool) {
        let waited = slept && (elapsed > LONG || (read && elapsed > SLOW));
        if waited {
            self.slow.fetch_add(1, Ordering::Relaxed);
            let until = self.millis(started + elapsed + PAUSE);
            self.off_until.fetch_max(until, Ordering::Relaxed);
            tracing::debug!(
                took_us = elapsed.as_micros() as u64,
                read,
                "an op on a connection's task waited in the kernel; quick ops go to workers for a while"
            );
        }
        self.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Turn<'_> {
    /// The call was answered in this turn (for the counts).
    pub fn answered(&self) {
        self.gate.answered.fetch_add(1, Ordering::Relaxed);
    }
}

/// One task's turn at running quick ops; ends when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    gate: &'a Inline,
    started: Instant,
    /// The thread's sleeps and reads when the turn began.
    usage: Option<Usage>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        // Only a slow turn asks the kernel whether the thread slept:
        // being preempted on a busy machine is not waiting for storage.
        let (slept, read) = if elapsed > SLOW {
            match (self.usage, thread_usage()) {
                (Some(a), Some(b)) => (b.sleeps > a.sleeps, b.reads > a.reads),
                _ => (true, true),
            }
        } else {
            (false, false)
        };
        self.gate.leave(self.started, elapsed, slept, read);
    }
}

/// What the kernel counts of a thread's waits.
#[derive(Debug, Clone, Copy)]
struct Usage {
    /// Voluntary context switches: times it slept in the kernel (for
    /// storage, a lock or anything else).
    sleeps: i64,
    /// Reads it sent to storage, in 512-byte blocks (the file systems'
    /// reads of inodes, directories and their own metadata included).
    reads: i64,
}

/// The calling thread's [`Usage`] so far.
fn thread_usage() -> Option<Usage> {
    // SAFETY: all zeros is a valid rusage (integers and timevals).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (r == 0).then_some(Usage {
        sleeps: ru.ru_nvcsw,
        reads: ru.ru_inblock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_at_once() {
        let g = Inline::new(2);
        let a = g.enter().expect("first");
        let b = g.enter().expect("second");
        assert!(g.enter().is_none(), "a third turn while two are out");
        drop(a);
        let c = g.enter().expect("a turn is back");
        c.answered();
        drop((b, c));
        assert_eq!(g.counts(), (1, 0));
    }

    #[test]
    fn none_when_max_is_zero() {
        assert!(Inline::new(0).enter().is_none());
    }

    #[test]
    fn an_op_that_waited_for_storage_turns_the_quick_path_off_for_a_pause() {
        let g = Inline::new(4);
        let t0 = Instant::now();
        let turn = |slow: Duration, slept: bool, read: bool| {
            std::mem::forget(g.enter_at(t0).expect("on"));
            g.leave(t0, slow, slept, read);
        };
        // Fast; slow without sleeping (preempted); slow and slept, but
        // shorter than LONG and read nothing (a lock another thread
        // held): the path stays on.
        turn(Duration::from_micros(200), true, true);
        turn(SLOW + Duration::from_millis(1), false, true);
        turn(LONG + Duration::from_millis(1), false, false);
        turn(LONG - Duration::from_millis(1), true, false);
        assert_eq!(g.counts().1, 0);
        assert!(g.enter_at(t0).is_some());
        // Slow, slept and read from storage: off until a pause after it
        // ended.
        let slow = SLOW + Duration::from_millis(1);
        turn(slow, true, true);
        assert_eq!(g.counts().1, 1);
        let ended = t0 + slow;
        assert!(g.enter_at(ended).is_none(), "off right after");
        assert!(
            g.enter_at(ended + PAUSE / 2).is_none(),
            "off during the pause"
        );
        assert!(g
            .enter_at(ended + PAUSE + Duration::from_millis(2))
            .is_some());
        // Longer than LONG and slept, reading nothing: off too.
        let t1 = ended + PAUSE + Duration::from_millis(2);
        let long = LONG + Duration::from_millis(1);
        std::mem::forget(g.enter_at(t1).expect("on"));
        g.leave(t1, long, true, false);
        assert_eq!(g.counts().1, 2);
        assert!(g.enter_at(t1 + long).is_none(), "off after a long wait");
    }

    /// Reads `len` bytes of `path` with O_DIRECT, which go to storage.
    fn read_direct(path: &std::path::Path, len: usize) {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .expect("O_DIRECT open (the temporary directory must be on a disk file system)");
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size; freed below with the same layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!p.is_null());
        // SAFETY: p is valid for len bytes until freed.
        let buf = unsafe { std::slice::from_raw_parts_mut(p, len) };
        let n = f.read_at(buf, 0).expect("O_DIRECT read");
        assert_eq!(n, len);
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(p, layout) };
    }

    #[test]
    fn a_turn_that_read_from_storage_and_slept_is_seen_to() {
        let path = std::env::temp_dir().join(format!("sluice-inline-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 64 * 1024]).unwrap();
        std::fs::File::open(&path).unwrap().sync_all().unwrap();
        // The kernel counts the thread's reads from storage.
        let a = thread_usage().expect("getrusage");
        read_direct(&path, 64 * 1024);
        let b = thread_usage().expect("getrusage");
        assert!(
            b.reads > a.reads,
            "an O_DIRECT read of 64 KiB counted no blocks read"
        );
        // A turn that read from storage and slept past SLOW pauses.
        let g = Inline::new(1);
        let t = g.enter().expect("on");
        read_direct(&path, 64 * 1024);
        std::thread::sleep(SLOW + Duration::from_millis(1));
        drop(t);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(g.counts(), (0, 1));
        assert!(g.enter().is_none(), "off after a turn that read and slept");
    }

    #[test]
    fn a_turn_that_sleeps_is_seen_to() {
        let g = Inline::new(1);
        let t = g.enter().expect("on");
        std::thread::sleep(LONG + SLOW);
        drop(t);
        assert_eq!(g.counts(), (0, 1));
        assert!(g.enter().is_none(), "off after a turn that slept");
    }
}
