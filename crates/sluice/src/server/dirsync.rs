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

use std::collections::HashMap;
use std::io;
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
    /// Callers waiting for a sync to end.
    waiting: usize,
}

#[derive(Default)]
struct Dir {
    gen: Mutex<Gen>,
    ended: Condvar,
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
        let entry = {
            let mut dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
            let e = dirs.entry(dir).or_default();
            e.1 += 1;
            e.0.clone()
        };
        let r = wait_or_run(&entry, sync);
        let mut dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = dirs.get_mut(&dir) {
            e.1 -= 1;
            if e.1 == 0 {
                dirs.remove(&dir);
            }
        }
        r
    }
}

fn wait_or_run(d: &Dir, sync: impl FnOnce() -> io::Result<()>) -> (io::Result<()>, bool) {
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
            g.running = false;
            g.done = mine;
            g.failed = r
                .as_ref()
                .err()
                .map(|e| e.raw_os_error().unwrap_or(libc::EIO));
            d.ended.notify_all();
            return (r, true);
        }
        g.waiting += 1;
        g = d.ended.wait(g).unwrap_or_else(|e| e.into_inner());
        g.waiting -= 1;
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
