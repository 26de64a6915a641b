//! The `sluice` command.

use clap::{Parser, Subcommand};
use sluice::engine::export::Export;
use sluice::engine::handle::HandleKey;
use sluice::server::{Config, Server};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "sluice", version, about = "A user-space NFSv4.2 file server")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Export DIR as the NFSv4 root ("/") over TCP.
    Serve {
        /// Directory to export.
        dir: PathBuf,
        /// Address and port to listen on (port 0 picks a free one).
        #[arg(long, default_value = "0.0.0.0:2049")]
        listen: String,
        /// Where the handle key is kept; handles stay valid across restarts
        /// as long as this directory does.
        #[arg(long, default_value = "/var/lib/sluice")]
        state_dir: PathBuf,
        /// Lease time in seconds given to clients.
        #[arg(long, default_value_t = 90)]
        lease_time: u64,
        /// Serve metrics in the Prometheus text format over HTTP at this
        /// address (`GET /metrics`; port 0 picks a free one).
        #[arg(long, value_name = "ADDR:PORT")]
        metrics: Option<String>,
        /// Largest server-side readahead window of a sequential reader,
        /// in bytes (suffixes K, M, G); 0 switches server readahead off.
        #[arg(long, default_value = "16M", value_parser = parse_size)]
        readahead_max: u64,
        /// READ_PLUS reports holes of at least this many bytes (suffixes K,
        /// M, G); shorter holes are sent as data.
        #[arg(long, default_value = "32K", value_parser = parse_size)]
        read_plus_min_hole: u64,
        /// Test only: serve without byte-range locks around I/O, so reads
        /// can see half-done writes (used to show the torn-read detector works).
        #[arg(long, hide = true)]
        unsafe_no_range_locks: bool,
    },
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size suffix in {s:?}: use K, M or G")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("not a size: {s:?} (e.g. 16M, 262144)"))
}

fn load_key(state_dir: &Path) -> Result<HandleKey, String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::create_dir_all(state_dir)
        .map_err(|e| format!("cannot create state directory {}: {e}", state_dir.display()))?;
    let path = state_dir.join("handle.key");
    match std::fs::read(&path) {
        Ok(bytes) if bytes.len() == 32 => {
            let mut k = [0u8; 32];
            k.copy_from_slice(&bytes);
            return Ok(HandleKey::new(k));
        }
        Ok(_) => {
            return Err(format!(
                "{} is not a 32-byte key; remove it to make a new one (existing client handles become invalid)",
                path.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    let mut k = [0u8; 32];
    getrandom::getrandom(&mut k).map_err(|e| format!("no randomness for the handle key: {e}"))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    f.write_all(&k)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    Ok(HandleKey::new(k))
}

/// What `sluice serve` was asked to do.
struct ServeArgs {
    dir: PathBuf,
    listen: String,
    state_dir: PathBuf,
    lease: u64,
    range_locks: bool,
    metrics: Option<String>,
    readahead_max: u64,
    min_hole: u64,
}

async fn serve(a: ServeArgs) -> Result<(), String> {
    let ServeArgs {
        dir,
        listen,
        state_dir,
        lease,
        range_locks,
        metrics,
        readahead_max,
        min_hole,
    } = a;
    let key = load_key(&state_dir)?;
    let export =
        Export::open(&dir, 0, key).map_err(|e| format!("cannot export {}: {e}", dir.display()))?;
    if !range_locks {
        tracing::warn!("byte-range locks are off: reads may see half-done writes (test mode)");
    }
    let config = Config {
        lease: Duration::from_secs(lease.max(1)),
        range_locks,
        readahead: sluice::engine::readahead::Config {
            max: readahead_max,
            ..Default::default()
        },
        min_hole: min_hole.max(1),
    };
    let srv = Arc::new(Server::new(export, config).map_err(|e| format!("cannot start: {e}"))?);
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(export = %dir.display(), %addr, "serving");
    let metrics_listener = match &metrics {
        Some(m) => Some(
            tokio::net::TcpListener::bind(m)
                .await
                .map_err(|e| format!("cannot listen for metrics on {m}: {e}"))?,
        ),
        None => None,
    };
    // One line on stdout tells scripts the server is ready and where.
    println!("listening on {addr}");
    let metrics_task = match metrics_listener {
        Some(l) => {
            let maddr = l.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(%maddr, "metrics at http://{maddr}/metrics");
            println!("metrics on {maddr}");
            Some(tokio::spawn(sluice::metrics::serve(l, srv.clone())))
        }
        None => None,
    };
    let _ = std::io::stdout().flush();

    let expiry = {
        let srv = srv.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(srv.config.lease / 4);
            loop {
                tick.tick().await;
                let n = srv.state.expire();
                if n > 0 {
                    tracing::info!(clients = n, "expired silent clients");
                }
            }
        })
    };
    let server = tokio::spawn(sluice::net::serve(listener, srv.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
    }
    server.abort();
    expiry.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    // Unstable writes live in the page cache: push them to disk.
    let root = srv.export.root_fd();
    let _ = tokio::task::spawn_blocking(move || {
        use std::os::fd::AsRawFd;
        // SAFETY: valid descriptor.
        unsafe { libc::syncfs(root.as_raw_fd()) }
    })
    .await;
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Serve {
            dir,
            listen,
            state_dir,
            lease_time,
            metrics,
            readahead_max,
            read_plus_min_hole,
            unsafe_no_range_locks,
        } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))
            .and_then(|rt| {
                rt.block_on(serve(ServeArgs {
                    dir,
                    listen,
                    state_dir,
                    lease: lease_time,
                    range_locks: !unsafe_no_range_locks,
                    metrics,
                    readahead_max,
                    min_hole: read_plus_min_hole,
                }))
            }),
    };
    if let Err(e) = result {
        eprintln!("sluice: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("262144"), Ok(262144));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert!(parse_size("16X").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }
}
