//! The server's asynchronous copies (RFC 7862 section 4.4): a COPY whose
//! client allows it goes on after the reply on a thread of its own,
//! known by a stateid of its own. The client may ask how far it got
//! (OFFLOAD_STATUS) or stop it (OFFLOAD_CANCEL); the server tells it when
//! it is done (CB_OFFLOAD). The stateid is given back by OFFLOAD_CANCEL or
//! by the client's answer to CB_OFFLOAD (RFC 7862 section 4.8); a
//! finished copy whose CB_OFFLOAD got no answer is kept for two leases,
//! for OFFLOAD_STATUS, then forgotten.

use super::state::Stateid;
use crate::nfs4::Nfsstat4;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most asynchronous copies running at once; a COPY beyond them is done
/// synchronously (and short, see `ops_copy::SYNC_MAX`).
pub const MAX_RUNNING: usize = 16;

/// How an asynchronous copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// NFS4_OK, or why it failed before copying anything.
    pub status: Nfsstat4,
    /// Bytes copied (a prefix of the range).
    pub count: u64,
    /// stable_how4 of the bytes copied.
    pub committed: u32,
    /// OFFLOAD_CANCEL stopped it.
    pub cancelled: bool,
}

/// One asynchronous copy.
#[derive(Debug)]
pub struct Job {
    /// The client that asked for it.
    pub clientid: u64,
    /// Its stateid (wr_callback_id).
    pub stateid: Stateid,
    /// The destination's filehandle, for CB_OFFLOAD.
    pub dst_fh: Vec<u8>,
    copied: AtomicU64,
    cancel: AtomicBool,
    end: Mutex<Option<(End, Instant)>>,
    ended: Condvar,
    replied: Mutex<bool>,
    reply_sent: Condvar,
}

impl Job {
    /// Bytes copied so far.
    pub fn copied(&self) -> u64 {
        self.copied.load(Ordering::Acquire)
    }

    /// Records progress.
    pub fn set_copied(&self, n: u64) {
        self.copied.store(n, Ordering::Release);
    }

    /// Whether OFFLOAD_CANCEL asked it to stop.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// How it ended, once it has.
    pub fn end(&self) -> Option<End> {
        self.lock_end().map(|(e, _)| e)
    }

    fn lock_end(&self) -> Option<(End, Instant)> {
        *self.end.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records how it ended and wakes OFFLOAD_CANCEL.
    pub fn finish(&self, mut end: End) {
        end.cancelled = self.cancelled();
        *self.end.lock().unwrap_or_else(|p| p.into_inner()) = Some((end, Instant::now()));
        self.ended.notify_all();
    }

    /// Asks it to stop after the piece it is copying, and waits until it
    /// has.
    pub fn cancel(&self) -> End {
        self.cancel.store(true, Ordering::Release);
        let mut g = self.end.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some((e, _)) = *g {
                return e;
            }
            g = self.ended.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The COPY reply that started it has been sent.
    pub fn replied(&self) {
        *self.replied.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.reply_sent.notify_all();
    }

    /// Waits (up to `limit`) until the COPY reply has been sent, so that
    /// CB_OFFLOAD reaches the client after it.
    pub fn wait_replied(&self, limit: Duration) {
        let g = self.replied.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .reply_sent
            .wait_timeout_while(g, limit, |r| !*r)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// The table of asynchronous copies.
#[derive(Debug)]
pub struct Copies {
    jobs: Mutex<HashMap<[u8; 12], Arc<Job>>>,
    running: AtomicUsize,
    keep: Duration,
}

impl Copies {
    /// An empty table whose finished copies are kept for `keep`.
    pub fn new(keep: Duration) -> Self {
        Copies {
            jobs: Mutex::new(HashMap::new()),
            running: AtomicUsize::new(0),
            keep,
        }
    }

    /// Copies running now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// A new running copy for `clientid` under `stateid`, unless
    /// [`MAX_RUNNING`] are running already.
    pub fn start(&self, clientid: u64, stateid: Stateid, dst_fh: Vec<u8>) -> Option<Arc<Job>> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let keep = self.keep;
        jobs.retain(|_, j| j.lock_end().is_none_or(|(_, at)| at.elapsed() < keep));
        if self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_RUNNING).then_some(n + 1)
            })
            .is_err()
        {
            return None;
        }
        let job = Arc::new(Job {
            clientid,
            stateid,
            dst_fh,
            copied: AtomicU64::new(0),
            cancel: AtomicBool::new(false),
            end: Mutex::new(None),
            ended: Condvar::new(),
            replied: Mutex::new(false),
            reply_sent: Condvar::new(),
        });
        jobs.insert(stateid.other, job.clone());
        Some(job)
    }

    /// A running copy stopped (it stays in the table, finished).
    pub fn stopped(&self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
    }

    /// Forgets the copy with stateid `other` (its client gave the stateid
    /// back: OFFLOAD_CANCEL, or an answer to CB_OFFLOAD).
    pub fn remove(&self, other: &[u8; 12]) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(other);
    }

    /// The copy of `clientid` with stateid `other`, if known.
    pub fn get(&self, clientid: u64, other: &[u8; 12]) -> Option<Arc<Job>> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.get(other)
            .filter(|j| j.clientid == clientid)
            .filter(|j| j.lock_end().is_none_or(|(_, at)| at.elapsed() < self.keep))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs4::consts::status;

    fn sid(n: u8) -> Stateid {
        Stateid {
            seqid: 1,
            other: [n; 12],
        }
    }

    #[test]
    fn jobs_belong_to_their_client_and_are_bounded() {
        let c = Copies::new(Duration::from_secs(60));
        let j = c.start(7, sid(1), vec![1]).unwrap();
        assert!(c.get(7, &[1; 12]).is_some());
        assert!(c.get(8, &[1; 12]).is_none(), "another client's copy");
        assert!(c.get(7, &[2; 12]).is_none());
        for n in 1..MAX_RUNNING {
            assert!(c.start(7, sid(1 + n as u8), vec![]).is_some());
        }
        assert!(c.start(7, sid(200), vec![]).is_none(), "past the limit");
        j.finish(End {
            status: status::OK,
            count: 5,
            committed: 2,
            cancelled: false,
        });
        c.stopped();
        assert!(c.start(7, sid(201), vec![]).is_some());
        assert_eq!(c.get(7, &[1; 12]).unwrap().end().unwrap().count, 5);
    }

    #[test]
    fn finished_jobs_are_forgotten_after_keep() {
        let c = Copies::new(Duration::ZERO);
        let j = c.start(7, sid(1), vec![]).unwrap();
        assert!(c.get(7, &[1; 12]).is_some(), "running jobs stay");
        j.finish(End {
            status: status::OK,
            count: 0,
            committed: 0,
            cancelled: false,
        });
        assert!(c.get(7, &[1; 12]).is_none());
    }

    #[test]
    fn cancel_waits_for_the_end() {
        let c = Copies::new(Duration::from_secs(60));
        let j = c.start(7, sid(1), vec![]).unwrap();
        let worker = {
            let j = j.clone();
            std::thread::spawn(move || {
                while !j.cancelled() {
                    std::thread::yield_now();
                }
                j.set_copied(3);
                j.finish(End {
                    status: status::OK,
                    count: 3,
                    committed: 0,
                    cancelled: false,
                });
            })
        };
        let e = j.cancel();
        assert!(e.cancelled);
        assert_eq!(e.count, 3);
        worker.join().unwrap();
    }
}
