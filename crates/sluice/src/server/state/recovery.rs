//! Stable client records (RFC 8881 section 8.4.2.1): which clients may
//! reclaim their state after the server restarts.
//!
//! Records are kept by epoch, as the Linux server's nfsdcld does. Every
//! start of the server begins a new *current* epoch; the clients recorded
//! in the previous one form the *recovery* epoch, the only ones allowed to
//! reclaim during the grace period that follows. A client is recorded in
//! the current epoch before it is granted state (or reclaims), and its
//! record goes when it is expired, destroyed or replaced. When grace ends,
//! the recovery epoch is dropped: a client that did not come back in time
//! cannot reclaim after a later restart either (the second edge condition
//! of section 8.4.3). A restart during grace keeps the recovery epoch, so
//! clients that had not finished reclaiming still may.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A failure of the record store.
#[derive(Debug, thiserror::Error)]
#[error("client record store {where_}: {source}")]
pub struct RecoveryError {
    where_: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
    transient: bool,
}

impl RecoveryError {
    /// A failure at `where_` that retrying will not mend.
    pub fn new(
        where_: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        RecoveryError {
            where_: where_.into(),
            source: source.into(),
            transient: false,
        }
    }

    /// A failure at `where_` that may pass (a store out of reach): the
    /// client is told to retry (NFS4ERR_DELAY) rather than given up on.
    pub fn transient(
        where_: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        RecoveryError {
            transient: true,
            ..Self::new(where_, source)
        }
    }

    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

/// Result of a record store call.
pub type Result<T> = std::result::Result<T, RecoveryError>;

/// What a new epoch starts with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EpochStart {
    /// The epoch this start of the server records into.
    pub current: u64,
    /// The epoch whose clients may reclaim (0: none).
    pub recovery: u64,
    /// Owners (co_ownerid) of the clients that may reclaim here. In a
    /// cluster, those of every node: a node's clients reclaim on whichever
    /// node now serves its address.
    pub reclaimable: Vec<Vec<u8>>,
    /// Set when the grace period is the cluster's (see `crate::cluster`).
    pub cluster: Option<ClusterGrace>,
}

/// What a node of a cluster shares with its record store about grace:
/// it begins and ends when the cluster's does, not by this node's clock.
#[derive(Debug, Clone, Default)]
pub struct ClusterGrace {
    /// The records this node made in the recovery epoch: its own clients
    /// from before the restart, whose reclaims may end its part of grace
    /// early, and the NLM hosts it tells to reclaim.
    pub mine: Vec<Vec<u8>>,
    /// True once every live node enforces the grace period: only then may
    /// reclaims go ahead (before, NFS4ERR_DELAY), so none meets state that
    /// another node granted meanwhile.
    pub ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// True while the node cannot reach the store: it grants no new state
    /// (NFS4ERR_DELAY) and keeps what it has until its lease in the store
    /// runs out.
    pub isolated: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PartialEq for ClusterGrace {
    fn eq(&self, other: &Self) -> bool {
        self.mine == other.mine
    }
}

impl Eq for ClusterGrace {}

/// Where client records are kept: one node's SQLite file here; a store
/// shared by several nodes can take its place.
pub trait Recovery: Send + Sync + std::fmt::Debug {
    /// Begins a new epoch at server start and says who may reclaim.
    fn start_epoch(&self) -> Result<EpochStart>;
    /// Records `owner` in the current epoch (idempotent). Returns once the
    /// record is on stable storage.
    fn add(&self, owner: &[u8]) -> Result<()>;
    /// Removes `owner`'s records: it is expired, destroyed or replaced.
    fn remove(&self, owner: &[u8]) -> Result<()>;
    /// Grace is over: drops the recovery epoch.
    fn end_grace(&self) -> Result<()>;
    /// `owner`, known from before, sent RECLAIM_COMPLETE. A cluster's
    /// store uses it to end the grace period of a node that died as soon
    /// as all of its clients have reclaimed elsewhere; one node's store
    /// needs nothing.
    fn reclaimed(&self, _owner: &[u8]) {}
}

/// Client records in an SQLite database (`clients.db` in the state
/// directory), written in WAL mode with full syncs: every change is one
/// transaction, so a crash at any instant leaves the store as it was
/// before or after a change.
#[derive(Debug)]
pub struct SqliteRecovery {
    conn: Mutex<Connection>,
    path: PathBuf,
}

fn err(where_: &str) -> impl FnOnce(rusqlite::Error) -> RecoveryError + '_ {
    move |source| RecoveryError::new(where_, source)
}

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS epochs (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        current INTEGER NOT NULL,
        recovery INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS clients (
        epoch INTEGER NOT NULL,
        owner BLOB NOT NULL,
        PRIMARY KEY (epoch, owner)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS clients_owner ON clients (owner);
";

impl SqliteRecovery {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let label = path.display().to_string();
        let conn = Connection::open(path).map_err(err(&label))?;
        Self::setup(conn, path.to_path_buf())
    }

    /// A store that lives in memory only (tests; servers without a state
    /// directory remember no clients across restarts).
    pub fn in_memory() -> Self {
        let conn = Connection::open_in_memory().expect("SQLite opens an in-memory database");
        Self::setup(conn, PathBuf::from(":memory:"))
            .expect("an in-memory database takes the schema")
    }

    fn setup(conn: Connection, path: PathBuf) -> Result<Self> {
        let label = path.display().to_string();
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err(&label))?;
        // WAL keeps a committed change whole across a crash; FULL syncs
        // the log at every commit, so a record is on disk when add returns.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err(&label))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err(&label))?;
        conn.execute_batch(SCHEMA).map_err(err(&label))?;
        Ok(SqliteRecovery {
            conn: Mutex::new(conn),
            path,
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn label(&self) -> String {
        self.path.display().to_string()
    }

    /// The (current, recovery) epochs, for tests and tools.
    pub fn epochs(&self) -> Result<(u64, u64)> {
        let conn = self.conn();
        let row = conn
            .query_row(
                "SELECT current, recovery FROM epochs WHERE id = 1",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .optional()
            .map_err(err(&self.label()))?;
        Ok(row.unwrap_or((0, 0)))
    }

    /// Owners recorded in `epoch`, sorted (tests and tools).
    pub fn owners(&self, epoch: u64) -> Result<Vec<Vec<u8>>> {
        let conn = self.conn();
        let mut st = conn
            .prepare("SELECT owner FROM clients WHERE epoch = ?1 ORDER BY owner")
            .map_err(err(&self.label()))?;
        let rows = st
            .query_map([epoch as i64], |r| r.get::<_, Vec<u8>>(0))
            .map_err(err(&self.label()))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(err(&self.label()))
    }
}

impl Recovery for SqliteRecovery {
    fn start_epoch(&self) -> Result<EpochStart> {
        let label = self.label();
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err(&label))?;
        let (current, recovery) = tx
            .query_row(
                "SELECT current, recovery FROM epochs WHERE id = 1",
                [],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
            )
            .optional()
            .map_err(err(&label))?
            .unwrap_or((0, 0));
        let recovery = if recovery != 0 {
            // Restarted during grace: the clients that could reclaim still
            // may; whoever was recorded since holds nothing yet.
            tx.execute("DELETE FROM clients WHERE epoch = ?1", [current])
                .map_err(err(&label))?;
            recovery
        } else {
            current
        };
        let next = current + 1;
        tx.execute(
            "INSERT INTO epochs (id, current, recovery) VALUES (1, ?1, ?2)
             ON CONFLICT (id) DO UPDATE SET current = ?1, recovery = ?2",
            params![next, recovery],
        )
        .map_err(err(&label))?;
        let reclaimable = {
            let mut st = tx
                .prepare("SELECT owner FROM clients WHERE epoch = ?1 ORDER BY owner")
                .map_err(err(&label))?;
            let rows = st
                .query_map([recovery], |r| r.get::<_, Vec<u8>>(0))
                .map_err(err(&label))?;
            rows.collect::<std::result::Result<Vec<_>, _>>()
                .map_err(err(&label))?
        };
        tx.commit().map_err(err(&label))?;
        Ok(EpochStart {
            current: next as u64,
            recovery: recovery as u64,
            reclaimable,
            cluster: None,
        })
    }

    fn add(&self, owner: &[u8]) -> Result<()> {
        let label = self.label();
        self.conn()
            .execute(
                "INSERT OR IGNORE INTO clients (epoch, owner)
                 SELECT current, ?1 FROM epochs WHERE id = 1",
                [owner],
            )
            .map(drop)
            .map_err(err(&label))
    }

    fn remove(&self, owner: &[u8]) -> Result<()> {
        let label = self.label();
        self.conn()
            .execute("DELETE FROM clients WHERE owner = ?1", [owner])
            .map(drop)
            .map_err(err(&label))
    }

    fn end_grace(&self) -> Result<()> {
        let label = self.label();
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err(&label))?;
        tx.execute(
            "DELETE FROM clients WHERE epoch = (SELECT recovery FROM epochs WHERE id = 1)
             AND epoch <> (SELECT current FROM epochs WHERE id = 1)",
            [],
        )
        .map_err(err(&label))?;
        tx.execute("UPDATE epochs SET recovery = 0 WHERE id = 1", [])
            .map_err(err(&label))?;
        tx.commit().map_err(err(&label))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(v: &[&[u8]]) -> Vec<Vec<u8>> {
        v.iter().map(|o| o.to_vec()).collect()
    }

    #[test]
    fn first_start_has_nothing_to_reclaim() {
        let r = SqliteRecovery::in_memory();
        let s = r.start_epoch().unwrap();
        assert_eq!((s.current, s.recovery), (1, 0));
        assert!(s.reclaimable.is_empty());
    }

    #[test]
    fn clients_of_the_last_epoch_may_reclaim_once() {
        let dir = tempdir();
        let path = dir.join("clients.db");
        {
            let r = SqliteRecovery::open(&path).unwrap();
            r.start_epoch().unwrap();
            r.add(b"a").unwrap();
            r.add(b"a").unwrap();
            r.add(b"b").unwrap();
            r.add(b"gone").unwrap();
            r.remove(b"gone").unwrap();
        }
        // Restart: a and b may reclaim; a does, b does not.
        let r = SqliteRecovery::open(&path).unwrap();
        let s = r.start_epoch().unwrap();
        assert_eq!((s.current, s.recovery), (2, 1));
        assert_eq!(s.reclaimable, owners(&[b"a", b"b"]));
        r.add(b"a").unwrap();
        r.add(b"new").unwrap();
        r.end_grace().unwrap();
        assert_eq!(r.epochs().unwrap(), (2, 0));
        drop(r);
        // Next restart: b missed the last grace period and may not
        // reclaim now (RFC 8881 section 8.4.3, second edge condition).
        let r = SqliteRecovery::open(&path).unwrap();
        let s = r.start_epoch().unwrap();
        assert_eq!(s.reclaimable, owners(&[b"a", b"new"]));
    }

    #[test]
    fn restart_during_grace_keeps_the_recovery_epoch() {
        let dir = tempdir();
        let path = dir.join("clients.db");
        let r = SqliteRecovery::open(&path).unwrap();
        r.start_epoch().unwrap();
        r.add(b"a").unwrap();
        r.add(b"b").unwrap();
        drop(r);
        let r = SqliteRecovery::open(&path).unwrap();
        r.start_epoch().unwrap();
        r.add(b"a").unwrap(); // a reclaims, b has not yet
        r.add(b"fresh").unwrap();
        drop(r); // crash before grace ends
        let r = SqliteRecovery::open(&path).unwrap();
        let s = r.start_epoch().unwrap();
        assert_eq!((s.current, s.recovery), (3, 1));
        assert_eq!(s.reclaimable, owners(&[b"a", b"b"]));
        assert!(r.owners(2).unwrap().is_empty());
    }

    #[test]
    fn removed_clients_may_not_reclaim() {
        let r = SqliteRecovery::in_memory();
        r.start_epoch().unwrap();
        r.add(b"a").unwrap();
        let s = r.start_epoch().unwrap();
        assert_eq!(s.reclaimable, owners(&[b"a"]));
        // Expired during grace (its state was revoked): gone from both
        // epochs (RFC 8881 section 8.4.3, first edge condition).
        r.remove(b"a").unwrap();
        let s = r.start_epoch().unwrap();
        assert!(s.reclaimable.is_empty());
    }

    fn tempdir() -> PathBuf {
        let mut rnd = [0u8; 8];
        getrandom::getrandom(&mut rnd).unwrap();
        let d = std::env::temp_dir().join(format!("sluice-recovery-{}", u64::from_ne_bytes(rnd)));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
