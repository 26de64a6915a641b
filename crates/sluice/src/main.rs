//! The `sluice` command.

use clap::{Parser, Subcommand};
use sluice::engine::export::Export;
use sluice::engine::handle::HandleKey;
use sluice::rules::Squash;
use sluice::server::exports::{Exported, Exports, Rules};
use sluice::server::state::recovery::SqliteRecovery;
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
    /// Export DIR as the NFSv4 root ("/") over TCP, or the exports that
    /// --config lists.
    Serve(ServeCli),
}

#[derive(clap::Args)]
struct ServeCli {
    /// Directory to export (or give --config).
    #[arg(required_unless_present = "config")]
    dir: Option<PathBuf>,
    /// TOML config file: server settings, the exports and their access
    /// rules (see docs/config.md). Flags given on the command line win.
    #[arg(long, value_name = "FILE", conflicts_with = "dir")]
    config: Option<PathBuf>,
    /// Address and port to listen on (port 0 picks a free one)
    /// [default: 0.0.0.0:2049].
    #[arg(long)]
    listen: Option<String>,
    /// Where the handle key is kept; handles stay valid across restarts
    /// as long as this directory does [default: /var/lib/sluice].
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Lease time in seconds given to clients [default: 90].
    #[arg(long)]
    lease_time: Option<u64>,
    /// Grace period in seconds after every start, during which clients
    /// known from before may reclaim their opens and locks and nobody
    /// may take new ones; it ends early once all of them have reclaimed
    /// [default: one lease].
    #[arg(long)]
    grace_time: Option<u64>,
    /// Which delegations OPEN grants: "none"; "read" (clients cache a
    /// file they opened for reading until another client changes it; the
    /// change waits until they gave it back); or "all" (also write
    /// delegations: the only client with a file open keeps its writes
    /// until another client or a local process wants the file)
    /// [default: read].
    #[arg(long, value_name = "none|read|all")]
    delegations: Option<String>,
    /// Let uid 0 on clients act as root on the export (by default root is
    /// squashed to the anonymous user, 65534). With --config, applies to
    /// every export whose squash is "root".
    #[arg(long)]
    no_root_squash: bool,
    /// Answer ops that make, remove or rename names, or set attributes,
    /// before their change is on stable storage, as the Linux server's
    /// `async` exports do: faster, but a crash of this machine can undo
    /// changes clients were told were done. By default each such change
    /// is synced first. With --config, applies to every export.
    #[arg(long = "async")]
    async_: bool,
    /// Serve metrics in the Prometheus text format over HTTP at this
    /// address (`GET /metrics`; port 0 picks a free one).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    /// Largest server-side readahead window of a sequential reader, in
    /// bytes (suffixes K, M, G); 0 switches server readahead off
    /// [default: 16M].
    #[arg(long, value_parser = sluice::config::parse_size)]
    readahead_max: Option<u64>,
    /// READs of at least this many bytes (suffixes K, M, G) by a cold
    /// sequential reader with several READs in flight are read with
    /// O_DIRECT, past the page cache; 0 never does [default: 256K].
    #[arg(long, value_parser = sluice::config::parse_size)]
    direct_read_min: Option<u64>,
    /// READs of at least this many bytes (suffixes K, M, G) of data the
    /// page cache holds are sent from a mapping of the file, copied once
    /// (by the socket) instead of twice; 0 never are [default: 64K].
    #[arg(long, value_parser = sluice::config::parse_size)]
    lend_read_min: Option<u64>,
    /// WRITEs of at least this many bytes (suffixes K, M, G), at offsets
    /// and of lengths that are multiples of 4 KiB, are written past the
    /// page cache (O_DIRECT), so that a stream of them is not held back by
    /// writeback; what is written so is not in the page cache afterwards,
    /// so readers that follow soon read it from the device. 256K suits
    /// write-mostly streams (backups, ingest); 0 never does [default: 0].
    #[arg(long, value_parser = sluice::config::parse_size)]
    direct_write_min: Option<u64>,
    /// UNSTABLE WRITEs through the page cache of at least this many bytes
    /// (suffixes K, M, G) start their own writeback at once, so that the
    /// COMMIT ending a stream of them waits for its last pieces only, not
    /// for the whole stream; 0 leaves it to the kernel's writeback
    /// [default: 256K].
    #[arg(long, value_parser = sluice::config::parse_size)]
    write_behind_min: Option<u64>,
    /// How many connection threads may run quick metadata work themselves
    /// at once (creating, renaming and removing names, small page-cache
    /// writes, listing directories) rather than hand it to a request
    /// thread, which saves a wake-up per request; 0 hands all of it over
    /// [default: the number of CPUs].
    #[arg(long)]
    inline_quick_ops: Option<usize>,
    /// How long, in microseconds, a connection's thread that has just
    /// answered a request polls the socket for the client's next one
    /// before it sleeps, while that client alone keeps the server busy
    /// (one process working through files one call at a time). It saves
    /// the wake-up of a sleeping CPU per request, at the cost of keeping
    /// one CPU busy for up to that long after an answer; never more than
    /// all CPUs but one; 0 never polls [default: 50].
    #[arg(long)]
    busy_poll_us: Option<u64>,
    /// TCP congestion control algorithm of NFS connections (one of
    /// net.ipv4.tcp_available_congestion_control, e.g. cubic or reno).
    /// On a system whose default is bbr, with no fq queueing discipline,
    /// TCP paces every connection itself, which costs CPU per packet;
    /// over loopback, cubic sent cached data about 1.2 times as fast
    /// (docs/benchmarks.md). Choosing one that is
    /// not in net.ipv4.tcp_allowed_congestion_control needs root
    /// [default: the system's].
    #[arg(long, value_name = "NAME")]
    tcp_congestion: Option<String>,
    /// Which connections get data of the read cache handed to the socket
    /// by reference, without the copy into it: "remote" (clients on other
    /// machines, whose network card then does the copy), "always" or
    /// "never". A client on this machine then copies such data itself,
    /// from memory the CPU has not just touched, and becomes the slower
    /// side: over loopback a warm stream's server spent 98-195 us per 1
    /// MiB READ instead of 244-303 us, its client 234-342 instead of
    /// 176-225, at rates no better (docs/benchmarks.md) [default: remote].
    #[arg(long, value_name = "WHEN")]
    zero_copy: Option<String>,
    /// How long, in milliseconds, listings keep the attributes of the
    /// files they stat'ed, for the next listings of the directory. Every
    /// change made through a system call is seen at once (fanotify on
    /// the file system, ext4, xfs and btrfs, as root); this bounds how
    /// long one no event reports (a write through a shared mapping, an
    /// access time) may go unseen. 0 stats every entry every time
    /// [default: 1000].
    #[arg(long, value_name = "MS")]
    listing_cache_ms: Option<u64>,
    /// Memory (suffixes K, M, G) for data read with O_DIRECT, kept so that
    /// the next pass over a file is served from it [default: an eighth of
    /// the machine's memory].
    #[arg(long, value_parser = sluice::config::parse_size)]
    read_cache: Option<u64>,
    /// READ_PLUS reports holes of at least this many bytes (suffixes K, M,
    /// G); shorter holes are sent as data [default: 32K].
    #[arg(long, value_parser = sluice::config::parse_size)]
    read_plus_min_hole: Option<u64>,
    /// Run sluice's own portmapper on port 111 (TCP and UDP), for
    /// NFSv3 clients on a machine that runs no rpcbind. Without it,
    /// sluice registers NFS and MOUNT with the machine's rpcbind when one
    /// is running. Either way every program is on the NFS port.
    #[arg(long)]
    portmap: bool,
    /// Where --portmap listens [default: 0.0.0.0:111].
    #[arg(long, value_name = "ADDR:PORT")]
    portmap_listen: Option<String>,
    /// Longest file handle given to NFSv3 clients, 32 to 64 bytes; VMware
    /// ESXi needs 56 [default: 64].
    #[arg(long, value_name = "BYTES")]
    v3_max_fh: Option<usize>,
    /// Serve as one node of a cluster whose grace period and client
    /// records are kept in etcd (see docs/cluster.md): every node exports
    /// the same shared file system and clients may move between them.
    /// NAME tells clusters apart in one etcd [default: default].
    #[arg(
        long,
        value_name = "etcd://HOST:PORT[,HOST:PORT...][/NAME]",
        requires = "node_id"
    )]
    cluster: Option<String>,
    /// This node's number in the cluster, 1 to 254, unique among its nodes.
    #[arg(long, value_name = "N")]
    node_id: Option<u8>,
    /// Seconds this node keeps serving its clients' state without reaching
    /// etcd, and how soon the other nodes notice that it died [default: 10].
    #[arg(long, value_name = "SECS")]
    cluster_lease: Option<u64>,
    /// Test only: find clients' lock managers and status monitors through
    /// the portmapper at this address instead of port 111 of each client.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    nsm_portmap: Option<std::net::SocketAddr>,
    /// Test only: serve without byte-range locks around I/O, so reads can
    /// see half-done writes (used to show the torn-read detector works).
    #[arg(long, hide = true)]
    unsafe_no_range_locks: bool,
}

/// How long shutdown waits for requests in progress.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn load_key(state_dir: &Path) -> Result<HandleKey, String> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
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

/// What `sluice serve` was asked to do, command line and config file
/// merged.
struct ServeArgs {
    /// Directory, pseudo path and rules of each export, by export id.
    exports: Vec<(PathBuf, String, Rules)>,
    listen: String,
    state_dir: PathBuf,
    metrics: Option<String>,
    policy: sluice::net::Policy,
    /// TCP congestion control algorithm of NFS connections (None: the
    /// system's).
    tcp_congestion: Option<String>,
    /// Where sluice's own portmapper listens, when it runs one.
    portmap: Option<String>,
    /// The cluster this node belongs to, if any.
    cluster: Option<sluice::cluster::ClusterConfig>,
    /// The server's settings: its defaults, overridden by the file, then
    /// by the command line.
    config: Config,
}

/// Merges the command line with the config file (command line first).
fn resolve(cli: ServeCli) -> Result<ServeArgs, String> {
    use sluice::config::{ConfigFile, Size};
    let file = match &cli.config {
        Some(p) => sluice::config::load(p)?,
        None => ConfigFile::default(),
    };
    let srv = file.server;
    let exports: Vec<(PathBuf, String, Rules)> = match cli.dir {
        Some(d) => vec![(
            d,
            "/".into(),
            Rules {
                squash: Squash::Root,
                ..Default::default()
            },
        )],
        None if file.exports.is_empty() => {
            return Err("give a directory to export, or --config FILE".into())
        }
        None => file
            .exports
            .into_iter()
            .map(|e| {
                let mut rules = Rules {
                    read_only: e.read_only,
                    sync: e.sync,
                    squash: e.squash,
                    anon: (e.anon_uid, e.anon_gid),
                    clients: e.clients,
                    ..Default::default()
                };
                if let Some(Size(n)) = e.max_read {
                    rules.max_read = n as u32;
                }
                if let Some(Size(n)) = e.max_write {
                    rules.max_write = n as u32;
                }
                (e.path, e.pseudo, rules)
            })
            .collect(),
    };
    let mut policy = sluice::net::Policy {
        require_privileged_port: srv.require_privileged_port.unwrap_or(false),
        ..Default::default()
    };
    if let Some(n) = srv.max_connections {
        policy.max_connections = n;
    }
    let mut exports = exports;
    if cli.async_ {
        for (_, _, r) in &mut exports {
            r.sync = false;
        }
    }
    if cli.no_root_squash {
        for (_, _, r) in &mut exports {
            if r.squash == Squash::Root {
                r.squash = Squash::None;
            }
        }
    }
    let mut config = Config {
        range_locks: !cli.unsafe_no_range_locks,
        nsm_portmap: cli.nsm_portmap,
        // As many as the runtime has threads for connections (one per CPU).
        quick_inline: std::thread::available_parallelism().map_or(1, |n| n.get()),
        busy_poll: Duration::from_micros(50),
        ..Default::default()
    };
    if let Some(secs) = cli.lease_time.or(srv.lease_time) {
        config.lease = Duration::from_secs(secs.max(1));
    }
    if let Some(secs) = cli.grace_time.or(srv.grace_time) {
        config.grace = Some(Duration::from_secs(secs));
    }
    if let Some(z) = cli.zero_copy.or(srv.zero_copy) {
        config.zero_copy = z.parse()?;
    }
    match cli.delegations.or(srv.delegations) {
        Some(d) => config.delegations = d.parse()?,
        // A delegation on one node would not be recalled when a client of
        // another node changes the file.
        None if cli.cluster.is_some() || srv.cluster.is_some() => {
            config.delegations = sluice::server::Delegations::None
        }
        None => {}
    }
    if let Some(max) = cli.readahead_max.or(srv.readahead_max.map(|Size(n)| n)) {
        config.readahead.max = max;
    }
    if let Some(min) = cli.direct_read_min.or(srv.direct_read_min.map(|Size(n)| n)) {
        config.readahead.direct_min = min;
    }
    if let Some(min) = cli.lend_read_min.or(srv.lend_read_min.map(|Size(n)| n)) {
        config.readahead.lend_min = min;
    }
    if let Some(n) = cli
        .direct_write_min
        .or(srv.direct_write_min.map(|Size(n)| n))
    {
        config.direct_write_min = n;
    }
    if let Some(n) = cli
        .write_behind_min
        .or(srv.write_behind_min.map(|Size(n)| n))
    {
        config.write_behind_min = n;
    }
    if let Some(n) = cli.inline_quick_ops.or(srv.inline_quick_ops) {
        config.quick_inline = n;
    }
    if let Some(us) = cli.busy_poll_us.or(srv.busy_poll_us) {
        sluice::config::check_busy_poll(us).map_err(|m| format!("--busy-poll-us: {m}"))?;
        config.busy_poll = Duration::from_micros(us);
    }
    if let Some(n) = cli.read_cache.or(srv.read_cache.map(|Size(n)| n)) {
        config.read_cache = n;
    }
    if let Some(hole) = cli
        .read_plus_min_hole
        .or(srv.read_plus_min_hole.map(|Size(n)| n))
    {
        config.min_hole = hole.max(1);
    }
    if let Some(ms) = cli.listing_cache_ms.or(srv.listing_cache_ms) {
        config.listing_cache = Some(std::time::Duration::from_millis(ms));
    }
    if let Some(n) = cli.v3_max_fh.or(srv.v3_max_fh) {
        if !(32..=64).contains(&n) {
            return Err(format!("v3_max_fh: {n} is not between 32 and 64 bytes"));
        }
        config.v3_max_fh = n;
    }
    if let Some(name) = &cli.tcp_congestion {
        sluice::net::check_congestion(name).map_err(|m| format!("--tcp-congestion: {m}"))?;
    }
    let tcp_congestion = cli.tcp_congestion.or(srv.tcp_congestion);
    let portmap = (cli.portmap || srv.portmap.unwrap_or(false)).then(|| {
        cli.portmap_listen
            .or(srv.portmap_listen)
            .unwrap_or_else(|| "0.0.0.0:111".into())
    });
    // A connection is taken from addresses that some export admits;
    // each export checks its own list again on every use.
    if exports.iter().all(|(_, _, r)| !r.clients.is_empty()) {
        policy.clients = exports
            .iter()
            .flat_map(|(_, _, r)| r.clients.iter().copied())
            .collect();
    }
    let cluster = match cli.cluster.or(srv.cluster) {
        Some(url) => {
            let (endpoints, name) = sluice::cluster::ClusterConfig::parse_url(&url)?;
            let node = cli
                .node_id
                .or(srv.node_id)
                .ok_or("a cluster node needs --node-id N (config key node_id)")?;
            Some(sluice::cluster::ClusterConfig {
                endpoints,
                name,
                node,
                ttl: Duration::from_secs(
                    cli.cluster_lease.or(srv.cluster_lease).unwrap_or(10).max(2),
                ),
                grace: config.grace.unwrap_or(config.lease),
            })
        }
        None => None,
    };
    Ok(ServeArgs {
        cluster,
        exports,
        listen: cli
            .listen
            .or(srv.listen)
            .unwrap_or_else(|| "0.0.0.0:2049".into()),
        state_dir: cli
            .state_dir
            .or(srv.state_dir)
            .unwrap_or_else(|| "/var/lib/sluice".into()),
        metrics: cli.metrics.or(srv.metrics),
        policy,
        tcp_congestion,
        portmap,
        config,
    })
}

async fn serve(a: ServeArgs) -> Result<(), String> {
    let ServeArgs {
        exports,
        listen,
        state_dir,
        metrics,
        policy,
        tcp_congestion,
        portmap,
        config,
        cluster,
    } = a;
    let mut config = config;
    let (key, cluster) = match cluster {
        Some(c) => {
            let endpoints = c.endpoints.join(", ");
            let node = c.node;
            let cluster = sluice::tasks::blocking(move || sluice::cluster::Cluster::join(c))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| {
                    format!("cannot join the cluster: {e}; is etcd running at {endpoints}?")
                })?;
            tracing::info!(
                node,
                "cluster node: handle key, client records and grace in etcd"
            );
            config.recovery = Some(cluster.clone());
            config.server_owner = Some(cluster.owner.clone());
            config.boot_id = Some(cluster.boot);
            config.shared_locks = true;
            (HandleKey::new(cluster.key), Some(cluster))
        }
        None => {
            let key = load_key(&state_dir)?;
            let db = state_dir.join("clients.db");
            config.recovery = Some(Arc::new(
                SqliteRecovery::open(&db).map_err(|e| format!("{e}; check the state directory, or move the file away to start with no client records (no client can then reclaim)"))?,
            ));
            (key, None)
        }
    };
    let mut list = Vec::new();
    for (id, (dir, pseudo, rules)) in exports.into_iter().enumerate() {
        let keep_for = config
            .listing_cache
            .unwrap_or(sluice::engine::attr_cache::KEEP_FOR);
        let fs = Export::open_keeping(&dir, id as u8, key.clone(), keep_for)
            .map_err(|e| format!("cannot export {}: {e}", dir.display()))?;
        list.push(Exported { fs, pseudo, rules });
    }
    let exports = Exports::new(list, key).map_err(|e| format!("cannot export: {e}"))?;
    if !config.range_locks {
        tracing::warn!("byte-range locks are off: reads may see half-done writes (test mode)");
    }
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    if let Some(name) = &tcp_congestion {
        // Accepted connections inherit it from the listening socket.
        sluice::net::set_congestion(std::os::fd::AsFd::as_fd(&listener), name)
            .map_err(|m| format!("tcp_congestion: {m}"))?;
        tracing::info!(algorithm = %name, "TCP congestion control of NFS connections");
    }
    // MOUNT, NLM and NSM answer over UDP on the same port too.
    let udp = tokio::net::UdpSocket::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} (UDP): {e}"))?;
    config.port = addr.port();
    for e in exports.list() {
        if e.fs.root_fh().len() > config.v3_max_fh {
            tracing::warn!(
                export = %e.fs.path().display(),
                len = e.fs.root_fh().len(),
                max = config.v3_max_fh,
                "file handles of this export are too long for NFSv3 clients (see --v3-max-fh); NFSv4 serves it"
            );
        }
    }
    let local_leases = config.local_leases;
    let srv = Server::with_exports(exports, config)
        .map_err(|e| format!("cannot start: {e}"))?
        .shared();
    if let Some(c) = &cluster {
        let s = srv.clone();
        c.attach(Box::new(move |ev| match ev {
            sluice::cluster::GraceEvent::Begin { owners, .. } => {
                s.state.cluster_grace_begin(&owners)
            }
            sluice::cluster::GraceEvent::End => s.state.cluster_grace_end(),
        }));
    }
    if local_leases {
        sluice::server::leases::watch(srv.clone())
            .map_err(|e| format!("cannot start the lease watcher: {e}"))?;
    }
    tracing::info!(%addr, "serving");
    let table = sluice::server::portmap::Table { port: addr.port() };
    let (portmap_tasks, registered) = match &portmap {
        Some(at) => (
            sluice::net::serve_portmap(at, table)
                .await
                .map_err(|e| format!("cannot run the portmapper on {at}: {e}; is rpcbind running? (stop it, or leave out --portmap to register with it)"))?,
            Vec::new(),
        ),
        None => {
            let port = addr.port();
            let taken = match sluice::tasks::blocking(move || sluice::server::portmap::register(port)).await {
                Ok(Ok(taken)) => {
                    if taken.len() == sluice::server::portmap::PROGRAMS.len() {
                        tracing::info!("registered NFS and MOUNT with rpcbind");
                    } else {
                        tracing::warn!(
                            registered = ?taken,
                            "rpcbind keeps another server's NFS or MOUNT registration; NFSv3 clients that ask it are sent there"
                        );
                    }
                    taken
                }
                Ok(Err(e)) => {
                    tracing::info!(error = %e, "no rpcbind to register with (NFSv3 clients need the port in their mount options, or --portmap)");
                    Vec::new()
                }
                Err(_) => Vec::new(),
            };
            (Vec::new(), taken)
        }
    };
    for e in srv.exports.list() {
        let r = &e.rules;
        let clients: Vec<String> = r.clients.iter().map(|c| c.to_string()).collect();
        tracing::info!(
            export = %e.fs.path().display(),
            pseudo = %e.pseudo,
            read_only = r.read_only,
            sync = r.sync,
            squash = ?r.squash,
            clients = %if clients.is_empty() { "everyone".to_string() } else { clients.join(", ") },
            "exported"
        );
    }
    let metrics_listener = match &metrics {
        Some(m) => Some(
            tokio::net::TcpListener::bind(m)
                .await
                .map_err(|e| format!("cannot listen for metrics on {m}: {e}"))?,
        ),
        None => None,
    };
    // The signals are taken before anyone is told the server is ready:
    // until then their default action ends the process at once, so a
    // SIGTERM or SIGINT right after the line below would skip the clean
    // shutdown, and a SIGUSR1 (a cold measurement) would kill the server.
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .map_err(|e| format!("cannot take SIGUSR1: {e}"))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot take SIGTERM: {e}"))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| format!("cannot take SIGINT: {e}"))?;
    // One line on stdout tells scripts the server is ready and where.
    println!("listening on {addr}");
    let metrics_task = match metrics_listener {
        Some(l) => {
            let maddr = l.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(%maddr, "metrics at http://{maddr}/metrics");
            println!("metrics on {maddr}");
            Some(sluice::tasks::spawn(sluice::metrics::serve(l, srv.clone())))
        }
        None => None,
    };
    let _ = std::io::stdout().flush();

    srv.state.log_grace_start();
    let expiry = {
        let srv = srv.clone();
        sluice::tasks::spawn(async move {
            loop {
                tokio::time::sleep(srv.state.expiry_interval()).await;
                // Expiry may write the client record store.
                let s = srv.clone();
                let _ = sluice::tasks::blocking(move || {
                    s.state.expire();
                    sluice::server::nlm::retry_blocked(&s);
                })
                .await;
            }
        })
    };
    let sweeper = {
        let srv = srv.clone();
        sluice::tasks::spawn(async move {
            let mut every = tokio::time::interval(sluice::engine::export::SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let s = srv.clone();
                let _ = sluice::tasks::blocking(move || s.sweep_descriptors()).await;
            }
        })
    };
    let inflight = Arc::new(sluice::net::InFlight::default());
    let udp_task = sluice::tasks::spawn(sluice::net::serve_udp(udp, srv.clone(), policy.clone()));
    let server = sluice::tasks::spawn(sluice::net::serve_with(
        listener,
        srv.clone(),
        policy,
        inflight.clone(),
    ));
    // NLM clients that held locks before this start are told to reclaim.
    sluice::server::nlm::notify_hosts(&srv);
    // SIGUSR1 empties the read cache, as `echo 1 > /proc/sys/vm/drop_caches`
    // does the kernel's: what a cold-cache measurement needs.
    let drop_task = {
        let srv = srv.clone();
        sluice::tasks::spawn(async move {
            while usr1.recv().await.is_some() {
                let bytes = srv.read.bufcache.clear();
                // Its memory is kept for reuse; where new huge pages are
                // slow to come by, the ordinary part of it is made huge
                // now, before the cold measurement this is for begins.
                let settled = sluice::tasks::blocking(sluice::engine::hugebuf::settle)
                    .await
                    .unwrap_or(0);
                tracing::info!(bytes, settled, "SIGUSR1: read cache dropped");
            }
        })
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("interrupted: shutting down"),
    }
    // Take no new connections or requests; let those being processed
    // finish (writes applied), then flush to disk.
    server.abort();
    udp_task.abort();
    for t in portmap_tasks {
        t.abort();
    }
    expiry.abort();
    sweeper.abort();
    drop_task.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    let busy = inflight.count();
    if busy > 0 {
        tracing::info!(requests = busy, "waiting for requests in progress");
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, inflight.wait_idle())
        .await
        .is_err()
    {
        tracing::warn!(
            requests = inflight.count(),
            "requests still running after {} s; stopping anyway",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    if !registered.is_empty() {
        let port = addr.port();
        let _ =
            sluice::tasks::blocking(move || sluice::server::portmap::unregister(port, &registered))
                .await;
    }
    // Unstable writes live in the page cache: push them to disk.
    let roots: Vec<_> = srv
        .exports
        .list()
        .iter()
        .map(|e| (e.pseudo.clone(), e.fs.root_fd()))
        .collect();
    let _ = sluice::tasks::blocking(move || {
        use std::os::fd::AsFd;
        for (path, root) in roots {
            if let Err(e) = sluice::engine::fs::sync_file_system(root.as_fd()) {
                tracing::warn!(export = %path, error = %e, "could not flush the export's file system to disk; writes clients have not committed may be lost if the machine stops now");
            }
        }
    })
    .await;
    if let Some(c) = cluster {
        // The other nodes begin grace for this node's clients now rather
        // than when its lease runs out. (Its locks on the file system go
        // when the process exits just after; a reclaim that meets one
        // meanwhile is told to retry.)
        let _ = sluice::tasks::blocking(move || c.leave()).await;
    }
    Ok(())
}

/// Requests processed at once in all (each on a blocking thread while it
/// waits for the disk); more wait their turn. Bounds the threads, their
/// stacks and buffers: a 64-client soak had grown tokio's default pool to
/// 219 threads.
const REQUEST_THREADS: usize = 128;

/// Raises the soft limit on open descriptors to the hard one: every open
/// file holds a descriptor and the handle cache keeps up to 8192, far
/// past the usual soft limit of 1024.
fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn main() {
    sluice::tune_allocator();
    raise_fd_limit();
    // The modes clients ask for are the modes files get: clients apply
    // their own umask before they send one (as the Linux server does,
    // which has none). sluice's own files set their modes explicitly.
    // SAFETY: umask only sets the process's file creation mask.
    unsafe { libc::umask(0) };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Before any other thread starts: the signal of lease breaks goes to
    // the thread that waits for it (see server::leases).
    let leases = match sluice::engine::fs::block_lease_signal() {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot block the lease signal: local writers will not recall delegations");
            false
        }
    };
    let result = match cli.cmd {
        Cmd::Serve(c) => resolve(c).and_then(|mut args| {
            args.config.local_leases = leases;
            // Requests run with each caller's groups and nothing else: the
            // groups root was started with (often 0) are not lent to them.
            sluice::engine::cred::drop_supplementary_groups()
                .map_err(|e| format!("cannot drop the supplementary groups: {e}"))?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .max_blocking_threads(REQUEST_THREADS)
                .build()
                .map_err(|e| format!("cannot start the runtime: {e}"))
                .and_then(|rt| {
                    let served = rt.block_on(sluice::tasks::as_server(serve(args)));
                    // `serve` has let the requests in progress finish and
                    // flushed the exports. What may still run is a call
                    // to a client (a probe or a recall waiting up to its
                    // time-out for an answer that will no longer be
                    // used): the process does not wait for it.
                    rt.shutdown_background();
                    served
                })
        }),
    };
    if let Err(e) = result {
        eprintln!("sluice: {e}");
        std::process::exit(1);
    }
}
