//! sluice-meta: how fast a server does metadata for many clients at once.
//!
//! `--clients` clients (each its own connection and NFSv4.1 session, one
//! request at a time, as a process that untars, stats or removes does)
//! work in one directory, phase after phase:
//!
//! - `create`: each client makes `--files` files: OPEN (create), WRITE of
//!   4 KiB (UNSTABLE), CLOSE; three round trips per file, as the Linux
//!   client sends them;
//! - `stat`: LOOKUP, GETFH and GETATTR (the attributes `ls -l` shows) of
//!   every file of its own, as the Linux client looks a name up;
//! - `readdir`: each client lists the whole directory (clients × files
//!   entries) with READDIR and what the Linux client asks for when `ls -l`
//!   lists: those attributes, and each entry's file handle;
//! - `names`: each client lists the whole directory with READDIR asking
//!   for what the Linux client asks for when it lists without attributes
//!   (`ls`, `find`, a glob; a mount with `nordirplus`): each entry's type
//!   and file id (`type`, `mounted_on_fileid`, and `rdattr_error`); over
//!   NFSv3, READDIR;
//! - `rename`: each client renames its files within the directory;
//! - `remove`: each client removes its files.
//!
//! With `--proto v3` the clients speak NFSv3 instead, after a MOUNT v3 MNT
//! of `--mount-path`, and keep the directory's handle as the Linux client
//! does: `create` is CREATE (UNCHECKED, mode 0644) and a 4 KiB UNSTABLE
//! WRITE, two round trips (NFSv3 has no CLOSE); `stat` a LOOKUP, whose
//! reply carries the attributes; `readdir` READDIRPLUS; `rename` RENAME;
//! `remove` REMOVE.
//!
//! With `--local PATH` there is no server: `--clients` threads do the
//! same phases on the local directory PATH with system calls (`openat`,
//! a 4 KiB `write` and `close`; `fstatat`; reading the directory, with an
//! `fstatat` of each entry for `readdir`; `renameat`; `unlinkat`), and
//! with `--sync-dir` each thread syncs the directory (`fsync`) after
//! every create, rename and remove, as a server does before it answers
//! such a change on a `sync` export. That is the file system's own rate
//! for the work, the limit a server on the same machine works against.
//!
//! For each phase it prints operations (files, or for `readdir`
//! entries) per second, latency percentiles of the calls, and with
//! `--server-pid` the server's CPU time per operation (user and system,
//! from /proc; with `--local`, sluice-meta's own). The directory must
//! exist and be empty.

// Clients take no identities (see the workspace's clippy.toml).
#![allow(clippy::disallowed_methods)]

use clap::Parser;
use hdrhistogram::Histogram;
use sluice_load::cli::{Caller, Mount, Proto};
use sluice_load::client::{Client, ClientError, OpenFile};
use sluice_load::v3::{Client3, File3, Stable};
use sluice_proto::nfs4::consts::{attr, op};
use sluice_proto::nfs4::msg::{Bitmap4, Component4, Fattr4, Xdr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "sluice-meta",
    about = "metadata operations of many NFSv4.1 or NFSv3 clients"
)]
struct Args {
    /// Server address (host:port).
    #[arg(long, default_value = "127.0.0.1:2049")]
    server: String,
    /// Protocol: NFSv4.1, or NFSv3 after MOUNT v3.
    #[arg(long, value_enum, default_value = "v4")]
    proto: Proto,
    #[command(flatten)]
    mount: Mount,
    /// The directory to work in, as a path from the server's root (NFSv3:
    /// from the directory --mount-path mounts); it must exist and be
    /// empty.
    #[arg(long, required_unless_present = "local")]
    dir: Option<String>,
    /// No server: work on this local directory (which must exist and be
    /// empty) with system calls, one thread per client.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["dir", "server_pid", "uid", "gid"])]
    local: Option<std::path::PathBuf>,
    /// With --local: sync the directory after every create, rename and
    /// remove, as a server on a `sync` export does before it answers.
    #[arg(long, requires = "local")]
    sync_dir: bool,
    /// Clients, each with its own connection and session.
    #[arg(long, default_value_t = 16)]
    clients: u32,
    /// Files each client makes (the directory then holds clients × files).
    #[arg(long, default_value_t = 1000)]
    files: u32,
    /// Phases to run, in this order, from create, stat, readdir, names,
    /// rename, remove (a phase needs the create before it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "create,stat,readdir,rename,remove"
    )]
    phases: Vec<String>,
    #[command(flatten)]
    caller: Caller,
    /// The server's process id, to report its CPU time per operation.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

const PHASES: [&str; 6] = ["create", "stat", "readdir", "names", "rename", "remove"];
const FILE_BYTES: usize = 4096;
/// READDIR's reply size, as the Linux client asks for with its default
/// rsize of 1 MiB and dtsize.
const READDIR_MAX: u32 = 256 << 10;

/// The attributes `ls -l` needs (GETATTR after LOOKUP asks for these).
fn ls_attrs() -> Bitmap4 {
    Bitmap4::of(&[
        attr::TYPE,
        attr::CHANGE,
        attr::SIZE,
        attr::FILEID,
        attr::MODE,
        attr::NUMLINKS,
        attr::OWNER,
        attr::OWNER_GROUP,
        attr::SPACE_USED,
        attr::TIME_ACCESS,
        attr::TIME_METADATA,
        attr::TIME_MODIFY,
    ])
}

/// What the Linux client asks READDIR for when it lists with attributes
/// (its "plus" mode, which `ls -l` uses): those of `ls -l`, and each
/// entry's file handle, file system id, device numbers and the file id
/// of what may be mounted on it.
fn readdir_plus_attrs() -> Bitmap4 {
    Bitmap4::of(&[
        attr::RDATTR_ERROR,
        attr::TYPE,
        attr::CHANGE,
        attr::SIZE,
        attr::FSID,
        attr::FILEHANDLE,
        attr::FILEID,
        attr::MODE,
        attr::NUMLINKS,
        attr::OWNER,
        attr::OWNER_GROUP,
        attr::RAWDEV,
        attr::SPACE_USED,
        attr::TIME_ACCESS,
        attr::TIME_METADATA,
        attr::TIME_MODIFY,
        attr::MOUNTED_ON_FILEID,
    ])
}

fn name(client: u32, i: u32, renamed: bool) -> String {
    if renamed {
        format!("r{client:02}-{i:07}")
    } else {
        format!("f{client:02}-{i:07}")
    }
}

/// The components of `dir`, a path from the server's root.
fn dir_ops(dir: &str) -> Vec<String> {
    dir.split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

/// One NFSv4.1 client: its session, and the path of the directory.
struct Meta4 {
    c: Client,
    dir: Vec<String>,
}

impl Meta4 {
    fn n(&self) -> u32 {
        1 + self.dir.len() as u32
    }

    fn put_dir(&self, e: &mut sluice_proto::xdr::Encoder) {
        e.u32(op::PUTROOTFH);
        for d in &self.dir {
            e.u32(op::LOOKUP);
            Component4::new(d).encode(e);
        }
    }

    fn path(&self, file: &str) -> String {
        let mut p = self.dir.join("/");
        p.push('/');
        p.push_str(file);
        p
    }

    async fn create(&self, file: &str, data: &[u8]) -> Result<(), ClientError> {
        let f: OpenFile = self.c.open(&self.path(file), true, true).await?;
        let n = self.c.write(&f, 0, data, false).await?;
        if n as usize != data.len() {
            return Err(ClientError::Malformed);
        }
        self.c.close(&f).await
    }

    async fn stat(&self, file: &str) -> Result<(), ClientError> {
        let r = self
            .c
            .compound(self.n() + 3, |e| {
                self.put_dir(e);
                e.u32(op::LOOKUP);
                Component4::new(file).encode(e);
                e.u32(op::GETFH);
                e.u32(op::GETATTR);
                ls_attrs().encode(e);
            })
            .await?;
        r.walk(|opnum, d| {
            let bad = |_| ClientError::Malformed;
            match opnum {
                op::GETFH => {
                    d.opaque(128).map_err(bad)?;
                }
                op::GETATTR => {
                    Fattr4::decode(d).map_err(bad)?;
                }
                _ => {}
            }
            Ok(())
        })
    }

    /// One READDIR from `cookie` (with `names`, asking for types and
    /// file ids only): (entries, last cookie, verifier, eof).
    async fn readdir(
        &self,
        cookie: u64,
        verf: [u8; 8],
        names: bool,
    ) -> Result<(u64, u64, [u8; 8], bool), ClientError> {
        let r = self
            .c
            .compound(self.n() + 1, |e| {
                self.put_dir(e);
                e.u32(op::READDIR);
                e.u64(cookie);
                e.opaque_fixed(&verf);
                e.u32(READDIR_MAX / 4);
                e.u32(READDIR_MAX);
                if names {
                    Bitmap4::of(&[attr::TYPE, attr::RDATTR_ERROR, attr::MOUNTED_ON_FILEID])
                        .encode(e);
                } else {
                    readdir_plus_attrs().encode(e);
                }
            })
            .await?;
        let mut out = (0, cookie, verf, false);
        r.walk(|opnum, d| {
            if opnum != op::READDIR {
                return Ok(());
            }
            let bad = |_| ClientError::Malformed;
            out.2 = d.array::<8>().map_err(bad)?;
            while d.bool().map_err(bad)? {
                out.1 = d.u64().map_err(bad)?;
                d.opaque(4096).map_err(bad)?;
                Fattr4::decode(d).map_err(bad)?;
                out.0 += 1;
            }
            out.3 = d.bool().map_err(bad)?;
            Ok(())
        })?;
        Ok(out)
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        self.c
            .compound(self.n() + 2, |e| {
                self.put_dir(e);
                e.u32(op::SAVEFH);
                e.u32(op::RENAME);
                Component4::new(from).encode(e);
                Component4::new(to).encode(e);
            })
            .await?
            .check()
    }

    async fn remove(&self, file: &str) -> Result<(), ClientError> {
        self.c
            .compound(self.n() + 1, |e| {
                self.put_dir(e);
                e.u32(op::REMOVE);
                Component4::new(file).encode(e);
            })
            .await?
            .check()
    }
}

/// One NFSv3 client: its connection, and the directory's handle.
struct Meta3 {
    c: Client3,
    dir: Vec<u8>,
}

impl Meta3 {
    async fn create(&self, file: &str, data: &[u8]) -> Result<(), ClientError> {
        let (fh, _) = self.c.create(&self.dir, file).await?;
        let f = File3 { fh, size: 0 };
        let w = self.c.write(&f, 0, data, Stable::Unstable).await?;
        if w.count as usize != data.len() {
            return Err(ClientError::Malformed);
        }
        Ok(())
    }

    async fn stat(&self, file: &str) -> Result<(), ClientError> {
        let (fh, size) = self.c.lookup(&self.dir, file).await?;
        if size.is_none() {
            // No attributes in the reply: ask for them, as a client must.
            self.c.size(&fh).await?;
        }
        Ok(())
    }
}

/// A client of either protocol.
enum Meta {
    V4(Meta4),
    V3(Meta3),
}

impl Meta {
    async fn connect(a: &Args, dir: &[String]) -> Result<Meta, String> {
        let cannot = |e: ClientError| format!("cannot connect to {}: {e}", a.server);
        if a.proto == Proto::V4 {
            return Ok(Meta::V4(Meta4 {
                c: Client::connect(&a.server, 1, 1).await.map_err(cannot)?,
                dir: dir.to_vec(),
            }));
        }
        let mut fh = a.mount.root(&a.server).await?;
        let c = Client3::connect(&a.server).await.map_err(cannot)?;
        for d in dir {
            fh = c
                .lookup(&fh, d)
                .await
                .map_err(|e| format!("LOOKUP of {d} in {}: {e}", dir.join("/")))?
                .0;
        }
        Ok(Meta::V3(Meta3 { c, dir: fh }))
    }

    async fn create(&self, file: &str, data: &[u8]) -> Result<(), ClientError> {
        match self {
            Meta::V4(m) => m.create(file, data).await,
            Meta::V3(m) => m.create(file, data).await,
        }
    }

    async fn stat(&self, file: &str) -> Result<(), ClientError> {
        match self {
            Meta::V4(m) => m.stat(file).await,
            Meta::V3(m) => m.stat(file).await,
        }
    }

    /// One READDIR (NFSv3: READDIRPLUS; with `names`, READDIR asking
    /// for types and file ids only) from `cookie`: (entries, last cookie,
    /// verifier, eof).
    async fn readdir(
        &self,
        cookie: u64,
        verf: [u8; 8],
        names: bool,
    ) -> Result<(u64, u64, [u8; 8], bool), ClientError> {
        match self {
            Meta::V4(m) => m.readdir(cookie, verf, names).await,
            Meta::V3(m) => {
                let p = if names {
                    m.c.readdir(&m.dir, cookie, verf, READDIR_MAX).await?
                } else {
                    m.c.readdirplus(&m.dir, cookie, verf, READDIR_MAX).await?
                };
                Ok((p.entries, p.cookie, p.verf, p.eof))
            }
        }
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        match self {
            Meta::V4(m) => m.rename(from, to).await,
            Meta::V3(m) => m.c.rename(&m.dir, from, to).await,
        }
    }

    async fn remove(&self, file: &str) -> Result<(), ClientError> {
        match self {
            Meta::V4(m) => m.remove(file).await,
            Meta::V3(m) => m.c.remove(&m.dir, file).await,
        }
    }

    async fn leave(&self) {
        if let Meta::V4(m) = self {
            let _ = m.c.leave().await;
        }
    }
}

/// User plus system CPU time of process `pid`, from /proc.
fn cpu_time(pid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the system; no pointers.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        n if n > 0 => n as f64,
        _ => 100.0,
    };
    Some(Duration::from_secs_f64(ticks as f64 / hz))
}

struct PhaseResult {
    name: &'static str,
    ops: u64,
    seconds: f64,
    lat: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
    server_cpu: Option<Duration>,
}

async fn phase(name: &'static str, clients: &[Arc<Meta>], a: &Args) -> PhaseResult {
    let lat = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
    ));
    let errs = Arc::new(Mutex::new((0u64, None::<String>)));
    let cpu0 = a.server_pid.and_then(cpu_time);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (ci, m) in clients.iter().enumerate() {
        let (m, lat, errs, files) = (m.clone(), lat.clone(), errs.clone(), a.files);
        tasks.push(tokio::spawn(async move {
            let data = vec![0x5a_u8; FILE_BYTES];
            let ci = ci as u32;
            let mut ops = 0u64;
            let note = |r: Result<(), ClientError>, t: Instant| match r {
                Ok(()) => {
                    let us = t.elapsed().as_micros().max(1) as u64;
                    let _ = lat.lock().map(|mut h| h.record(us));
                }
                Err(e) => {
                    if let Ok(mut g) = errs.lock() {
                        g.0 += 1;
                        g.1.get_or_insert_with(|| e.to_string());
                    }
                }
            };
            if name == "readdir" || name == "names" {
                let (mut cookie, mut verf) = (0u64, [0u8; 8]);
                loop {
                    let t = Instant::now();
                    match m.readdir(cookie, verf, name == "names").await {
                        Ok((n, last, v, eof)) => {
                            note(Ok(()), t);
                            ops += n;
                            (cookie, verf) = (last, v);
                            if eof || n == 0 {
                                break;
                            }
                        }
                        Err(e) => {
                            note(Err(e), t);
                            break;
                        }
                    }
                }
                return ops;
            }
            for i in 0..files {
                let t = Instant::now();
                let r = match name {
                    "create" => m.create(&self::name(ci, i, false), &data).await,
                    "stat" => m.stat(&self::name(ci, i, false)).await,
                    "rename" => {
                        m.rename(&self::name(ci, i, false), &self::name(ci, i, true))
                            .await
                    }
                    _ => m.remove(&self::name(ci, i, true)).await,
                };
                if r.is_ok() {
                    ops += 1;
                }
                note(r, t);
            }
            ops
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.unwrap_or(0);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let server_cpu = cpu_since(a.server_pid, cpu0);
    let lat = lat
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    let (errors, first_error) = errs.lock().map(|g| g.clone()).unwrap_or_default();
    PhaseResult {
        name,
        ops,
        seconds,
        lat,
        errors,
        first_error,
        server_cpu,
    }
}

/// CPU time process `pid` used since `before` (None when unknown).
fn cpu_since(pid: Option<u32>, before: Option<Duration>) -> Option<Duration> {
    match (before, pid.and_then(cpu_time)) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    }
}

fn json_of(p: &PhaseResult) -> serde_json::Value {
    let q = |f: f64| p.lat.value_at_quantile(f);
    serde_json::json!({
        "ops": p.ops,
        "seconds": p.seconds,
        "ops_per_s": if p.seconds > 0.0 { p.ops as f64 / p.seconds } else { 0.0 },
        "calls": p.lat.len(),
        "p50_us": q(0.5),
        "p99_us": q(0.99),
        "max_us": p.lat.max(),
        "errors": p.errors,
        "first_error": p.first_error,
        "server_cpu_s": p.server_cpu.map(|d| d.as_secs_f64()),
        "server_cpu_us_per_op": p.server_cpu.filter(|_| p.ops > 0)
            .map(|d| d.as_secs_f64() * 1e6 / p.ops as f64),
    })
}

async fn run(a: Args) -> Result<serde_json::Value, String> {
    let wanted = phases_of(&a)?;
    if let Some(path) = &a.local {
        return local::run(&a, path);
    }
    let dir = dir_ops(a.dir.as_deref().unwrap_or_default());
    let mut clients = Vec::new();
    for _ in 0..a.clients {
        clients.push(Arc::new(Meta::connect(&a, &dir).await?));
    }
    let mut phases = serde_json::Map::new();
    for p in wanted {
        if !a.json {
            eprintln!("sluice-meta: {p} ...");
        }
        let r = phase(p, &clients, &a).await;
        print_phase(&r, &a);
        phases.insert(r.name.to_string(), json_of(&r));
    }
    for m in &clients {
        m.leave().await;
    }
    Ok(serde_json::json!({
        "proto": format!("{:?}", a.proto).to_lowercase(),
        "uid": a.caller.uid,
        "gid": a.caller.gid(),
        "clients": a.clients,
        "files_per_client": a.files,
        "file_bytes": FILE_BYTES,
        "phases": phases,
    }))
}

/// The phases of `a` that are known, in the order they run (an unknown
/// one is an error).
fn phases_of(a: &Args) -> Result<Vec<&'static str>, String> {
    for p in &a.phases {
        if !PHASES.contains(&p.as_str()) {
            return Err(format!(
                "unknown phase {p:?}: choose from {}",
                PHASES.join(", ")
            ));
        }
    }
    Ok(PHASES
        .into_iter()
        .filter(|p| a.phases.iter().any(|q| q == p))
        .collect())
}

/// Prints a phase's figures as text, unless JSON was asked for.
fn print_phase(r: &PhaseResult, a: &Args) {
    if a.json {
        return;
    }
    let cpu = r
        .server_cpu
        .filter(|_| r.ops > 0)
        .map(|d| {
            let whose = if a.local.is_some() { "own" } else { "server" };
            format!(
                ", {whose} CPU {:.1} us/op",
                d.as_secs_f64() * 1e6 / r.ops as f64
            )
        })
        .unwrap_or_default();
    println!(
        "{:8} {:>9} ops in {:6.2} s: {:>9.0} ops/s, call p50 {} us p99 {} us, {} errors{cpu}",
        r.name,
        r.ops,
        r.seconds,
        r.ops as f64 / r.seconds.max(1e-9),
        r.lat.value_at_quantile(0.5),
        r.lat.value_at_quantile(0.99),
        r.errors
    );
    if let Some(e) = &r.first_error {
        println!("         first error: {e}");
    }
}

fn main() {
    let a = Args::parse();
    let json = a.json;
    a.caller.call_as();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice-meta: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    match rt.block_on(run(a)) {
        Ok(v) => {
            if json {
                println!("{v}");
            }
        }
        Err(e) => {
            eprintln!("sluice-meta: {e}");
            std::process::exit(1);
        }
    }
}

/// `--local`: the phases done by threads with system calls on a local
/// directory, no server between.
mod local {
    use super::{
        cpu_since, cpu_time, json_of, phases_of, print_phase, Args, PhaseResult, FILE_BYTES,
    };
    use hdrhistogram::Histogram;
    use std::ffi::{CString, OsStr};
    use std::fs::File;
    use std::io::{self, Write};
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::time::Instant;

    /// Runs `a`'s phases in `path`, as [`super::run`] does over NFS.
    pub fn run(a: &Args, path: &Path) -> Result<serde_json::Value, String> {
        let wanted = phases_of(a)?;
        let dir = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        if std::fs::read_dir(path)
            .map_err(|e| format!("cannot list {}: {e}", path.display()))?
            .next()
            .is_some()
        {
            return Err(format!("{} is not empty", path.display()));
        }
        let mut phases = serde_json::Map::new();
        for p in wanted {
            if !a.json {
                eprintln!("sluice-meta: {p} (local) ...");
            }
            let r = phase(p, &dir, path, a);
            print_phase(&r, a);
            phases.insert(r.name.to_string(), json_of(&r));
        }
        Ok(serde_json::json!({
            "proto": "local",
            "synced": a.sync_dir,
            "clients": a.clients,
            "files_per_client": a.files,
            "file_bytes": FILE_BYTES,
            "phases": phases,
        }))
    }

    /// What one thread measured: latencies, operations, errors.
    struct Tally {
        lat: Histogram<u64>,
        ops: u64,
        errors: u64,
        first_error: Option<String>,
    }

    impl Tally {
        fn note(&mut self, r: io::Result<u64>, t: Instant, what: &str) {
            match r {
                Ok(n) => {
                    self.ops += n;
                    let _ = self.lat.record(t.elapsed().as_micros().max(1) as u64);
                }
                Err(e) => {
                    self.errors += 1;
                    self.first_error
                        .get_or_insert_with(|| format!("{what}: {e}"));
                }
            }
        }
    }

    fn phase(name: &'static str, dir: &File, path: &Path, a: &Args) -> PhaseResult {
        let me = std::process::id();
        let cpu0 = cpu_time(me);
        let t0 = Instant::now();
        let tallies: Vec<Tally> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..a.clients)
                .map(|ci| s.spawn(move || client(name, ci, dir, path, a)))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a local client does not panic"))
                .collect()
        });
        let seconds = t0.elapsed().as_secs_f64();
        let mut lat = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
        let (mut ops, mut errors, mut first_error) = (0, 0, None);
        for t in tallies {
            let _ = lat.add(&t.lat);
            ops += t.ops;
            errors += t.errors;
            first_error = first_error.or(t.first_error);
        }
        PhaseResult {
            name,
            ops,
            seconds,
            lat,
            errors,
            first_error,
            server_cpu: cpu_since(Some(me), cpu0),
        }
    }

    /// One client's share of phase `name`, as a thread.
    fn client(name: &str, ci: u32, dir: &File, path: &Path, a: &Args) -> Tally {
        let mut t = Tally {
            lat: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            ops: 0,
            errors: 0,
            first_error: None,
        };
        let d = dir.as_raw_fd();
        let synced = |r: io::Result<()>| -> io::Result<u64> {
            r?;
            if a.sync_dir {
                dir.sync_all()?;
            }
            Ok(1)
        };
        if name == "readdir" || name == "names" {
            let start = Instant::now();
            let r = list(path, d, name == "readdir");
            t.note(r, start, name);
            return t;
        }
        let data = vec![0x5a_u8; FILE_BYTES];
        for i in 0..a.files {
            let start = Instant::now();
            let r = match name {
                "create" => synced(create(d, &super::name(ci, i, false), &data)),
                "stat" => stat(d, &super::name(ci, i, false)).map(|_| 1),
                "rename" => synced(rename(
                    d,
                    &super::name(ci, i, false),
                    &super::name(ci, i, true),
                )),
                _ => synced(unlink(d, &super::name(ci, i, true))),
            };
            t.note(r, start, name);
        }
        t
    }

    fn c_name(n: &(impl AsRef<OsStr> + ?Sized)) -> io::Result<CString> {
        CString::new(n.as_ref().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    }

    /// A return value of -1 as the error it stands for.
    fn check(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    /// A new file `n` in the directory `d`, with `data` written to it.
    fn create(d: libc::c_int, n: &str, data: &[u8]) -> io::Result<()> {
        let n = c_name(n)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC;
        // SAFETY: valid descriptor and NUL-terminated name.
        let fd = check(unsafe { libc::openat(d, n.as_ptr(), flags, 0o644 as libc::c_uint) })?;
        // SAFETY: openat just returned this descriptor, owned by no one else.
        let mut f = unsafe { File::from_raw_fd(fd) };
        f.write_all(data)
    }

    fn stat(d: libc::c_int, n: &(impl AsRef<OsStr> + ?Sized)) -> io::Result<()> {
        let n = c_name(n)?;
        // SAFETY: an all-zero stat is valid; fstatat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor, name and out pointer.
        check(unsafe { libc::fstatat(d, n.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
        Ok(())
    }

    fn rename(d: libc::c_int, from: &str, to: &str) -> io::Result<()> {
        let (from, to) = (c_name(from)?, c_name(to)?);
        // SAFETY: valid descriptor and NUL-terminated names.
        check(unsafe { libc::renameat(d, from.as_ptr(), d, to.as_ptr()) })?;
        Ok(())
    }

    fn unlink(d: libc::c_int, n: &str) -> io::Result<()> {
        let n = c_name(n)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        check(unsafe { libc::unlinkat(d, n.as_ptr(), 0) })?;
        Ok(())
    }

    /// Lists the directory whole (with `attrs`, each entry's status
    /// too, as `ls -l` does); the number of entries.
    fn list(path: &Path, d: libc::c_int, attrs: bool) -> io::Result<u64> {
        let mut n = 0;
        for e in std::fs::read_dir(path)? {
            let e = e?;
            if attrs {
                stat(d, &e.file_name())?;
            }
            n += 1;
        }
        Ok(n)
    }
}
