//! sluice-load: an NFSv4.1/4.2 load generator built on sluice's own
//! protocol code. It prints throughput, IOPS and latency percentiles; with
//! --json, one JSON object with every figure.

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use sluice_load::client::{Client, OpenFile};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Mode {
    /// READ only.
    Read,
    /// READ_PLUS only (NFSv4.2).
    ReadPlus,
    /// WRITE only.
    Write,
    /// Reads and writes, --write-pct of them writes.
    Mix,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Pattern {
    /// Each stream reads or writes its share of the file once, in order.
    Seq,
    /// Random block-aligned offsets until --duration ends.
    Random,
}

#[derive(Parser, Debug)]
#[command(name = "sluice-load", about = "NFSv4.1/4.2 load generator")]
struct Args {
    /// Server address (host:port).
    #[arg(long, default_value = "127.0.0.1:2049")]
    server: String,
    /// File to use, as a path from the server's root.
    #[arg(long)]
    file: String,
    /// Operation mix.
    #[arg(long, value_enum, default_value = "read")]
    mode: Mode,
    /// Access pattern.
    #[arg(long, value_enum, default_value = "seq")]
    pattern: Pattern,
    /// Bytes per request.
    #[arg(long, default_value_t = 1 << 20)]
    bs: u32,
    /// Requests in flight per stream.
    #[arg(long, default_value_t = 8)]
    inflight: u32,
    /// Parallel streams (each its own connection and session).
    #[arg(long, default_value_t = 1)]
    streams: u32,
    /// Seconds to run random patterns (and the longest a sequential pass may take).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Percentage of writes in --mode mix.
    #[arg(long, default_value_t = 50)]
    write_pct: u32,
    /// Byte range of the file to use (default: its size when opened).
    #[arg(long)]
    size: Option<u64>,
    /// NFSv4 minor version.
    #[arg(long, default_value_t = 2)]
    minor: u32,
    /// How WRITEs ask for their data to be kept: `unstable` (then one
    /// COMMIT per stream at the end, timed with the run) or `file-sync`.
    #[arg(long, value_enum, default_value = "unstable")]
    stable: Stable,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Stable {
    /// UNSTABLE4, and COMMIT at the end.
    Unstable,
    /// FILE_SYNC4 on every WRITE.
    FileSync,
}

struct Stats {
    read: Histogram<u64>,
    write: Histogram<u64>,
    covered: u64,
    wire: u64,
    errors: u64,
}

impl Stats {
    fn new() -> Self {
        Stats {
            read: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            write: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            covered: 0,
            wire: 0,
            errors: 0,
        }
    }
}

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    if h.is_empty() {
        return serde_json::json!(null);
    }
    serde_json::json!({
        "count": h.len(),
        "avg_us": h.mean(),
        "p50_us": h.value_at_quantile(0.5),
        "p99_us": h.value_at_quantile(0.99),
        "max_us": h.max(),
    })
}

fn rand_u64(state: &mut u64) -> u64 {
    // xorshift64*: cheap, good enough for offsets.
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// What one worker of a stream shares with the others.
struct Stream {
    client: Arc<Client>,
    file: Arc<OpenFile>,
    args: Arc<Args>,
    range: (u64, u64),
    cursor: Arc<AtomicU64>,
    deadline: Instant,
    stats: Arc<Mutex<Stats>>,
}

async fn worker(s: Arc<Stream>, seed: u64) {
    let (c, f, a, range, cursor, deadline, stats) = (
        &s.client, &s.file, &s.args, s.range, &s.cursor, s.deadline, &s.stats,
    );
    let mut rng = seed | 1;
    let bs = a.bs as u64;
    let blocks = ((range.1 - range.0) / bs).max(1);
    let data = vec![0x5au8; a.bs as usize];
    let mut local = Stats::new();
    while Instant::now() < deadline {
        let off = match a.pattern {
            Pattern::Seq => {
                let o = cursor.fetch_add(bs, Ordering::Relaxed);
                if o >= range.1 {
                    break;
                }
                o
            }
            Pattern::Random => range.0 + (rand_u64(&mut rng) % blocks) * bs,
        };
        let count = bs.min(range.1.saturating_sub(off)).max(1) as u32;
        let write = match a.mode {
            Mode::Write => true,
            Mode::Mix => rand_u64(&mut rng) % 100 < a.write_pct as u64,
            _ => false,
        };
        let t = Instant::now();
        let r = if write {
            c.write(
                f,
                off,
                &data[..count as usize],
                a.stable == Stable::FileSync,
            )
            .await
            .map(|n| (n as u64, n as u64))
        } else {
            c.read(f, off, count, a.mode == Mode::ReadPlus)
                .await
                .map(|(cov, wire, _)| (cov, wire))
        };
        let us = t.elapsed().as_micros().max(1) as u64;
        match r {
            Ok((cov, wire)) => {
                let h = if write {
                    &mut local.write
                } else {
                    &mut local.read
                };
                let _ = h.record(us.min(60_000_000));
                local.covered += cov;
                local.wire += wire;
            }
            Err(e) => {
                local.errors += 1;
                if local.errors == 1 {
                    eprintln!("sluice-load: request at offset {off} failed: {e}");
                }
            }
        }
    }
    let mut s = stats.lock().expect("stats lock");
    let _ = s.read.add(&local.read);
    let _ = s.write.add(&local.write);
    s.covered += local.covered;
    s.wire += local.wire;
    s.errors += local.errors;
}

async fn run(a: Arc<Args>) -> Result<serde_json::Value, String> {
    let write = matches!(a.mode, Mode::Write | Mode::Mix);
    let mut clients = Vec::new();
    for _ in 0..a.streams {
        let c = Client::connect(&a.server, a.minor, a.inflight.max(1))
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", a.server))?;
        let f = c
            .open(&a.file, write, a.mode == Mode::Write)
            .await
            .map_err(|e| format!("cannot open {}: {e}", a.file))?;
        clients.push((Arc::new(c), Arc::new(f)));
    }
    let size = a.size.unwrap_or(clients[0].1.size);
    if size == 0 && a.mode != Mode::Write {
        return Err(format!("{} is empty; nothing to read", a.file));
    }
    let size = size.max(a.bs as u64);
    let stats = Arc::new(Mutex::new(Stats::new()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.duration);
    let mut tasks = Vec::new();
    for (i, (c, f)) in clients.iter().enumerate() {
        let share = size / a.streams as u64;
        let range = match a.pattern {
            Pattern::Seq => (
                i as u64 * share,
                if i as u32 + 1 == a.streams {
                    size
                } else {
                    (i as u64 + 1) * share
                },
            ),
            Pattern::Random => (0, size),
        };
        let stream = Arc::new(Stream {
            client: c.clone(),
            file: f.clone(),
            args: a.clone(),
            range,
            cursor: Arc::new(AtomicU64::new(range.0)),
            deadline,
            stats: stats.clone(),
        });
        for w in 0..a.inflight {
            let seed = 0x9e37_79b9 ^ ((i as u64) << 32) ^ ((w as u64 + 1) * 7919);
            tasks.push(tokio::spawn(worker(stream.clone(), seed)));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut commit_errors = 0;
    if write && a.stable == Stable::Unstable {
        // What was written UNSTABLE is not kept until COMMIT: part of the
        // run.
        for (c, f) in &clients {
            if let Err(e) = c.commit(f).await {
                eprintln!("sluice-load: COMMIT failed: {e}");
                commit_errors += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Give the opens back (untimed), so that the server lets go of the
    // files: a file removed after the run frees its space at once.
    for (c, f) in &clients {
        let _ = c.close(f).await;
        let _ = c.destroy_session().await;
    }
    let mut s = stats
        .lock()
        .map_err(|_| "stats lock poisoned".to_string())?;
    s.errors += commit_errors;
    let ops = s.read.len() + s.write.len();
    Ok(serde_json::json!({
        "server": a.server, "file": a.file, "mode": format!("{:?}", a.mode).to_lowercase(),
        "pattern": format!("{:?}", a.pattern).to_lowercase(), "bs": a.bs, "inflight": a.inflight,
        "streams": a.streams, "minor": a.minor, "stable": format!("{:?}", a.stable).to_lowercase(), "seconds": secs, "ops": ops, "errors": s.errors,
        "bytes": s.covered, "wire_data_bytes": s.wire,
        "mb_per_s": s.covered as f64 / secs / 1e6, "iops": ops as f64 / secs,
        "read": summary(&s.read), "write": summary(&s.write),
    }))
}

fn main() {
    let a = Arc::new(Args::parse());
    sluice_engine::tune_allocator();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice-load: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    match rt.block_on(run(a.clone())) {
        Ok(v) => {
            if a.json {
                println!("{v}");
            } else {
                println!(
                    "{} {} bs={} streams={} inflight={}: {:.1} MB/s, {:.0} IOPS, {} ops, {} errors in {:.2} s",
                    v["mode"].as_str().unwrap_or(""),
                    v["pattern"].as_str().unwrap_or(""),
                    a.bs,
                    a.streams,
                    a.inflight,
                    v["mb_per_s"].as_f64().unwrap_or(0.0),
                    v["iops"].as_f64().unwrap_or(0.0),
                    v["ops"],
                    v["errors"],
                    v["seconds"].as_f64().unwrap_or(0.0)
                );
                for k in ["read", "write"] {
                    if !v[k].is_null() {
                        println!(
                            "  {k} latency us: avg {:.0} p50 {} p99 {} max {}",
                            v[k]["avg_us"].as_f64().unwrap_or(0.0),
                            v[k]["p50_us"],
                            v[k]["p99_us"],
                            v[k]["max_us"]
                        );
                    }
                }
            }
            if v["errors"].as_u64().unwrap_or(0) > 0 {
                std::process::exit(3);
            }
        }
        Err(e) => {
            eprintln!("sluice-load: {e}");
            std::process::exit(1);
        }
    }
}
