//! Several sluice nodes over one shared file system, with the grace period
//! and the client records kept in etcd (`sluice serve --cluster`).
//!
//! Every node serves the same exports and hands out the same file handles
//! (one handle key, kept in etcd), under one server owner and scope, so a
//! client that follows a floating address from one node to another sees
//! one server that restarted. What makes that safe is the grace period,
//! which is the cluster's, not a node's:
//!
//! - `epochs` holds the cluster's current epoch C and recovery epoch R
//!   (0: not in grace). Client records are kept per epoch and per node;
//!   the clients recorded in R, by any node, may reclaim on any node.
//! - When a node starts, it joins: if R is 0 it begins a grace period
//!   (R = C, C = C + 1); otherwise it joins the one in progress. When a
//!   node dies (its etcd lease ran out), the first survivor to see it does
//!   the same on its behalf, and the clients the dead node had recorded in
//!   the current epoch lose those records and are listed in its need.
//!   Either way a `need/N` key says whose clients are reclaiming; it lives
//!   on an etcd lease of one grace time. The node that set it for itself
//!   removes it as soon as all of its clients from before have reclaimed;
//!   any node removes a dead node's once all of that node's clients have
//!   sent RECLAIM_COMPLETE somewhere (their records are marked).
//! - Every live node watches these keys. When grace begins it stops
//!   granting new opens and locks, records its own clients again in the
//!   new epoch, and says so in `enforcing/N`. Reclaims go ahead only once
//!   every live node enforces the new grace period (NFS4ERR_DELAY before).
//! - When no `need/` key is left and every live node enforces grace, any
//!   node ends it (R = 0) and drops the recovery epoch's records, in one
//!   transaction that compares revisions, as every change of `epochs`
//!   does.
//! - A node that cannot reach etcd grants no new state; it keeps serving
//!   what its clients hold until its own etcd lease is about to run out,
//!   and then exits: by then the other nodes begin a grace period for its
//!   clients, who may reclaim wherever its address goes.
//!
//! Keys, under `sluice/<cluster name>/`: `key` (the handle key), `epochs`
//! ("C R"), `live/N` and `enforcing/N` (on the node's lease), `need/N`,
//! and `clients/<epoch>/<owner in hex>/N`.

use crate::server::state::recovery::{ClusterGrace, EpochStart, Recovery, RecoveryError, Result};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How a node joins its cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// etcd endpoints, `host:port` each.
    pub endpoints: Vec<String>,
    /// The cluster's name: nodes with the same name form one server.
    pub name: String,
    /// This node's number, 1 to 254, unique in the cluster.
    pub node: u8,
    /// The node's etcd lease: how long it keeps serving its state without
    /// reaching etcd, and how soon the others notice it died.
    pub ttl: Duration,
    /// The grace period a start or a death begins.
    pub grace: Duration,
}

impl ClusterConfig {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...][/NAME]`.
    pub fn parse_url(url: &str) -> std::result::Result<(Vec<String>, String), String> {
        let rest = url.strip_prefix("etcd://").ok_or_else(|| {
            format!("cluster {url:?}: expected etcd://HOST:PORT[,HOST:PORT...][/NAME]")
        })?;
        let (hosts, name) = match rest.split_once('/') {
            Some((h, n)) if !n.is_empty() => (h, n.trim_end_matches('/')),
            Some((h, _)) => (h, "default"),
            None => (rest, "default"),
        };
        if name.is_empty() || name.contains('/') || !name.is_ascii() {
            return Err(format!(
                "cluster {url:?}: the name after the address must be one plain word"
            ));
        }
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        if endpoints.is_empty() || hosts.split(',').any(|h| !h.contains(':')) {
            return Err(format!(
                "cluster {url:?}: every etcd address needs HOST:PORT"
            ));
        }
        Ok((endpoints, name.to_string()))
    }
}

/// A grace event for the node's state table.
#[derive(Debug)]
pub enum GraceEvent {
    /// The cluster's grace began in `epoch`: `owners` (every node's
    /// records in the recovery epoch) may reclaim here.
    Begin {
        /// The current epoch of the grace period.
        epoch: u64,
        /// Who may reclaim.
        owners: Vec<Vec<u8>>,
    },
    /// The cluster's grace ended.
    End,
}

/// What the node's server does with grace events; returns once the state
/// table enforces what the event says.
pub type GraceSink = Box<dyn Fn(GraceEvent) + Send>;

enum Cmd {
    Add(Vec<u8>, mpsc::SyncSender<Result<()>>),
    /// With a reply: someone waits for the record to go.
    Remove(Vec<u8>, Option<mpsc::SyncSender<Result<()>>>),
    EndOwnGrace,
    Reclaimed(Vec<u8>),
    Enforcing(u64),
    Leave(mpsc::SyncSender<()>),
}

/// This node's membership of a cluster: the record store of its state
/// table, and the task that keeps it in step with etcd.
#[derive(Debug)]
pub struct Cluster {
    cmds: tokio::sync::mpsc::UnboundedSender<Cmd>,
    /// The handle key every node seals handles with.
    pub key: [u8; 32],
    /// The boot id of this node's start: node number in the top byte, so
    /// client and state ids never collide between nodes.
    pub boot: u32,
    /// The server owner and scope every node gives (EXCHANGE_ID).
    pub owner: Vec<u8>,
    grace: ClusterGrace,
    join: Mutex<Option<EpochStart>>,
    events: Mutex<Option<mpsc::Receiver<GraceEvent>>>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cmd::Add(..) => "Add",
            Cmd::Remove(..) => "Remove",
            Cmd::EndOwnGrace => "EndOwnGrace",
            Cmd::Reclaimed(_) => "Reclaimed",
            Cmd::Enforcing(_) => "Enforcing",
            Cmd::Leave(_) => "Leave",
        })
    }
}

/// The value of a client record whose client sent RECLAIM_COMPLETE in
/// that epoch (others are empty).
const RECLAIMED: &str = "reclaimed";

/// Timeout of one etcd call.
const CALL: Duration = Duration::from_secs(2);
/// How often the node renews its lease and rereads the cluster's keys
/// (the watch tells it of changes at once; this is the backstop).
const TICK: Duration = Duration::from_millis(500);
/// Without a reply from etcd for this long, the node grants no new state.
const ISOLATED_AFTER: Duration = Duration::from_millis(1500);

fn transient(what: &str, e: impl std::fmt::Display) -> RecoveryError {
    RecoveryError::transient(format!("etcd ({what})"), e.to_string())
}

struct Keys {
    prefix: String,
}

impl Keys {
    fn key(&self) -> String {
        format!("{}key", self.prefix)
    }
    fn epochs(&self) -> String {
        format!("{}epochs", self.prefix)
    }
    fn live(&self, n: u8) -> String {
        format!("{}live/{n:03}", self.prefix)
    }
    fn enforcing(&self, n: u8) -> String {
        format!("{}enforcing/{n:03}", self.prefix)
    }
    fn need(&self, n: u8) -> String {
        format!("{}need/{n:03}", self.prefix)
    }
    fn dir(&self, d: &str) -> String {
        format!("{}{d}/", self.prefix)
    }
    fn epoch_records(&self, epoch: u64) -> String {
        format!("{}clients/{epoch:020}/", self.prefix)
    }
    fn owner_records(&self, epoch: u64, owner: &[u8]) -> String {
        format!("{}{}/", self.epoch_records(epoch), hex(owner))
    }
    fn record(&self, epoch: u64, owner: &[u8], n: u8) -> String {
        format!("{}{n:03}", self.owner_records(epoch, owner))
    }
    /// The keys a watch covers: everything but the client records.
    fn watched(&self) -> (String, String) {
        (format!("{}e", self.prefix), format!("{}o", self.prefix))
    }
}

/// The clients among `records` ((owner, node) pairs), each once, sorted.
fn owners(records: &[(Vec<u8>, u8)]) -> Vec<Vec<u8>> {
    let mut o: Vec<Vec<u8>> = records.iter().map(|(o, _)| o.clone()).collect();
    o.sort();
    o.dedup();
    o
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The cluster's keys as one node last read them.
#[derive(Debug, Clone, Default, PartialEq)]
struct View {
    /// Revision of the read.
    rev: i64,
    current: u64,
    recovery: u64,
    /// Mod revision of `epochs` (0: absent).
    epochs_rev: i64,
    live: BTreeSet<u8>,
    /// Nodes whose clients may still reclaim, with the key's value.
    need: BTreeMap<u8, Vec<u8>>,
    /// Mod revisions of the `need` keys.
    need_rev: BTreeMap<u8, i64>,
    enforcing: BTreeMap<u8, u64>,
}

impl View {
    /// Every live node enforces the grace period of the current epoch.
    fn all_enforce(&self) -> bool {
        self.live
            .iter()
            .all(|n| self.enforcing.get(n) == Some(&self.current))
    }
}

fn node_of(key: &[u8], dir: &str) -> Option<u8> {
    let s = std::str::from_utf8(key).ok()?;
    let i = s.find(dir)?;
    s[i + dir.len()..].parse().ok()
}

struct Etcd {
    client: Client,
    keys: Keys,
}

impl Etcd {
    async fn call<T>(
        what: &str,
        f: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(CALL, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(transient(what, e)),
            Err(_) => Err(transient(what, "no answer within 2 s")),
        }
    }

    async fn view(&mut self) -> Result<View> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.epochs(), None),
            TxnOp::get(k.dir("live"), Some(GetOptions::new().with_prefix())),
            TxnOp::get(k.dir("need"), Some(GetOptions::new().with_prefix())),
            TxnOp::get(k.dir("enforcing"), Some(GetOptions::new().with_prefix())),
        ]);
        let r = Self::call("read the cluster's keys", self.client.txn(txn)).await?;
        let mut v = View {
            rev: r.header().map_or(0, |h| h.revision()),
            ..View::default()
        };
        for (i, op) in r.op_responses().into_iter().enumerate() {
            let TxnOpResponse::Get(g) = op else { continue };
            for kv in g.kvs() {
                match i {
                    0 => {
                        let s = String::from_utf8_lossy(kv.value()).to_string();
                        let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
                        v.current = it.next().unwrap_or(0);
                        v.recovery = it.next().unwrap_or(0);
                        v.epochs_rev = kv.mod_revision();
                    }
                    1 => v.live.extend(node_of(kv.key(), "live/")),
                    2 => {
                        if let Some(n) = node_of(kv.key(), "need/") {
                            v.need.insert(n, kv.value().to_vec());
                            v.need_rev.insert(n, kv.mod_revision());
                        }
                    }
                    _ => {
                        if let Some(n) = node_of(kv.key(), "enforcing/") {
                            let e = String::from_utf8_lossy(kv.value()).parse().unwrap_or(0);
                            v.enforcing.insert(n, e);
                        }
                    }
                }
            }
        }
        Ok(v)
    }

    /// Who is recorded in `epoch`: (owner, node) pairs.
    async fn records(&mut self, epoch: u64) -> Result<Vec<(Vec<u8>, u8)>> {
        Ok(self
            .records_with(epoch, false)
            .await?
            .into_iter()
            .map(|(o, n, _)| (o, n))
            .collect())
    }

    /// Like [`Etcd::records`], with whether each record says its client
    /// reclaimed (read only when `values`).
    async fn records_with(&mut self, epoch: u64, values: bool) -> Result<Vec<(Vec<u8>, u8, bool)>> {
        let dir = self.keys.epoch_records(epoch);
        let mut opts = GetOptions::new().with_prefix();
        if !values {
            opts = opts.with_keys_only();
        }
        let r = Self::call(
            "read client records",
            self.client.get(dir.clone(), Some(opts)),
        )
        .await?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                let rest = std::str::from_utf8(kv.key()).ok()?.strip_prefix(&dir)?;
                let (owner, node) = rest.split_once('/')?;
                Some((
                    unhex(owner)?,
                    node.parse().ok()?,
                    kv.value() == RECLAIMED.as_bytes(),
                ))
            })
            .collect())
    }

    /// Carries out `ops` in transactions of at most 100 (etcd's default
    /// limit is 128 operations a transaction); each is whole, the set is
    /// not.
    async fn in_chunks(&mut self, what: &str, ops: Vec<TxnOp>) -> Result<()> {
        for chunk in ops.chunks(100) {
            Self::call(what, self.client.txn(Txn::new().and_then(chunk.to_vec()))).await?;
        }
        Ok(())
    }

    /// The epochs compare of a transaction that changes them.
    fn epochs_unchanged(&self, v: &View) -> Compare {
        if v.epochs_rev == 0 {
            Compare::version(self.keys.epochs(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(self.keys.epochs(), CompareOp::Equal, v.epochs_rev)
        }
    }

    async fn grace_lease(&mut self, grace: Duration) -> Result<i64> {
        // A need key outlives its node by one grace time at most.
        let ttl = grace.as_secs().max(1) as i64 + 1;
        Ok(
            Self::call("grant a grace lease", self.client.lease_grant(ttl, None))
                .await?
                .id(),
        )
    }
}

impl Cluster {
    /// Connects to etcd, takes this node's place in the cluster and joins
    /// (or begins) the cluster's grace period. Blocks until done; the task
    /// that follows the cluster runs on a thread of its own from then on.
    pub fn join(cfg: ClusterConfig) -> std::result::Result<Arc<Cluster>, String> {
        if !(1..=254).contains(&cfg.node) {
            return Err(format!("node id {}: must be 1 to 254", cfg.node));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (ev_tx, ev_rx) = mpsc::channel();
        let grace = ClusterGrace::default();
        let g = grace.clone();
        let cfg2 = cfg.clone();
        std::thread::Builder::new()
            .name("sluice-cluster".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("cannot start the cluster task: {e}")));
                        return;
                    }
                };
                rt.block_on(crate::tasks::as_server(run(cfg2, g, rx, ready_tx, ev_tx)));
            })
            .map_err(|e| format!("cannot start the cluster thread: {e}"))?;
        let (key, boot, epoch) = ready_rx
            .recv()
            .map_err(|_| "the cluster task stopped".to_string())??;
        Ok(Arc::new(Cluster {
            cmds: tx,
            key,
            boot,
            owner: format!("sluice-cluster:{}", cfg.name).into_bytes(),
            grace,
            join: Mutex::new(Some(epoch)),
            events: Mutex::new(Some(ev_rx)),
        }))
    }

    /// Hands grace events to `sink` from now on, in order, on a thread of
    /// their own (the state table's lock may be held by an op that waits
    /// for the cluster task).
    pub fn attach(self: &Arc<Self>, sink: GraceSink) {
        let Some(rx) = self.events.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let me = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("sluice-grace".into())
            .spawn(move || {
                while let Ok(ev) = rx.recv() {
                    let begun = match &ev {
                        GraceEvent::Begin { epoch, .. } => Some(*epoch),
                        GraceEvent::End => None,
                    };
                    sink(ev);
                    if let Some(epoch) = begun {
                        // The state table enforces it now: say so.
                        if let Some(c) = me.upgrade() {
                            let _ = c.cmds.send(Cmd::Enforcing(epoch));
                        }
                    }
                }
            });
    }

    /// Leaves the cluster at shutdown: the node's lease is revoked, so the
    /// others begin grace for its clients at once.
    pub fn leave(&self) {
        let (tx, rx) = mpsc::sync_channel(1);
        if self.cmds.send(Cmd::Leave(tx)).is_ok() {
            let _ = rx.recv_timeout(CALL * 2);
        }
    }

    fn ask(&self, cmd: impl FnOnce(mpsc::SyncSender<Result<()>>) -> Cmd) -> Result<()> {
        if self.grace.isolated.load(Ordering::Acquire) {
            return Err(transient("write a client record", "etcd is out of reach"));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.cmds
            .send(cmd(tx))
            .map_err(|_| transient("write a client record", "the cluster task stopped"))?;
        // The caller holds the state table: never longer than two calls.
        rx.recv_timeout(CALL * 2)
            .map_err(|_| transient("write a client record", "etcd did not answer in time"))?
    }
}

impl Recovery for Cluster {
    fn start_epoch(&self) -> Result<EpochStart> {
        self.join
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| RecoveryError::new("etcd", "a node joins its cluster once per start"))
    }

    fn add(&self, owner: &[u8]) -> Result<()> {
        self.ask(|tx| Cmd::Add(owner.to_vec(), tx))
    }

    fn remove(&self, owner: &[u8]) -> Result<()> {
        // Gone from etcd before the departure is acknowledged; what etcd
        // does not take now, the cluster task retries until it does.
        if self.grace.isolated.load(Ordering::Acquire) {
            let _ = self.cmds.send(Cmd::Remove(owner.to_vec(), None));
        }
        self.ask(|tx| Cmd::Remove(owner.to_vec(), Some(tx)))
    }

    fn end_grace(&self) -> Result<()> {
        let _ = self.cmds.send(Cmd::EndOwnGrace);
        Ok(())
    }

    fn reclaimed(&self, owner: &[u8]) {
        let _ = self.cmds.send(Cmd::Reclaimed(owner.to_vec()));
    }
}

type Joined = std::result::Result<([u8; 32], u32, EpochStart), String>;

/// Connects and joins; the first half of [`run`].
async fn connect_and_join(
    cfg: &ClusterConfig,
    grace: &ClusterGrace,
) -> std::result::Result<(Etcd, i64, [u8; 32], u32, EpochStart, View), String> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(CALL)
        .with_timeout(CALL);
    let endpoints = cfg.endpoints.join(", ");
    let client = tokio::time::timeout(CALL * 3, Client::connect(&cfg.endpoints, Some(opts)))
        .await
        .map_err(|_| format!("cannot reach etcd at {endpoints}: no answer"))?
        .map_err(|e| format!("cannot reach etcd at {endpoints}: {e}"))?;
    let mut e = Etcd {
        client,
        keys: Keys {
            prefix: format!("sluice/{}/", cfg.name),
        },
    };
    let fail = |what: &str| {
        let endpoints = endpoints.clone();
        let what = what.to_string();
        move |err: RecoveryError| format!("etcd at {endpoints}: cannot {what}: {err}")
    };

    // The handle key: made by the first node, read by every other.
    let mut rnd = [0u8; 32];
    getrandom::getrandom(&mut rnd).map_err(|e| format!("no randomness: {e}"))?;
    let key_name = e.keys.key();
    Etcd::call(
        "store the handle key",
        e.client.txn(
            Txn::new()
                .when(vec![Compare::version(
                    key_name.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![TxnOp::put(key_name.clone(), rnd.to_vec(), None)]),
        ),
    )
    .await
    .map_err(fail("store the handle key"))?;
    let got = Etcd::call("read the handle key", e.client.get(key_name.clone(), None))
        .await
        .map_err(fail("read the handle key"))?;
    let key: [u8; 32] = got
        .kvs()
        .first()
        .and_then(|kv| kv.value().try_into().ok())
        .ok_or_else(|| format!("etcd key {key_name} is not a 32-byte handle key; remove it to make a new one (every handle the cluster gave becomes invalid)"))?;

    let lease = Etcd::call(
        "grant the node's lease",
        e.client.lease_grant(cfg.ttl.as_secs().max(2) as i64, None),
    )
    .await
    .map_err(fail("grant the node's lease"))?
    .id();
    let mut b = [0u8; 3];
    getrandom::getrandom(&mut b).map_err(|e| format!("no randomness: {e}"))?;
    let boot = u32::from_be_bytes([cfg.node, b[0], b[1], b[2]]);

    let mut tries = 0;
    loop {
        tries += 1;
        if tries > 50 {
            return Err("cannot join the cluster: its keys keep changing".into());
        }
        let v = e.view().await.map_err(fail("read the cluster's keys"))?;
        let live = e.keys.live(cfg.node);
        if v.live.contains(&cfg.node) {
            // The last start of this node died less than a lease ago (or
            // another process claims the same node id: it will find its
            // lease gone and stop).
            let r = Etcd::call("read the node's key", e.client.get(live.clone(), None))
                .await
                .map_err(fail("read the node's key"))?;
            if let Some(kv) = r.kvs().first() {
                tracing::warn!(node = cfg.node, "node id {} is still live in etcd: taking it over (a process that still uses it stops)", cfg.node);
                let _ = Etcd::call("revoke the old lease", e.client.lease_revoke(kv.lease())).await;
            }
            continue;
        }
        let (c, r) = (v.current, v.recovery);
        let (nc, nr) = if r == 0 { (c + 1, c) } else { (c, r) };
        let mut ops = vec![
            TxnOp::put(e.keys.epochs(), format!("{nc} {nr}"), None),
            TxnOp::put(
                live.clone(),
                format!("{boot:08x}"),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::put(
                e.keys.enforcing(cfg.node),
                nc.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            ),
        ];
        if nr != 0 {
            // One lease of one grace time for this node's need and for
            // those of nodes that are gone but have clients in the
            // recovery epoch (the whole cluster was down, or they died
            // unseen): grace waits for their clients too.
            let g = e
                .grace_lease(cfg.grace)
                .await
                .map_err(fail("grant a lease"))?;
            let on_g = || Some(PutOptions::new().with_lease(g));
            ops.push(TxnOp::put(
                e.keys.need(cfg.node),
                format!("{boot:08x}"),
                on_g(),
            ));
            let gone: BTreeSet<u8> = e
                .records(nr)
                .await
                .map_err(fail("read client records"))?
                .into_iter()
                .map(|(_, m)| m)
                .filter(|m| *m != cfg.node && !v.live.contains(m) && !v.need.contains_key(m))
                .collect();
            for m in gone {
                ops.push(TxnOp::put(e.keys.need(m), DIED, on_g()));
            }
        }
        if r != 0 {
            // Restarted during grace: whoever this node recorded since
            // holds nothing now; its clients from before may still reclaim.
            for (owner, n) in e.records(c).await.map_err(fail("read client records"))? {
                if n == cfg.node {
                    ops.push(TxnOp::delete(e.keys.record(c, &owner, n), None));
                }
            }
        }
        let txn = Txn::new()
            .when(vec![
                e.epochs_unchanged(&v),
                Compare::version(live.clone(), CompareOp::Equal, 0),
            ])
            .and_then(ops);
        let done = Etcd::call("join the cluster", e.client.txn(txn))
            .await
            .map_err(fail("join the cluster"))?;
        if !done.succeeded() {
            continue;
        }
        let records = if nr != 0 {
            e.records(nr).await.map_err(fail("read client records"))?
        } else {
            Vec::new()
        };
        let reclaimable = owners(&records);
        let mine: Vec<Vec<u8>> = records
            .iter()
            .filter(|(_, n)| *n == cfg.node)
            .map(|(o, _)| o.clone())
            .collect();
        let view = e.view().await.map_err(fail("read the cluster's keys"))?;
        tracing::info!(
            node = cfg.node,
            epoch = nc,
            recovery = nr,
            clients = reclaimable.len(),
            own = mine.len(),
            nodes = ?view.live,
            "joined the cluster"
        );
        grace.ready.store(nr == 0, Ordering::Release);
        let epoch = EpochStart {
            current: nc,
            recovery: nr,
            reclaimable,
            cluster: Some(ClusterGrace {
                mine,
                ..grace.clone()
            }),
        };
        return Ok((e, lease, key, boot, epoch, view));
    }
}

async fn run(
    cfg: ClusterConfig,
    grace: ClusterGrace,
    mut cmds: tokio::sync::mpsc::UnboundedReceiver<Cmd>,
    ready: mpsc::SyncSender<Joined>,
    events: mpsc::Sender<GraceEvent>,
) {
    let mut mine = HashSet::new();
    let (mut e, lease, key, boot, epoch, mut view) = match connect_and_join(&cfg, &grace).await {
        Ok(j) => j,
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    let _ = ready.send(Ok((key, boot, epoch)));
    drop(ready);
    crate::tasks::spawn(keep_alive(
        e.client.clone(),
        lease,
        cfg.clone(),
        grace.clone(),
    ));
    let mut watch: Option<etcd_client::WatchStream> = None;
    let mut tick = tokio::time::interval(TICK);
    let mut dirty = true;
    // The epoch of a grace period the state table enforces now, until
    // etcd has been told.
    let mut enforcing: Option<u64> = None;
    // Changes etcd did not take yet, retried every round.
    let mut retry: Vec<Cmd> = Vec::new();
    let mut recorded_in = view.current;
    loop {
        if watch.is_none() {
            let (from, to) = e.keys.watched();
            let opts = WatchOptions::new()
                .with_range(to)
                .with_start_revision(view.rev + 1);
            if let Ok(Ok(w)) = tokio::time::timeout(CALL, e.client.watch(from, Some(opts))).await {
                watch = Some(w);
                dirty = true;
            }
        }
        if let Some(epoch) = enforcing {
            if epoch != view.current {
                // A later grace period's Begin follows.
                enforcing = None;
            } else {
                let r = Etcd::call(
                    "say this node enforces grace",
                    e.client.put(
                        e.keys.enforcing(cfg.node),
                        epoch.to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                )
                .await;
                if r.is_ok() {
                    enforcing = None;
                }
            }
        }
        for cmd in std::mem::take(&mut retry) {
            if let Err(cmd) = background(&mut e, &cfg, &view, &mut mine, cmd).await {
                retry.push(cmd);
            }
        }
        if dirty {
            dirty = false;
            match e.view().await {
                Ok(v) => {
                    if !v.live.contains(&cfg.node) {
                        fence(&cfg, "its registration in etcd is gone (its lease ran out, or another process took its node id)");
                    }
                    if let Err(err) =
                        follow(&mut e, &cfg, &mut view, v, &mine, &mut recorded_in, &events).await
                    {
                        tracing::warn!(error = %err, "cannot follow the cluster's grace period; retrying");
                        dirty = true;
                    }
                    let ok = view.recovery == 0 || view.all_enforce();
                    grace.ready.store(ok, Ordering::Release);
                }
                Err(_) => dirty = true,
            }
        }
        tokio::select! {
            cmd = cmds.recv() => {
                let Some(cmd) = cmd else { return };
                match cmd {
                    Cmd::Add(owner, tx) => {
                        let k = e.keys.record(view.current, &owner, cfg.node);
                        let r = Etcd::call("write a client record", e.client.put(k, Vec::new(), None)).await.map(drop);
                        if r.is_ok() {
                            mine.insert(owner);
                        }
                        let _ = tx.send(r);
                    }
                    Cmd::Remove(owner, Some(tx)) => {
                        dirty = true;
                        let r = background(&mut e, &cfg, &view, &mut mine, Cmd::Remove(owner, None)).await;
                        let _ = tx.send(r.map_err(|cmd| {
                            retry.push(cmd);
                            transient("remove a client record", "etcd did not take it; retrying")
                        }));
                    }
                    Cmd::Enforcing(epoch) => {
                        enforcing = Some(epoch);
                        dirty = true;
                    }
                    Cmd::Leave(tx) => {
                        let _ = Etcd::call("leave the cluster", e.client.lease_revoke(lease)).await;
                        let _ = tx.send(());
                        return;
                    }
                    cmd => {
                        dirty = true;
                        if let Err(cmd) = background(&mut e, &cfg, &view, &mut mine, cmd).await {
                            retry.push(cmd);
                        }
                    }
                }
            }
            msg = async {
                match watch.as_mut() {
                    Some(w) => w.message().await,
                    None => std::future::pending().await,
                }
            } => {
                match msg {
                    Ok(Some(m)) if !m.canceled() => dirty = true,
                    _ => { watch = None; dirty = true; }
                }
            }
            _ = tick.tick() => dirty = true,
        }
    }
}

/// Carries out a change nobody waits for; hands it back when etcd did not
/// take it, to be tried again.
async fn background(
    e: &mut Etcd,
    cfg: &ClusterConfig,
    view: &View,
    mine: &mut HashSet<Vec<u8>>,
    cmd: Cmd,
) -> std::result::Result<(), Cmd> {
    let r = match &cmd {
        Cmd::Remove(owner, _) => {
            mine.remove(owner);
            let mut ops = vec![TxnOp::delete(
                e.keys.record(view.current, owner, cfg.node),
                None,
            )];
            if view.recovery != 0 {
                ops.push(TxnOp::delete(
                    e.keys.owner_records(view.recovery, owner),
                    Some(DeleteOptions::new().with_prefix()),
                ));
            }
            Etcd::call(
                "remove a client record",
                e.client.txn(Txn::new().and_then(ops)),
            )
            .await
            .map(drop)
        }
        Cmd::Reclaimed(owner) => {
            // Its record says so: a dead node's grace may end once all of
            // its clients' records do.
            let k = e.keys.record(view.current, owner, cfg.node);
            Etcd::call("mark a client reclaimed", e.client.put(k, RECLAIMED, None))
                .await
                .map(drop)
        }
        Cmd::EndOwnGrace => Etcd::call(
            "end this node's grace",
            e.client.delete(e.keys.need(cfg.node), None),
        )
        .await
        .map(drop),
        _ => Ok(()),
    };
    r.map_err(|_| cmd)
}

/// Renews the node's lease twice a second, and says when the node must
/// grant no new state (no renewal for [`ISOLATED_AFTER`]) or leave (its
/// lease is about to run out in etcd, which counts from a renewal's
/// arrival, never earlier than its sending).
async fn keep_alive(mut client: Client, lease: i64, cfg: ClusterConfig, grace: ClusterGrace) {
    let renewed = Arc::new(Mutex::new(Instant::now()));
    {
        let renewed = renewed.clone();
        let cfg = cfg.clone();
        let grace = grace.clone();
        crate::tasks::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let silent = renewed.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
                if silent >= ISOLATED_AFTER && !grace.isolated.swap(true, Ordering::AcqRel) {
                    tracing::error!(
                        silent_ms = silent.as_millis() as u64,
                        "etcd is out of reach: no new opens or locks until it is back; existing state is served until this node's lease runs out"
                    );
                }
                if silent + Duration::from_millis(300) >= cfg.ttl {
                    fence(&cfg, "etcd was out of reach for longer than its lease");
                }
            }
        });
    }
    let mut keeper: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> = None;
    // Renewals start every TICK from the last one's start: after a slow
    // one (etcd coming back) the next goes at once, so a renewal sent
    // long ago does not leave the node short of time.
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let sent = Instant::now();
        match renew(&mut client, lease, &mut keeper).await {
            Ok(true) => {
                *renewed.lock().unwrap_or_else(|e| e.into_inner()) = sent;
                if grace.isolated.swap(false, Ordering::AcqRel) {
                    tracing::info!("etcd is back: new state is granted again");
                }
            }
            Ok(false) => fence(&cfg, "its lease in etcd is gone"),
            Err(_) => keeper = None,
        }
    }
}

/// Renews the node's lease: Ok(false) when etcd says it is gone.
async fn renew(
    client: &mut Client,
    lease: i64,
    keeper: &mut Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
) -> Result<bool> {
    if keeper.is_none() {
        *keeper = Some(Etcd::call("renew the node's lease", client.lease_keep_alive(lease)).await?);
    }
    let (k, s) = keeper.as_mut().expect("set above");
    Etcd::call("renew the node's lease", k.keep_alive()).await?;
    match Etcd::call("renew the node's lease", s.message()).await? {
        Some(r) => Ok(r.ttl() > 0),
        None => Err(transient("renew the node's lease", "stream closed")),
    }
}

/// The node lost its place in the cluster: other nodes may by now have
/// given its clients' state to others. It stops serving at once.
fn fence(cfg: &ClusterConfig, why: &str) -> ! {
    tracing::error!(
        node = cfg.node,
        "leaving: {why}; the other nodes have begun grace for this node's clients, who may reclaim wherever its address goes. Start it again to rejoin"
    );
    eprintln!("sluice: node {} left the cluster: {why}", cfg.node);
    std::process::exit(75);
}

/// Acts on what changed between `old` and `new`: nodes gone, grace begun
/// or ended, a new epoch to record this node's clients in, every need met.
async fn follow(
    e: &mut Etcd,
    cfg: &ClusterConfig,
    old: &mut View,
    new: View,
    mine: &HashSet<Vec<u8>>,
    recorded_in: &mut u64,
    events: &mpsc::Sender<GraceEvent>,
) -> Result<()> {
    // A node that died: begin grace for its clients.
    let gone: Vec<u8> = old
        .live
        .difference(&new.live)
        .copied()
        .filter(|n| *n != cfg.node)
        .collect();
    let mut new = new;
    if !gone.is_empty() {
        for &n in &gone {
            node_died(e, cfg, n).await?;
        }
        // Handled: what follows compares with the keys as they are now.
        for n in &gone {
            old.live.remove(n);
        }
        new = e.view().await?;
    }
    if new.current != *recorded_in {
        // Clients of this node hold state on into the new epoch.
        let ops = mine
            .iter()
            .map(|o| TxnOp::put(e.keys.record(new.current, o, cfg.node), Vec::new(), None))
            .collect();
        e.in_chunks("record clients in the new epoch", ops).await?;
        *recorded_in = new.current;
    }
    let began = new.recovery != 0 && (old.recovery != new.recovery || old.current != new.current);
    if began {
        let owners = owners(&e.records(new.recovery).await?);
        let _ = events.send(GraceEvent::Begin {
            epoch: new.current,
            owners,
        });
    } else if old.recovery != 0 && new.recovery == 0 {
        let _ = events.send(GraceEvent::End);
    }
    if new.recovery != 0 {
        end_dead_needs(e, &new).await?;
    }
    if new.recovery != 0 && new.need.is_empty() && new.all_enforce() {
        // Every node's clients are done, and every node has recorded its
        // own in the current epoch: end the cluster's grace.
        let mut when = vec![
            e.epochs_unchanged(&new),
            Compare::version(e.keys.dir("need"), CompareOp::Equal, 0).with_prefix(),
        ];
        for &n in &new.live {
            when.push(Compare::value(
                e.keys.enforcing(n),
                CompareOp::Equal,
                new.current.to_string(),
            ));
        }
        let txn = Txn::new().when(when).and_then(vec![
            TxnOp::put(e.keys.epochs(), format!("{} 0", new.current), None),
            TxnOp::delete(
                e.keys.epoch_records(new.recovery),
                Some(DeleteOptions::new().with_prefix()),
            ),
        ]);
        let done = Etcd::call("end the cluster's grace", e.client.txn(txn)).await?;
        if done.succeeded() {
            tracing::info!(
                epoch = new.current,
                "every node's clients are done reclaiming: the cluster's grace period is over"
            );
        }
    }
    *old = new;
    Ok(())
}

/// The value of a `need/N` key set for a node that died: then the owners
/// (hex, comma-separated) it had recorded in the current epoch, whose
/// records go (they hold nothing now) but who must reclaim before grace
/// may end.
const DIED: &str = "died:";

/// Begins (or extends) grace for node `n`, gone: its clients from the
/// recovery epoch, and those it recorded in the current one, may reclaim
/// on any node. The first survivor to see the death does it; the others
/// find it done.
async fn node_died(e: &mut Etcd, cfg: &ClusterConfig, n: u8) -> Result<()> {
    for _ in 0..20 {
        let v = e.view().await?;
        if v.live.contains(&n)
            || v.need
                .get(&n)
                .is_some_and(|x| x.starts_with(DIED.as_bytes()))
        {
            return Ok(());
        }
        let (c, r) = (v.current, v.recovery);
        let (nc, nr) = if r == 0 { (c + 1, c) } else { (c, r) };
        // In a grace period in progress the epochs stay: what the dead
        // node recorded in the current one is listed in its need instead.
        let held: Vec<Vec<u8>> = if r != 0 {
            e.records(c)
                .await?
                .into_iter()
                .filter(|(_, m)| *m == n)
                .map(|(o, _)| o)
                .collect()
        } else {
            Vec::new()
        };
        let list: Vec<String> = held.iter().map(|o| hex(o)).collect();
        let g = e.grace_lease(cfg.grace).await?;
        let need_now = match v.need_rev.get(&n) {
            Some(&rev) => Compare::mod_revision(e.keys.need(n), CompareOp::Equal, rev),
            None => Compare::version(e.keys.need(n), CompareOp::Equal, 0),
        };
        let txn = Txn::new()
            .when(vec![
                e.epochs_unchanged(&v),
                Compare::version(e.keys.live(n), CompareOp::Equal, 0),
                need_now,
            ])
            .and_then(vec![
                TxnOp::put(e.keys.epochs(), format!("{nc} {nr}"), None),
                TxnOp::put(
                    e.keys.need(n),
                    format!("{DIED}{}", list.join(",")),
                    Some(PutOptions::new().with_lease(g)),
                ),
            ]);
        let done = Etcd::call("begin grace for a node that died", e.client.txn(txn)).await?;
        if !done.succeeded() {
            continue;
        }
        tracing::warn!(
            node = n,
            epoch = nc,
            "node left the cluster: grace begins for its clients"
        );
        let ops = held
            .iter()
            .map(|o| TxnOp::delete(e.keys.record(c, o, n), None))
            .collect();
        e.in_chunks("drop a dead node's records", ops).await?;
        return Ok(());
    }
    Err(transient(
        "begin grace for a node that died",
        "the cluster's keys keep changing",
    ))
}

/// Ends the part of grace that nodes which are gone need, for each whose
/// clients have all reclaimed (on whichever node) since: their records in
/// the current epoch say so. A gone node's clients are those it recorded
/// in the recovery epoch and those its need lists.
async fn end_dead_needs(e: &mut Etcd, v: &View) -> Result<()> {
    let dead: Vec<u8> = v
        .need
        .keys()
        .copied()
        .filter(|n| !v.live.contains(n))
        .collect();
    if dead.is_empty() {
        return Ok(());
    }
    let before = e.records(v.recovery).await?;
    let done: HashSet<Vec<u8>> = e
        .records_with(v.current, true)
        .await?
        .into_iter()
        .filter(|(_, _, r)| *r)
        .map(|(o, _, _)| o)
        .collect();
    for n in dead {
        let listed: Vec<Vec<u8>> = v.need[&n]
            .strip_prefix(DIED.as_bytes())
            .map(|l| {
                std::str::from_utf8(l)
                    .unwrap_or("")
                    .split(',')
                    .filter_map(unhex)
                    .filter(|o| !o.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let waiting = before
            .iter()
            .filter(|(_, m)| *m == n)
            .map(|(o, _)| o)
            .chain(listed.iter())
            .filter(|o| !done.contains(*o))
            .count();
        if waiting > 0 {
            continue;
        }
        let need = e.keys.need(n);
        let txn = Txn::new()
            .when(vec![
                e.epochs_unchanged(v),
                Compare::mod_revision(need.clone(), CompareOp::Equal, v.need_rev[&n]),
            ])
            .and_then(vec![TxnOp::delete(need, None)]);
        if Etcd::call("end a gone node's grace", e.client.txn(txn))
            .await?
            .succeeded()
        {
            tracing::info!(node = n, "every client of a node that left has reclaimed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            ClusterConfig::parse_url("etcd://127.0.0.1:2379").unwrap(),
            (
                vec!["http://127.0.0.1:2379".to_string()],
                "default".to_string()
            )
        );
        assert_eq!(
            ClusterConfig::parse_url("etcd://a:1,b:2/prod").unwrap(),
            (
                vec!["http://a:1".to_string(), "http://b:2".to_string()],
                "prod".to_string()
            )
        );
        assert!(ClusterConfig::parse_url("http://a:1").is_err());
        assert!(ClusterConfig::parse_url("etcd://a").is_err());
        assert!(ClusterConfig::parse_url("etcd://a:1/x/y").is_err());
    }

    #[test]
    fn owners_round_trip_through_keys() {
        let k = Keys {
            prefix: "sluice/t/".into(),
        };
        let o = b"Linux NFSv4.1 guest\x00\xff";
        let key = k.record(7, o, 3);
        let rest = key.strip_prefix(&k.epoch_records(7)).unwrap();
        let (h, n) = rest.split_once('/').unwrap();
        assert_eq!(unhex(h).unwrap(), o.to_vec());
        assert_eq!(n, "003");
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
        assert_eq!(node_of(k.live(12).as_bytes(), "live/"), Some(12));
    }
}
