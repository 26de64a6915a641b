//! sluice-statebench: how fast a server grants and releases opens and
//! locks, with and without many idle clients holding state.
//!
//! It measures OPEN+CLOSE and LOCK+LOCKU pairs (one COMPOUND each, the
//! second op using the current stateid) from one client with several
//! requests in flight, then makes `--idle-clients` clients that each hold
//! `--opens` open files and goes quiet, and measures again. The cost of
//! an open or a lock should not grow with the state other clients hold.

// Clients take no identities (see the workspace's clippy.toml).
#![allow(clippy::disallowed_methods)]

use clap::Parser;
use sluice_load::client::{Client, ClientError};
use sluice_proto::nfs4::consts::op;
use sluice_proto::nfs4::msg::{
    lock_type, CloseArgs, Component4, LockArgs, Locker4, LockuArgs, NfsFh4, OpenArgs, OpenClaim4,
    OpenToLockOwner4, Openflag4, Stateid4, Xdr, SHARE_ACCESS_BOTH,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Clone)]
#[command(about = "OPEN+CLOSE and LOCK+LOCKU rates with and without idle clients holding state")]
struct Cli {
    /// Server address.
    #[arg(long, default_value = "127.0.0.1:2049")]
    server: String,
    /// Idle clients made between the two measurements.
    #[arg(long, default_value_t = 1000)]
    idle_clients: u32,
    /// Open files each idle client holds.
    #[arg(long, default_value_t = 10)]
    opens: u32,
    /// Seconds each rate is measured for.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    inflight: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

const ACTIVE_FILE: &str = "statebench-active";

/// OPEN (CLAIM_NULL, no create) by `owner` of `name` in the root, then
/// CLOSE of the current stateid.
async fn open_close(c: &Client, owner: &[u8], name: &str) -> Result<(), ClientError> {
    c.compound(3, |e| {
        e.u32(op::PUTROOTFH);
        e.u32(op::OPEN);
        OpenArgs {
            seqid: 0,
            share_access: SHARE_ACCESS_BOTH,
            share_deny: 0, // OPEN4_SHARE_DENY_NONE
            owner: c.state_owner(owner),
            openhow: Openflag4::NoCreate,
            claim: OpenClaim4::Null(Component4::new(name)),
        }
        .encode(e);
        e.u32(op::CLOSE);
        CloseArgs {
            seqid: 0,
            stateid: Stateid4::CURRENT,
        }
        .encode(e);
    })
    .await
    .and_then(|r| r.check())
}

/// LOCK (write, by `owner`, of a range of its own) under `open`, then
/// LOCKU of the current stateid.
async fn lock_unlock(
    c: &Client,
    fh: &NfsFh4,
    open: &Stateid4,
    owner: &[u8],
    at: u64,
) -> Result<(), ClientError> {
    c.compound(3, |e| {
        e.u32(op::PUTFH);
        fh.encode(e);
        e.u32(op::LOCK);
        LockArgs {
            locktype: lock_type::WRITE,
            reclaim: false,
            offset: at,
            length: 1,
            locker: Locker4::New(OpenToLockOwner4 {
                open_seqid: 0,
                open_stateid: *open,
                lock_seqid: 0,
                lock_owner: c.state_owner(owner),
            }),
        }
        .encode(e);
        e.u32(op::LOCKU);
        LockuArgs {
            locktype: lock_type::WRITE,
            seqid: 0,
            lock_stateid: Stateid4::CURRENT,
            offset: at,
            length: 1,
        }
        .encode(e);
    })
    .await
    .and_then(|r| r.check())
}

/// Pairs per second of `pair`, run by `inflight` tasks for `secs`.
async fn rate<F, Fut>(inflight: u32, secs: f64, pair: F) -> Result<f64, String>
where
    F: Fn(u32, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), ClientError>> + Send,
{
    let pair = Arc::new(pair);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for t in 0..inflight {
        let (pair, done) = (pair.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < end {
                pair(t, i)
                    .await
                    .map_err(|e| format!("task {t}, pair {i}: {e}"))?;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// (OPEN+CLOSE, LOCK+LOCKU) pairs per second from `c`.
async fn measure(c: &Arc<Client>, cli: &Cli) -> Result<(f64, f64), String> {
    let c1 = c.clone();
    let opens = rate(cli.inflight, cli.seconds, move |t, _| {
        let c = c1.clone();
        async move { open_close(&c, format!("bench-open-{t}").as_bytes(), ACTIVE_FILE).await }
    })
    .await?;
    let f = c
        .open(ACTIVE_FILE, true, false)
        .await
        .map_err(|e| format!("open {ACTIVE_FILE}: {e}"))?;
    let c2 = c.clone();
    let fh = Arc::new(f.fh.clone());
    let sid = f.sid;
    let locks = rate(cli.inflight, cli.seconds, move |t, _| {
        let (c, fh) = (c2.clone(), fh.clone());
        async move {
            lock_unlock(
                &c,
                &fh,
                &sid,
                format!("bench-lock-{t}").as_bytes(),
                t as u64 * 16,
            )
            .await
        }
    })
    .await?;
    Ok((opens, locks))
}

async fn run(cli: Cli) -> Result<(), String> {
    let active = Arc::new(
        Client::connect(&cli.server, 1, cli.inflight.max(1) * 2)
            .await
            .map_err(|e| format!("connect to {}: {e}", cli.server))?,
    );
    active
        .open(ACTIVE_FILE, true, true)
        .await
        .map_err(|e| format!("create {ACTIVE_FILE}: {e}"))?;
    eprintln!("warming up ...");
    measure(
        &active,
        &Cli {
            seconds: cli.seconds.min(1.0),
            ..cli.clone()
        },
    )
    .await?;
    eprintln!("measuring with no other clients ...");
    let (o1, l1) = measure(&active, &cli).await?;
    eprintln!(
        "making {} idle clients with {} open files each ...",
        cli.idle_clients, cli.opens
    );
    let t = Instant::now();
    for i in 0..cli.idle_clients {
        let c = Client::connect(&cli.server, 1, 4)
            .await
            .map_err(|e| format!("idle client {i}: {e}"))?;
        for j in 0..cli.opens {
            c.open(&format!("statebench-idle-{i}-{j}"), true, true)
                .await
                .map_err(|e| format!("idle client {i}, file {j}: {e}"))?;
        }
        // Idle: no session (and so no share of the reply cache), only state.
        c.destroy_session()
            .await
            .map_err(|e| format!("idle client {i}: DESTROY_SESSION: {e}"))?;
        if (i + 1) % 250 == 0 {
            eprintln!("  {} clients ({:.1} s)", i + 1, t.elapsed().as_secs_f64());
        }
    }
    eprintln!("measuring with them ...");
    let (o2, l2) = measure(&active, &cli).await?;
    if cli.json {
        println!(
            "{{\"idle_clients\":{},\"opens_each\":{},\"open_close_per_s\":[{o1:.0},{o2:.0}],\"lock_locku_per_s\":[{l1:.0},{l2:.0}]}}",
            cli.idle_clients, cli.opens
        );
    } else {
        let held = cli.idle_clients * cli.opens;
        println!(
            "| pairs/s | no other clients | {} idle clients, {held} opens | ratio |",
            cli.idle_clients
        );
        println!("|---|---|---|---|");
        println!("| OPEN+CLOSE | {o1:.0} | {o2:.0} | {:.2} |", o2 / o1);
        println!("| LOCK+LOCKU | {l1:.0} | {l2:.0} | {:.2} |", l2 / l1);
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Err(e) = rt.block_on(run(cli)) {
        eprintln!("sluice-statebench: {e}");
        std::process::exit(1);
    }
}
