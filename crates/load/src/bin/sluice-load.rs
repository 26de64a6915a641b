//! sluice-load: an NFSv4.1/4.2 and NFSv3 load generator built on sluice's
//! own protocol code. It prints throughput, IOPS and latency percentiles;
//! with --json, one JSON object with every figure.

// Clients take no identities (see the workspace's clippy.toml).
#![allow(clippy::disallowed_methods)]

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use sluice_load::cli::{Caller, Mount, Proto};
use sluice_load::client::{Client, OpenFile};
use sluice_load::v3::{self, Client3, File3};
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
#[command(name = "sluice-load", about = "NFSv4.1/4.2 and NFSv3 load generator")]
struct Args {
    /// Server address (host:port).
    #[arg(long, default_value = "127.0.0.1:2049")]
    server: String,
    /// File to use, as a path from the server's root (NFSv3: from the
    /// directory --mount-path mounts).
    #[arg(long)]
    file: String,
    /// Protocol: NFSv4.1/4.2 (--minor, one session per stream) or NFSv3.
    #[arg(long, value_enum, default_value = "v4")]
    proto: Proto,
    #[command(flatten)]
    mount: Mount,
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
    /// Parallel streams (each its own connection, and NFSv4 session).
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
    /// COMMIT per stream at the end, timed with the run) or `file-sync`
    /// (NFSv4 FILE_SYNC4, NFSv3 FILE_SYNC).
    #[arg(long, value_enum, default_value = "unstable")]
    stable: Stable,
    #[command(flatten)]
    caller: Caller,
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

/// One stream's connection and file, over NFSv4 or NFSv3.
enum Nfs {
    /// A session and an open.
    V4 { client: Client, file: OpenFile },
    /// A connection, a handle, and the write verifier of the stream's
    /// first UNSTABLE WRITE (COMMIT must return the same one, or the
    /// server lost what it was sent).
    V3 {
        client: Client3,
        file: File3,
        verf: Mutex<Option<[u8; 8]>>,
    },
}

impl Nfs {
    /// READ (or READ_PLUS): (bytes of file covered, bytes of data received).
    async fn read(&self, off: u64, count: u32, plus: bool) -> Result<(u64, u64), String> {
        match self {
            Nfs::V4 { client, file } => client
                .read(file, off, count, plus)
                .await
                .map(|(cov, wire, _)| (cov, wire))
                .map_err(|e| e.to_string()),
            Nfs::V3 { client, file, .. } => client
                .read(file, off, count)
                .await
                .map(|(n, _)| (n, n))
                .map_err(|e| e.to_string()),
        }
    }

    /// WRITE: bytes written.
    async fn write(&self, off: u64, data: &[u8], sync: bool) -> Result<u64, String> {
        match self {
            Nfs::V4 { client, file } => client
                .write(file, off, data, sync)
                .await
                .map(u64::from)
                .map_err(|e| e.to_string()),
            Nfs::V3 { client, file, verf } => {
                let how = if sync {
                    v3::Stable::FileSync
                } else {
                    v3::Stable::Unstable
                };
                let w = client
                    .write(file, off, data, how)
                    .await
                    .map_err(|e| e.to_string())?;
                if !sync {
                    let mut v = verf.lock().map_err(|_| "verifier lock poisoned")?;
                    if *v.get_or_insert(w.verf) != w.verf {
                        return Err("the write verifier changed between WRITEs".into());
                    }
                }
                Ok(u64::from(w.count))
            }
        }
    }

    /// COMMIT of the whole file.
    async fn commit(&self) -> Result<(), String> {
        match self {
            Nfs::V4 { client, file } => client.commit(file).await.map_err(|e| e.to_string()),
            Nfs::V3 { client, file, verf } => {
                let got = client.commit(file).await.map_err(|e| e.to_string())?;
                let sent = *verf.lock().map_err(|_| "verifier lock poisoned")?;
                match sent {
                    Some(v) if v != got => {
                        Err("COMMIT's write verifier differs from the WRITEs'".into())
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// Gives the open and the session back (NFSv3 holds neither).
    async fn finish(&self) {
        if let Nfs::V4 { client, file } = self {
            let _ = client.close(file).await;
            let _ = client.leave().await;
        }
    }

    /// The file's size when opened.
    fn size(&self) -> u64 {
        match self {
            Nfs::V4 { file, .. } => file.size,
            Nfs::V3 { file, .. } => file.size,
        }
    }
}

/// What one worker of a stream shares with the others.
struct Stream {
    nfs: Arc<Nfs>,
    args: Arc<Args>,
    range: (u64, u64),
    cursor: Arc<AtomicU64>,
    deadline: Instant,
    stats: Arc<Mutex<Stats>>,
}

async fn worker(s: Arc<Stream>, seed: u64) {
    let (nfs, a, range, cursor, deadline, stats) =
        (&s.nfs, &s.args, s.range, &s.cursor, s.deadline, &s.stats);
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
            nfs.write(off, &data[..count as usize], a.stable == Stable::FileSync)
                .await
                .map(|n| (n, n))
        } else {
            nfs.read(off, count, a.mode == Mode::ReadPlus).await
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

/// One NFSv4 session per stream, each with the file open.
async fn connect_v4(a: &Args, write: bool) -> Result<Vec<Arc<Nfs>>, String> {
    let mut out = Vec::new();
    for _ in 0..a.streams {
        let client = Client::connect(&a.server, a.minor, a.inflight.max(1))
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", a.server))?;
        let file = client
            .open(&a.file, write, a.mode == Mode::Write)
            .await
            .map_err(|e| format!("cannot open {}: {e}", a.file))?;
        out.push(Arc::new(Nfs::V4 { client, file }));
    }
    Ok(out)
}

/// MNT, then the file looked up (or made, for --mode write) on the first
/// stream's connection, and one connection per stream using its handle.
async fn connect_v3(a: &Args) -> Result<Vec<Arc<Nfs>>, String> {
    if a.mode == Mode::ReadPlus {
        return Err("READ_PLUS is NFSv4.2 only; use --mode read with --proto v3".into());
    }
    let root = a.mount.root(&a.server).await?;
    let mut out = Vec::new();
    let mut file: Option<File3> = None;
    for _ in 0..a.streams {
        let client = Client3::connect(&a.server)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", a.server))?;
        let f = match &file {
            Some(f) => f.clone(),
            None => {
                let f = client
                    .open(&root, &a.file, a.mode == Mode::Write)
                    .await
                    .map_err(|e| format!("cannot open {}: {e}", a.file))?;
                let info = client
                    .fsinfo(&f.fh)
                    .await
                    .map_err(|e| format!("FSINFO of {}: {e}", a.file))?;
                let (max, what) = if a.mode == Mode::Read {
                    (info.rtmax, "rtmax")
                } else {
                    (info.rtmax.min(info.wtmax), "rtmax/wtmax")
                };
                if a.bs > max {
                    return Err(format!(
                        "--bs {} is more than the server's {what} ({max})",
                        a.bs
                    ));
                }
                file.insert(f).clone()
            }
        };
        out.push(Arc::new(Nfs::V3 {
            client,
            file: f,
            verf: Mutex::new(None),
        }));
    }
    Ok(out)
}

async fn run(a: Arc<Args>) -> Result<serde_json::Value, String> {
    let write = matches!(a.mode, Mode::Write | Mode::Mix);
    let clients = match a.proto {
        Proto::V4 => connect_v4(&a, write).await?,
        Proto::V3 => connect_v3(&a).await?,
    };
    let size = a.size.unwrap_or(clients[0].size());
    if size == 0 && a.mode != Mode::Write {
        return Err(format!("{} is empty; nothing to read", a.file));
    }
    let size = size.max(a.bs as u64);
    let stats = Arc::new(Mutex::new(Stats::new()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.duration);
    let mut tasks = Vec::new();
    for (i, nfs) in clients.iter().enumerate() {
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
            nfs: nfs.clone(),
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
        for nfs in &clients {
            if let Err(e) = nfs.commit().await {
                eprintln!("sluice-load: COMMIT failed: {e}");
                commit_errors += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Give the opens back (untimed), so that the server lets go of the
    // files: a file removed after the run frees its space at once.
    for nfs in &clients {
        nfs.finish().await;
    }
    let mut s = stats
        .lock()
        .map_err(|_| "stats lock poisoned".to_string())?;
    s.errors += commit_errors;
    let ops = s.read.len() + s.write.len();
    Ok(serde_json::json!({
        "server": a.server, "file": a.file, "mode": format!("{:?}", a.mode).to_lowercase(),
        "pattern": format!("{:?}", a.pattern).to_lowercase(), "bs": a.bs, "inflight": a.inflight,
        "streams": a.streams, "proto": format!("{:?}", a.proto).to_lowercase(), "minor": a.minor, "stable": format!("{:?}", a.stable).to_lowercase(), "uid": a.caller.uid, "gid": a.caller.gid(), "seconds": secs, "ops": ops, "errors": s.errors,
        "bytes": s.covered, "wire_data_bytes": s.wire,
        "mb_per_s": s.covered as f64 / secs / 1e6, "iops": ops as f64 / secs,
        "read": summary(&s.read), "write": summary(&s.write),
    }))
}

fn main() {
    let a = Arc::new(Args::parse());
    sluice_engine::tune_allocator();
    a.caller.call_as();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["sluice-load", "--file", "f", "--proto", "v3"];
        argv.extend_from_slice(extra);
        Args::parse_from(argv)
    }

    #[test]
    fn nfsv3_mounts_at_the_nfs_port_unless_told_otherwise() {
        let a = args(&["--server", "10.0.0.2:20490", "--mount-port", "20048"]);
        assert_eq!(a.mount.address(&a.server), "10.0.0.2:20048");
        assert_eq!(args(&[]).mount.address("127.0.0.1:2049"), "127.0.0.1:2049");
        assert_eq!(args(&[]).mount.mount_path, "/");
        assert_eq!(
            Args::parse_from(["sluice-load", "--file", "f"]).proto,
            Proto::V4
        );
    }
}
