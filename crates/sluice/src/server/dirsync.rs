//! Directory syncs shared by the ops that need them at the same time
//! (group commit).
//!
//! On a `sync` export every op that changes a directory syncs it before
//! it is answered (see `ops_fs::commit_meta`). An op needs a sync that
//! *started* after its change; any such sync will do, whoever asked for
//! it. So while one sync of a directory runs, the ops that change that
//! directory meanwhile wait for it to end and then share the next one:
//! one sync for all of them instead of one each. Some file systems run
//! syncs of one directory one at a time anyway (btrfs holds the
//! directory's lock for the whole fsync), and the others flush the
//! device once per sync.
//!
//! An op that ran on a connection's task ([`DirSyncs::sync_async`])
//! waits without holding a thread: the sync it starts, if any, runs on a
//! blocking thread, and the task is woken when a sync that started after
//! its change has ended. Threads ([`DirSyncs::sync_job`]) and tasks
//! share the same syncs. The callers that come while a sync runs need
//! the next one: its runner starts that at once when it ends, and the
//! end of a sync wakes only the callers it served.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};

/// The directory, as (device, inode).
pub type DirKey = (u64, u64);

#[derive(Default)]
struct Gen {
    /// Syncs started, and the number of the last one that ended.
    started: u64,
    done: u64,
    running: bool,
    /// The errno of the last sync that ended, if it failed.
    failed: Option<i32>,
    /// Callers (threads and tasks) waiting for a sync to end.
    waiting: usize,
    /// The last sync a caller waits for that had not started when it
    /// came, while one ran that started before its change: the runner of
    /// that one starts it as soon as it ends (see [`run_chain`]).
    wanted: u64,
    /// Times a waiting thread was woken (by the end of a sync or
    /// spuriously), for the tests.
    #[cfg(test)]
    woken: u64,
}

/// A directory's syncs and their waiters. At most two syncs matter to
/// the callers waiting at any time: the one running and the next; a
/// caller waits on the condition (and, a task, the [`Notify`]) of its
/// sync's parity, so that the end of one sync wakes only the callers it
/// serves, not those who came during it and need the next.
///
/// [`Notify`]: tokio::sync::Notify
#[derive(Default)]
struct Dir {
    gen: Mutex<Gen>,
    /// Wakes the threads waiting, by the parity of the sync they need.
    ended: [Condvar; 2],
    /// Wakes the tasks waiting (see [`DirSyncs::sync_async`]), the same.
    ended_tasks: [tokio::sync::Notify; 2],
}

/// The parity of sync number `n`: which condition its waiters wait on.
fn parity(n: u64) -> usize {
    (n % 2) as usize
}

/// A directory sync that an op, which ran where it must not wait, left
/// for its COMPOUND to wait for before it is answered.
#[derive(Debug)]
pub struct Pending {
    /// The directory.
    pub dir: DirKey,
    /// A descriptor of the directory (O_PATH).
    pub fd: Arc<OwnedFd>,
}

/// Counts a caller in `dir`'s entry while it lives, and drops the entry
/// after the last one.
struct Use<'a> {
    syncs: &'a DirSyncs,
    key: DirKey,
    dir: Arc<Dir>,
}

impl<'a> Use<'a> {
    fn new(syncs: &'a DirSyncs, key: DirKey) -> Self {
        let mut dirs = syncs.dirs.lock().unwrap_or_else(|e| e.into_inner());
        let e = dirs.entry(key).or_default();
        e.1 += 1;
        Use {
            syncs,
            key,
            dir: e.0.clone(),
        }
    }
}

impl Drop for Use<'_> {
    fn drop(&mut self) {
        let mut dirs = self.syncs.dirs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = dirs.get_mut(&self.key) {
            e.1 -= 1;
            if e.1 == 0 {
                dirs.remove(&self.key);
            }
        }
    }
}

/// The directories being synced, and the ops waiting for them.
#[derive(Default)]
pub struct DirSyncs {
    /// Each directory in use, with the number of callers using it; it is
    /// dropped when none are.
    dirs: Mutex<HashMap<DirKey, (Arc<Dir>, usize)>>,
}

impl std::fmt::Debug for DirSyncs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirSyncs").finish_non_exhaustive()
    }
}

impl DirSyncs {
    /// Returns once a sync of `dir` that started after this call began
    /// has ended, running `sync` itself when no other caller is; the
    /// result is that sync's. Also says whether this caller ran it.
    pub fn sync(
        &self,
        dir: DirKey,
        sync: impl FnOnce() -> io::Result<()>,
    ) -> (io::Result<()>, bool) {
        let u = Use::new(self, dir);
        wait_or_run(&u.dir, sync, None)
    }

    /// [`DirSyncs::sync`] with a sync that can run again: when tasks
    /// came during the sync this caller ran (see
    /// [`DirSyncs::sync_async`]), a blocking thread starts the next one
    /// for them at once.
    pub fn sync_job(&self, dir: DirKey, sync: Job) -> (io::Result<()>, bool) {
        let u = Use::new(self, dir);
        let run = sync.clone();
        wait_or_run(&u.dir, move || run(), Some(&sync))
    }

    /// Whether a sync of `dir` is running now.
    pub fn running(&self, dir: DirKey) -> bool {
        let dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        dirs.get(&dir)
            .is_some_and(|e| e.0.gen.lock().unwrap_or_else(|e| e.into_inner()).running)
    }

    /// Like [`DirSyncs::sync`], for a task: a sync this caller must start
    /// runs `sync` on a blocking thread, which goes on at once with the
    /// next sync when tasks came during this one. Says whether this
    /// caller started the sync whose result it returns.
    pub async fn sync_async(&self, dir: DirKey, sync: Job) -> (io::Result<()>, bool) {
        let u = Use::new(self, dir);
        let d = &u.dir;
        let need = d.gen.lock().unwrap_or_else(|e| e.into_inner()).started + 1;
        let mut started = None;
        loop {
            // Listening before looking: an end between the look and the
            // wait is not missed.
            let woken = d.ended_tasks[parity(need)].notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            {
                let mut g = d.gen.lock().unwrap_or_else(|e| e.into_inner());
                if g.done >= need {
                    let r = match g.failed {
                        None => Ok(()),
                        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                    };
                    return (r, started == Some(g.done));
                }
                if !g.running {
                    g.running = true;
                    g.started += 1;
                    let mine = g.started;
                    started = Some(mine);
                    let (d, sync) = (d.clone(), sync.clone());
                    drop(crate::tasks::blocking(move || run_chain(&d, &sync, mine)));
                } else if g.started < need {
                    // The sync running started before this caller's change:
                    // its runner starts the next one as soon as it ends.
                    g.wanted = g.wanted.max(need);
                }
                g.waiting += 1;
            }
            let _counted = Waiting(d);
            woken.await;
        }
    }
}

/// Counts a task in [`Gen::waiting`] until dropped.
struct Waiting<'a>(&'a Dir);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.gen.lock().unwrap_or_else(|e| e.into_inner()).waiting -= 1;
    }
}

/// A directory's sync, as a task asks for it (see
/// [`DirSyncs::sync_async`]).
pub type Job = Arc<dyn Fn() -> io::Result<()> + Send + Sync>;

/// Runs sync number `mine` of `d`, and the next ones while tasks want
/// them.
fn run_chain(d: &Dir, sync: &Job, mut mine: u64) {
    loop {
        let r = sync();
        let mut g = d.gen.lock().unwrap_or_else(|e| e.into_inner());
        let again = g.wanted > mine;
        ended(d, &mut g, mine, &r, again);
        if !again {
            return;
        }
        g.started += 1;
        mine = g.started;
    }
}

/// Records the end of sync number `mine` of `d`, with its result, and
/// wakes the threads and tasks waiting for it; with `again`, the caller
/// starts the next sync at once, and those waiting for that one sleep
/// on. Without, they are woken too, and one of them starts it.
fn ended(d: &Dir, g: &mut Gen, mine: u64, r: &io::Result<()>, again: bool) {
    g.running = again;
    g.done = mine;
    g.failed = r
        .as_ref()
        .err()
        .map(|e| e.raw_os_error().unwrap_or(libc::EIO));
    if g.waiting == 0 {
        // No one to wake (a lone caller's sync): no futex calls. A task
        // counts itself under the lock held here before it waits.
        return;
    }
    let parities: &[u64] = if again { &[mine] } else { &[mine, mine + 1] };
    for &n in parities {
        d.ended[parity(n)].notify_all();
        d.ended_tasks[parity(n)].notify_waiters();
    }
}

fn wait_or_run(
    d: &Arc<Dir>,
    sync: impl FnOnce() -> io::Result<()>,
    chain: Option<&Job>,
) -> (io::Result<()>, bool) {
    let mut g = d.gen.lock().unwrap_or_else(|e| e.into_inner());
    // A sync running now may have started before this caller's change:
    // only the next one to start is sure to come after it.
    let need = g.started + 1;
    loop {
        if g.done >= need {
            let r = match g.failed {
                None => Ok(()),
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            };
            return (r, false);
        }
        if !g.running {
            g.running = true;
            g.started += 1;
            let mine = g.started;
            drop(g);
            let r = sync();
            let mut g = d.gen.lock().unwrap_or_else(|e| e.into_inner());
            let again = chain.is_some() && g.wanted > mine;
            ended(d, &mut g, mine, &r, again);
            if let (true, Some(job)) = (again, chain) {
                // Tasks came during this sync: the next one starts now,
                // on another thread, while this caller answers.
                g.started += 1;
                let next = g.started;
                drop(g);
                let (d, job) = (d.clone(), job.clone());
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => drop(crate::tasks::blocking_on(&rt, move || {
                        run_chain(&d, &job, next)
                    })),
                    Err(_) => run_chain(&d, &job, next),
                }
            }
            return (r, true);
        }
        if chain.is_some() && g.started < need {
            // The sync running started before this caller's change: its
            // runner starts the next one as soon as it ends, which wakes
            // this caller only when that one has ended too.
            g.wanted = g.wanted.max(need);
        }
        g.waiting += 1;
        g = d.ended[parity(need)]
            .wait(g)
            .unwrap_or_else(|e| e.into_inner());
        g.waiting -= 1;
        #[cfg(test)]
        {
            g.woken += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    #[test]
    fn a_lone_caller_runs_its_own_sync_and_gets_its_result() {
        let s = DirSyncs::default();
        let (r, ran) = s.sync((1, 2), || Ok(()));
        assert!(r.is_ok() && ran);
        let (r, ran) = s.sync((1, 2), || Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(
            (r.unwrap_err().raw_os_error(), ran),
            (Some(libc::EIO), true)
        );
        assert!(
            s.dirs.lock().unwrap().is_empty(),
            "entries outlived their callers"
        );
    }

    /// Tasks that come while a task's sync runs wait for the next one,
    /// which that sync's runner starts as soon as it ends (none of them
    /// starts it); all get its result. A task alone starts its own.
    #[test]
    fn tasks_during_a_sync_share_the_next_one_which_its_runner_starts() {
        tasks_during_a_sync(false);
    }

    /// The same when a thread ran the first sync (`sync_job`, a worker
    /// that ran its op's sync itself): it has the next one started
    /// before it returns.
    #[test]
    fn tasks_during_a_threads_sync_share_the_next_one_which_it_starts() {
        tasks_during_a_sync(true);
    }

    fn tasks_during_a_sync(first_on_thread: bool) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let s = Arc::new(DirSyncs::default());
        let syncs = Arc::new(AtomicUsize::new(0));
        let (first_in, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let job: Job = {
            let (syncs, first_in, release) = (syncs.clone(), first_in.clone(), release.clone());
            Arc::new(move || {
                if syncs.fetch_add(1, Ordering::SeqCst) == 0 {
                    first_in.wait();
                    release.wait();
                    return Ok(());
                }
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            })
        };
        let call = |s: &Arc<DirSyncs>| {
            let (s, job) = (s.clone(), job.clone());
            crate::tasks::spawn_on(rt.handle(), async move { s.sync_async((1, 1), job).await })
        };
        let first = if first_on_thread {
            let (s, job) = (s.clone(), job.clone());
            let t = std::thread::spawn(move || s.sync_job((1, 1), job));
            crate::tasks::spawn_on(rt.handle(), async move { t.join().unwrap() })
        } else {
            call(&s)
        };
        first_in.wait();
        let later: Vec<_> = (0..8).map(|_| call(&s)).collect();
        // All 8 wait, each wanting a sync that has not started.
        let entry = loop {
            if let Some(e) = s.dirs.lock().unwrap().get(&(1, 1)) {
                // A first task waits too; a first thread runs the sync.
                let first_waits = usize::from(!first_on_thread);
                if e.0.gen.lock().unwrap().waiting == 8 + first_waits {
                    break e.0.clone();
                }
            }
            std::thread::yield_now();
        };
        release.wait();
        // (The first task gets the result of the last sync that had ended
        // when it looked, which may be the second.)
        let _ = rt.block_on(first).unwrap();
        for t in later {
            let (r, ran) = rt.block_on(t).unwrap();
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
            assert!(
                !ran,
                "a waiting task started the sync its runner should have"
            );
        }
        assert_eq!(syncs.load(Ordering::SeqCst), 2, "one sync for the 8");
        assert_eq!(entry.gen.lock().unwrap().waiting, 0);
        let (r, ran) = rt.block_on(s.sync_async((2, 2), Arc::new(|| Ok(()))));
        assert!(r.is_ok() && ran);
        assert!(s.dirs.lock().unwrap().is_empty());
    }

    /// Threads (`sync_job`: workers whose op changed the directory) that
    /// come while a sync runs wait for the next one as tasks do: the end
    /// of the running sync leaves them asleep, its runner starts the
    /// next one (here on its own thread, outside a runtime), and only
    /// that one's end wakes them; none of them runs it.
    #[test]
    fn threads_during_a_sync_sleep_through_its_end_and_share_the_next() {
        let s = Arc::new(DirSyncs::default());
        let syncs = Arc::new(AtomicUsize::new(0));
        // For each of the two syncs: one barrier it waits at once inside,
        // one before it ends.
        let gates: Arc<Vec<(Barrier, Barrier)>> =
            Arc::new((0..2).map(|_| (Barrier::new(2), Barrier::new(2))).collect());
        let job: Job = {
            let (syncs, gates) = (syncs.clone(), gates.clone());
            Arc::new(move || {
                let n = syncs.fetch_add(1, Ordering::SeqCst);
                if let Some((inside, release)) = gates.get(n) {
                    inside.wait();
                    release.wait();
                }
                match n {
                    0 => Ok(()),
                    _ => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
                }
            })
        };
        let on_thread = |s: &Arc<DirSyncs>| {
            let (s, job) = (s.clone(), job.clone());
            std::thread::spawn(move || s.sync_job((1, 1), job))
        };
        let first = on_thread(&s);
        gates[0].0.wait();
        let later: Vec<_> = (0..8).map(|_| on_thread(&s)).collect();
        let entry = loop {
            if let Some(e) = s.dirs.lock().unwrap().get(&(1, 1)) {
                if e.0.gen.lock().unwrap().waiting == 8 {
                    break e.0.clone();
                }
            }
            std::thread::yield_now();
        };
        assert_eq!(entry.gen.lock().unwrap().wanted, 2);
        gates[0].1.wait();
        // The second sync runs: the 8 still wait, none woken by the end
        // of the first.
        gates[1].0.wait();
        let g = entry.gen.lock().unwrap();
        assert_eq!(
            (g.waiting, g.woken),
            (8, 0),
            "the end of the first sync woke callers that need the second"
        );
        drop(g);
        gates[1].1.wait();
        let (r, ran) = first.join().unwrap();
        assert!(
            r.is_ok() && ran,
            "the first caller gets its own sync's result"
        );
        for t in later {
            let (r, ran) = t.join().unwrap();
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
            assert!(!ran, "a waiting thread ran the sync its runner should have");
        }
        assert_eq!(syncs.load(Ordering::SeqCst), 2, "one sync for the 8");
        let g = entry.gen.lock().unwrap();
        assert_eq!((g.waiting, g.woken), (0, 8), "each waiter woken once");
        drop(g);
        assert!(s.dirs.lock().unwrap().is_empty());
    }

    /// Callers that arrive while a sync runs do not count it (it may have
    /// started before their change): they share the next one, run by one
    /// of them, and all get its result. Other directories are synced on
    /// their own.
    #[test]
    fn callers_during_a_sync_share_the_next_one() {
        let s = Arc::new(DirSyncs::default());
        let syncs = Arc::new(AtomicUsize::new(0));
        let (first_in, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let first = {
            let (s, syncs, first_in, release) =
                (s.clone(), syncs.clone(), first_in.clone(), release.clone());
            std::thread::spawn(move || {
                s.sync((1, 1), || {
                    syncs.fetch_add(1, Ordering::SeqCst);
                    first_in.wait();
                    release.wait();
                    Ok(())
                })
            })
        };
        // The first sync is running: 8 more callers come.
        first_in.wait();
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let (s, syncs) = (s.clone(), syncs.clone());
                std::thread::spawn(move || {
                    s.sync((1, 1), || {
                        syncs.fetch_add(1, Ordering::SeqCst);
                        Err(io::Error::from_raw_os_error(libc::ENOSPC))
                    })
                })
            })
            .collect();
        // All of them wait for the first sync to end before it may.
        let entry = loop {
            if let Some(e) = s.dirs.lock().unwrap().get(&(1, 1)) {
                if e.0.gen.lock().unwrap().waiting == 8 {
                    break e.0.clone();
                }
            }
            std::thread::yield_now();
        };
        let (r, ran) = s.sync((2, 2), || Ok(()));
        assert!(r.is_ok() && ran, "another directory waits for no one");
        release.wait();
        assert!(first.join().unwrap().0.is_ok());
        let results: Vec<_> = waiting.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            syncs.load(Ordering::SeqCst),
            2,
            "one sync for the 8 that came during the first"
        );
        assert_eq!(results.iter().filter(|r| r.1).count(), 1);
        for (r, _) in &results {
            assert_eq!(r.as_ref().unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        }
        assert_eq!(entry.gen.lock().unwrap().waiting, 0);
        assert!(s.dirs.lock().unwrap().is_empty());
    }
}
