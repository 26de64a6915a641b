//! Server metrics in the Prometheus text format, served over HTTP at
//! `--metrics ADDR` (`GET /metrics`).

use crate::server::counters::{Histogram, LATENCY_BOUNDS_US};
use crate::server::Server;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Writes `h` as a Prometheus histogram.
fn histogram(out: &mut String, h: &Histogram, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let (buckets, sum_us, count) = h.snapshot();
    let mut cumulative = 0;
    for (i, n) in buckets.iter().enumerate() {
        cumulative += n;
        let le = match LATENCY_BOUNDS_US.get(i) {
            Some(us) => format!("{}", *us as f64 / 1e6),
            None => "+Inf".to_string(),
        };
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_sum {}", sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {count}");
}

/// Bytes this process caused to be read from storage (`read_bytes` of
/// /proc/self/io), or None where the kernel does not account I/O.
pub fn disk_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {v}");
}

fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    let _ = writeln!(out, "{name} {v}");
}

/// Clients, sessions, opens, locks, grace and reclaims.
fn render_state(out: &mut String, srv: &Server) {
    let u = srv.state.usage();
    let g = srv.state.grace_status();
    let c = &srv.state.counters;
    let gauges: [(&str, &str, u64); 8] = [
        (
            "sluice_clients",
            "Client records, confirmed or not.",
            u.clients as u64,
        ),
        (
            "sluice_courtesy_clients",
            "Clients whose lease ran out that keep their state until somebody conflicts with it.",
            u.courtesy as u64,
        ),
        ("sluice_sessions", "Sessions.", u.sessions as u64),
        (
            "sluice_opens",
            "Open stateids (one per open-owner and file).",
            u.opens as u64,
        ),
        (
            "sluice_lock_owners",
            "Lock stateids (one per lock-owner and file).",
            u.lock_owners as u64,
        ),
        (
            "sluice_locks",
            "Byte ranges locked by clients.",
            u.locks as u64,
        ),
        (
            "sluice_in_grace",
            "1 during the grace period after a start, when only reclaims are allowed.",
            g.active as u64,
        ),
        (
            "sluice_grace_waiting_clients",
            "Clients known from before the start that have not finished reclaiming.",
            g.waiting as u64,
        ),
    ];
    for (name, help, v) in gauges {
        gauge(out, name, help, v);
    }
    counter(
        out,
        "sluice_reclaims_total",
        "Opens and locks reclaimed during grace.",
        c.reclaims.load(Ordering::Relaxed),
    );
    counter(
        out,
        "sluice_clients_expired_total",
        "Clients expired: silent with nothing to keep, out of courtesy time, or in the way of another client.",
        c.expired.load(Ordering::Relaxed),
    );
}

/// The metrics page.
pub fn render(srv: &Server) -> String {
    let m = &srv.metrics;
    let ra = &srv.read.readahead.stats;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counters: [(&str, &str, u64); 10] = [
        (
            "sluice_reads_total",
            "READ and READ_PLUS operations served.",
            load(&m.reads),
        ),
        (
            "sluice_read_bytes_sent_total",
            "File data bytes sent in READ and READ_PLUS replies.",
            load(&m.read_bytes_sent),
        ),
        (
            "sluice_disk_read_bytes_total",
            "Bytes the server process read from storage (read_bytes of /proc/self/io).",
            disk_read_bytes().unwrap_or(0),
        ),
        (
            "sluice_readahead_issued_bytes_total",
            "Bytes the server read ahead: into the page cache, or with O_DIRECT into its read cache.",
            load(&ra.issued_bytes),
        ),
        (
            "sluice_readahead_dropped_total",
            "Readahead requests dropped because a readahead queue was full.",
            load(&ra.dropped),
        ),
        (
            "sluice_readahead_hits_total",
            "Reads of sequential streams served without waiting for the disk (from the page cache or from data read ahead into the read cache).",
            load(&ra.hits),
        ),
        (
            "sluice_readahead_misses_total",
            "Reads of sequential streams that had to wait for the disk.",
            load(&ra.misses),
        ),
        (
            "sluice_readahead_wasted_bytes_total",
            "Bytes read ahead that no read reached before the stream moved or ended.",
            load(&ra.wasted_bytes),
        ),
        (
            "sluice_direct_read_bytes_total",
            "Bytes of cold sequential streams read with O_DIRECT, past the page cache (their READs and their readahead).",
            load(&ra.direct_bytes),
        ),
        (
            "sluice_read_cache_hits_total",
            "READs served from the server's cache of data read with O_DIRECT.",
            load(&srv.read.bufcache.stats.hits),
        ),
    ];
    let mut out = String::with_capacity(4096);
    for (name, help, v) in counters {
        counter(&mut out, name, help, v);
    }
    let _ = writeln!(
        out,
        "# HELP sluice_readahead_max_bytes Largest readahead window of a stream.\n\
         # TYPE sluice_readahead_max_bytes gauge\n\
         sluice_readahead_max_bytes {}",
        srv.read.readahead.config().max
    );
    let _ = writeln!(
        out,
        "# HELP sluice_read_cache_bytes Bytes held by the cache of data read with O_DIRECT.\n\
         # TYPE sluice_read_cache_bytes gauge\n\
         sluice_read_cache_bytes {}",
        load(&srv.read.bufcache.stats.bytes)
    );
    render_state(&mut out, srv);
    histogram(
        &mut out,
        &m.read_latency,
        "sluice_read_duration_seconds",
        "Time to serve one READ or READ_PLUS operation.",
    );
    out
}

/// Serves the metrics page until the task is dropped.
pub async fn serve(listener: TcpListener, srv: Arc<Server>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let srv = srv.clone();
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), answer(stream, srv)).await;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Reads one HTTP request head (bounded) and answers it.
async fn answer(mut s: TcpStream, srv: Arc<Server>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 8192 {
            break;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, body, ctype) = if method != "GET" {
        (
            "405 Method Not Allowed",
            "only GET\n".to_string(),
            "text/plain",
        )
    } else if path == "/metrics" || path == "/" {
        let srv2 = srv.clone();
        let body = tokio::task::spawn_blocking(move || render(&srv2))
            .await
            .unwrap_or_default();
        ("200 OK", body, "text/plain; version=0.0.4")
    } else {
        ("404 Not Found", "see /metrics\n".to_string(), "text/plain")
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(resp.as_bytes()).await?;
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_secs(10));
        let mut s = String::new();
        histogram(&mut s, &h, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.000025\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"0.0005\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"5\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3\n"), "{s}");
        assert!(s.contains("x_count 3\n"), "{s}");
    }

    #[test]
    fn disk_read_bytes_is_readable() {
        // Every Linux kernel this runs on accounts task I/O.
        assert!(disk_read_bytes().is_some());
    }
}
