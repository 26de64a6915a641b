//! Counters the server updates as it works; `crate::metrics` renders
//! them for Prometheus.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the READ latency histogram buckets, in microseconds.
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

/// A latency histogram with fixed buckets, safe to update from any thread.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let i = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The count in each bucket (not cumulative), the sum in
    /// microseconds and the number of observations.
    pub fn snapshot(&self) -> ([u64; LATENCY_BOUNDS_US.len() + 1], u64, u64) {
        let buckets = std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        (
            buckets,
            self.sum_us.load(Ordering::Relaxed),
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// Counters the server updates as it works.
#[derive(Debug, Default)]
pub struct Metrics {
    /// READ and READ_PLUS ops that returned data or EOF.
    pub reads: AtomicU64,
    /// File data bytes placed in READ and READ_PLUS replies.
    pub read_bytes_sent: AtomicU64,
    /// Time from decoding a READ or READ_PLUS to its encoded result.
    pub read_latency: Histogram,
}
