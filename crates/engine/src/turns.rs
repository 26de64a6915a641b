//! Turns: one writer at a time per file, waiting asleep.
//!
//! A buffered write holds its file's inode lock for the whole copy into
//! the page cache, and the kernel lets a writer that finds it taken spin
//! while the holder runs. Large writes to one file, several in flight,
//! then keep a second CPU spinning for as long as a copy takes: in a
//! profile of a server taking a 1 GiB stream of 1 MiB WRITEs (8 in
//! flight) into new page-cache pages, 15-22% of its CPU was
//! `rwsem_spin_on_owner`. Taking turns here first, asleep, leaves that CPU
//! to the network and the clients; the copies were one at a time anyway.
//! Small writes do not take turns: their copies are short, and handing a
//! turn over costs a wake-up.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A file's turn: whether it is taken, and how many writers sleep
/// waiting for it.
#[derive(Default)]
struct Turn {
    state: Mutex<(bool, usize)>,
    free: Condvar,
}

/// A file by device and inode.
type Key = (u64, u64);

/// The turns of the files being written: each with the writers holding or
/// waiting for it, dropped when none is left.
#[derive(Default)]
pub struct Turns {
    files: Mutex<HashMap<Key, (usize, Arc<Turn>)>>,
}

/// A turn held; dropping it gives the turn to the next writer.
pub struct Held<'a> {
    turns: &'a Turns,
    key: Key,
    turn: Arc<Turn>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Turns {
    /// Turns for no file yet.
    pub fn new() -> Turns {
        Turns::default()
    }

    /// Waits for `key`'s turn and takes it; also says whether it had to
    /// wait (another writer of the file held it).
    pub fn take(&self, key: Key) -> (Held<'_>, bool) {
        let turn = {
            let mut files = lock(&self.files);
            let entry = files.entry(key).or_default();
            entry.0 += 1;
            entry.1.clone()
        };
        let mut state = lock(&turn.state);
        let waited = state.0;
        if waited {
            state.1 += 1;
            while state.0 {
                state = turn.free.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            state.1 -= 1;
        }
        state.0 = true;
        drop(state);
        let held = Held {
            turns: self,
            key,
            turn,
        };
        (held, waited)
    }

    /// Writers asleep waiting for `key`'s turn.
    pub fn waiting(&self, key: Key) -> usize {
        let turn = lock(&self.files).get(&key).map(|e| e.1.clone());
        turn.map_or(0, |t| lock(&t.state).1)
    }

    /// Files whose turns are held or waited for.
    pub fn files(&self) -> usize {
        lock(&self.files).len()
    }
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("files", &self.files())
            .finish()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        lock(&self.turn.state).0 = false;
        self.turn.free.notify_one();
        let mut files = lock(&self.turns.files);
        if let Some(entry) = files.get_mut(&self.key) {
            entry.0 -= 1;
            if entry.0 == 0 {
                files.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_of_a_file_waits_for_the_first_and_others_do_not() {
        let turns = Turns::new();
        let (first, waited) = turns.take((1, 7));
        assert!(!waited);
        // Another file's turn is free meanwhile.
        let (other, waited) = turns.take((1, 8));
        assert!(!waited);
        drop(other);
        let entered = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let second = s.spawn(|| {
                let (held, waited) = turns.take((1, 7));
                entered.store(true, std::sync::atomic::Ordering::SeqCst);
                drop(held);
                waited
            });
            // Until the second writer sleeps on the turn, unless it got
            // in while the first holds it.
            while turns.waiting((1, 7)) < 1 && !entered.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::yield_now();
            }
            assert!(!entered.load(std::sync::atomic::Ordering::SeqCst));
            drop(first);
            assert!(second.join().unwrap(), "the second writer waited");
        });
        assert!(entered.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(turns.files(), 0, "no file is left behind");
    }

    #[test]
    fn many_writers_take_turns_one_at_a_time() {
        let turns = Turns::new();
        let inside = std::sync::atomic::AtomicUsize::new(0);
        let most = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let (_held, _) = turns.take((3, 3));
                        let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                        std::hint::spin_loop();
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(turns.files(), 0);
    }
}
