//! Counters the server updates as it works; `crate::metrics` exposes
//! them for Prometheus.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the READ latency histogram buckets, in seconds.
pub const LATENCY_BOUNDS: [f64; 16] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 5.0,
];

/// A latency histogram with fixed buckets ([`LATENCY_BOUNDS`]), safe to
/// update from any thread.
#[derive(Debug, Clone)]
pub struct Histogram(pub prometheus_client::metrics::histogram::Histogram);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(prometheus_client::metrics::histogram::Histogram::new(
            LATENCY_BOUNDS,
        ))
    }
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
}

/// Counters the server updates as it works.
#[derive(Debug, Default)]
pub struct Metrics {
    /// READ and READ_PLUS ops that returned data or EOF.
    pub reads: AtomicU64,
    /// File data bytes placed in READ and READ_PLUS replies.
    pub read_bytes_sent: AtomicU64,
    /// Records (replies and calls to clients) queued for connections.
    pub records_sent: AtomicU64,
    /// System calls that wrote them (writev, sendmsg; splice not counted).
    pub record_writes: AtomicU64,
    /// Time from decoding a READ or READ_PLUS to its encoded result.
    pub read_latency: Histogram,
    /// Calls to clients over their back channels that got an answer.
    pub callbacks: AtomicU64,
    /// Calls to clients that got none (timeout, refused, no connection).
    pub callback_failures: AtomicU64,
    /// Time from sending a callback to its answer or failure.
    pub callback_latency: Histogram,
    /// COPY ops that copied (synchronously) or started copying
    /// (asynchronously).
    pub copies: AtomicU64,
    /// Bytes of source ranges COPY covered on the server (data copied and
    /// holes kept).
    pub copy_bytes: AtomicU64,
    /// Bytes of UNSTABLE WRITEs whose writeback they started themselves (see
    /// `Config::write_behind_min`).
    pub write_behind_bytes: AtomicU64,
    /// Large buffered WRITEs that waited for another WRITE of their file
    /// to finish copying (see `ops_file::write_data`).
    pub write_turns_waited: AtomicU64,
    /// READDIR entries answered from the directory alone, without a stat
    /// (the client asked for names, types and file ids only).
    pub entries_listed_without_stat: AtomicU64,
    /// Descriptors opened for stable WRITEs to flush through (see
    /// `Server::flush_witness`); kept ones used again are not counted.
    pub flush_witnesses_opened: AtomicU64,
    /// Times the write verifier changed because a flush or write failed
    /// (see `Server::storage_failed`).
    pub write_verifier_changes: AtomicU64,
    /// Directories and files synced so that a change an op made to them is
    /// durable before its answer (exports with `sync`, the default).
    pub metadata_commits: AtomicU64,
}

impl Metrics {
    /// Counts one callback and how long it took.
    pub fn callback(&self, answered: bool, took: Duration) {
        let n = if answered {
            &self.callbacks
        } else {
            &self.callback_failures
        };
        n.fetch_add(1, Ordering::Relaxed);
        self.callback_latency.observe(took);
    }
}
