//! The `--config FILE` format (TOML) and the access rules it sets.
//!
//! ```toml
//! [server]
//! listen = "0.0.0.0:2049"
//! state_dir = "/var/lib/sluice"
//! lease_time = 90
//! grace_time = 90            # default: the lease time
//! delegations = "read"       # "none", "read" or "all"
//! metrics = "127.0.0.1:9100"
//! readahead_max = "16M"
//! direct_read_min = "256K"
//! lend_read_min = "64K"     # cached READs this big sent from a mapping; 0 = never
//! direct_write_min = "256K"  # default 0: no WRITE past the page cache
//! write_behind_min = "256K"  # UNSTABLE WRITEs this big start their writeback; 0 = never
//! read_cache = "2G"
//! inline_quick_ops = 2       # default: the number of CPUs; 0: never
//! busy_poll_us = 50          # poll for a lone client's next request; 0: never
//! read_plus_min_hole = "32K"
//! listing_cache_ms = 1000    # listed attributes kept this long; 0 = never
//! tcp_congestion = "cubic"   # for NFS connections (default: the system's)
//! zero_copy = "remote"       # cached data by reference: "remote", "always", "never"
//! require_privileged_port = false
//! max_connections = 1024
//! portmap = false            # true: sluice's own portmapper on port 111
//! portmap_listen = "0.0.0.0:111"
//! v3_max_fh = 64             # 56 for VMware ESXi
//! cluster = "etcd://10.0.0.5:2379/prod"   # one node of a cluster
//! node_id = 1                # 1 to 254, unique in the cluster
//! cluster_lease = 10         # seconds without etcd before the node stops
//!
//! [[export]]
//! path = "/srv/data"
//! pseudo = "/"
//! read_only = false
//! sync = true                # false: answer changes before they are durable
//! clients = ["127.0.0.0/8", "192.168.1.0/24"]
//! squash = "root"            # "none", "root" or "all"
//! anon_uid = 65534
//! anon_gid = 65534
//! max_read = "1M"
//! max_write = "1M"
//! ```
//!
//! Every key is optional except an export's `path`. Unknown keys, wrong
//! types and bad values are errors that name the file, line and key.

use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::path::{Path, PathBuf};

use crate::rules::{IpRange, Squash};

/// Largest READ or WRITE payload the server offers.
pub const MAX_IO_LIMIT: u64 = 1024 * 1024;
/// Smallest READ or WRITE payload an export may be limited to.
pub const MIN_IO: u64 = 4096;

/// A whole config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Server-wide settings.
    #[serde(default)]
    pub server: ServerSection,
    /// The exports (`[[export]]` tables).
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportSection>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Address and port to listen on.
    pub listen: Option<String>,
    /// Where the handle key is kept.
    pub state_dir: Option<PathBuf>,
    /// Lease time in seconds.
    pub lease_time: Option<u64>,
    /// Grace period in seconds after every start.
    pub grace_time: Option<u64>,
    /// Which delegations to grant: "none", "read" or "all".
    pub delegations: Option<String>,
    /// Metrics endpoint address.
    pub metrics: Option<String>,
    /// Largest readahead window.
    pub readahead_max: Option<Size>,
    /// Smallest READ of a cold sequential stream read with O_DIRECT.
    pub direct_read_min: Option<Size>,
    /// Smallest READ of cached data sent from a mapping of the file.
    pub lend_read_min: Option<Size>,
    /// Smallest aligned WRITE written with O_DIRECT.
    pub direct_write_min: Option<Size>,
    /// Smallest UNSTABLE WRITE through the page cache that starts its
    /// writeback.
    pub write_behind_min: Option<Size>,
    /// Memory for data read with O_DIRECT, kept for the next reader.
    pub read_cache: Option<Size>,
    /// Connection threads that may run quick metadata work at once.
    pub inline_quick_ops: Option<usize>,
    /// How long a connection polls for its next request, in microseconds.
    pub busy_poll_us: Option<u64>,
    /// READ_PLUS hole reporting threshold.
    pub read_plus_min_hole: Option<Size>,
    /// How long listings keep the attributes they stat'ed, in ms.
    pub listing_cache_ms: Option<u64>,
    /// TCP congestion control algorithm of NFS connections.
    pub tcp_congestion: Option<String>,
    /// Which connections get cached data by reference: "remote",
    /// "always" or "never".
    pub zero_copy: Option<String>,
    /// Refuse connections from source ports of 1024 and above.
    pub require_privileged_port: Option<bool>,
    /// Connections served at once; more are closed on arrival.
    pub max_connections: Option<usize>,
    /// Run sluice's own portmapper (for a machine without rpcbind).
    pub portmap: Option<bool>,
    /// Where that portmapper listens (TCP and UDP).
    pub portmap_listen: Option<String>,
    /// Longest file handle given to NFSv3 clients (32 to 64).
    pub v3_max_fh: Option<usize>,
    /// etcd of the cluster this node belongs to
    /// (`etcd://HOST:PORT[,HOST:PORT...][/NAME]`).
    pub cluster: Option<String>,
    /// This node's number in the cluster (1 to 254).
    pub node_id: Option<u8>,
    /// Seconds the node's etcd lease lasts.
    pub cluster_lease: Option<u64>,
}

/// One `[[export]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSection {
    /// Directory on the server.
    pub path: PathBuf,
    /// Where clients see it: "/" for a single export, else a path such as
    /// "/data" in the pseudo file system joining the exports.
    #[serde(default = "root_pseudo")]
    pub pseudo: String,
    /// Refuse every change with NFS4ERR_ROFS.
    #[serde(default)]
    pub read_only: bool,
    /// Sync the directories and files an op changed before answering it
    /// (the default); false answers first, as the Linux server's `async`.
    #[serde(default = "yes")]
    pub sync: bool,
    /// Client address ranges allowed; none listed means everyone.
    #[serde(default)]
    pub clients: Vec<IpRange>,
    /// Identity squashing.
    #[serde(default)]
    pub squash: Squash,
    /// User id given to squashed callers.
    #[serde(default = "nobody")]
    pub anon_uid: u32,
    /// Group id given to squashed callers.
    #[serde(default = "nobody")]
    pub anon_gid: u32,
    /// Largest READ payload.
    pub max_read: Option<Size>,
    /// Largest WRITE payload.
    pub max_write: Option<Size>,
}

fn yes() -> bool {
    true
}

fn root_pseudo() -> String {
    "/".to_string()
}

fn nobody() -> u32 {
    65534
}

/// A byte count written as a number or a string with K, M or G.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(de::Error::custom),
        }
    }
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
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

/// Reads and checks a config file. Errors name the file and, where the
/// parser knows them, the line, column and key.
pub fn load(path: &Path) -> Result<ConfigFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    parse(&text, &path.display().to_string())
}

/// Parses config text; `name` is used in error messages.
pub fn parse(text: &str, name: &str) -> Result<ConfigFile, String> {
    let cfg: ConfigFile = toml::from_str(text).map_err(|e| {
        let Some(span) = e.span() else {
            return format!("{name}: {}", e.message().trim());
        };
        let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
        let msg = e.message().trim();
        match key_at(text, line) {
            Some(key) if !msg.contains("unknown field") => format!("{name}:{line}: {key}: {msg}"),
            _ => format!("{name}:{line}: {msg}"),
        }
    })?;
    let line_of = |needle: &str| {
        text.lines()
            .position(|l| l.contains(needle))
            .map(|i| format!(":{}", i + 1))
            .unwrap_or_default()
    };
    if cfg.exports.is_empty() {
        return Err(format!(
            "{name}: no [[export]] table: list the directory to serve"
        ));
    }
    if cfg.exports.len() > crate::server::exports::MAX_EXPORTS {
        return Err(format!(
            "{name}: {} [[export]] tables; at most {} are served",
            cfg.exports.len(),
            crate::server::exports::MAX_EXPORTS
        ));
    }
    let pseudo: Vec<&str> = cfg.exports.iter().map(|e| e.pseudo.as_str()).collect();
    crate::server::exports::check_pseudo_paths(&pseudo).map_err(|(i, m)| {
        format!(
            "{name}{}: export.pseudo: {m}",
            line_of(&format!("{:?}", pseudo[i]))
        )
    })?;
    for ex in &cfg.exports {
        for (key, v) in [("max_read", ex.max_read), ("max_write", ex.max_write)] {
            if let Some(Size(n)) = v {
                if !(MIN_IO..=MAX_IO_LIMIT).contains(&n) {
                    return Err(format!(
                        "{name}{}: export.{key} = {n}: must be {MIN_IO} to {MAX_IO_LIMIT} bytes",
                        line_of(key)
                    ));
                }
            }
        }
    }
    if cfg.server.max_connections == Some(0) {
        return Err(format!(
            "{name}{}: server.max_connections must be at least 1",
            line_of("max_connections")
        ));
    }
    if let Some(us) = cfg.server.busy_poll_us {
        check_busy_poll(us)
            .map_err(|m| format!("{name}{}: server.{m}", line_of("busy_poll_us")))?;
    }
    if let Some(z) = &cfg.server.zero_copy {
        z.parse::<crate::server::ZeroCopy>()
            .map_err(|m| format!("{name}{}: server.{m}", line_of("zero_copy")))?;
    }
    if let Some(cc) = &cfg.server.tcp_congestion {
        // Only the kernel knows which algorithms it has.
        crate::net::check_congestion(cc).map_err(|m| {
            format!(
                "{name}{}: server.tcp_congestion: {m}",
                line_of("tcp_congestion")
            )
        })?;
    }
    Ok(cfg)
}

/// Longest busy poll for a next request (`busy_poll_us`), 10 ms: a CPU
/// kept busy longer than that between one client's calls would be spent
/// for nothing.
pub const MAX_BUSY_POLL_US: u64 = 10_000;

/// Checks a `busy_poll_us` value; the message names the key.
pub fn check_busy_poll(us: u64) -> Result<(), String> {
    if us > MAX_BUSY_POLL_US {
        return Err(format!(
            "busy_poll_us = {us}: at most {MAX_BUSY_POLL_US} (10 ms); polls of 20 to 200 us cover a client's turnaround, 0 turns polling off"
        ));
    }
    Ok(())
}

/// The dotted key set on 1-based `line` ("export.squash"), from the line's
/// `key =` and the table header above it.
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line.checked_sub(1)?)?;
    let (key, _) = here.split_once('=')?;
    let key = key.trim();
    let table = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_parses() {
        let c = parse(
            r#"
[server]
listen = "127.0.0.1:2049"
lease_time = 30
readahead_max = "8M"
direct_read_min = "1M"
lend_read_min = "128K"
write_behind_min = "1M"
read_cache = "512M"
busy_poll_us = 20
tcp_congestion = "reno"
zero_copy = "always"
require_privileged_port = true
max_connections = 10

[[export]]
path = "/srv"
read_only = true
sync = false
clients = ["127.0.0.0/8", "::1"]
squash = "all"
anon_uid = 1000
max_read = 65536
max_write = "512K"
"#,
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.server.readahead_max, Some(Size(8 << 20)));
        assert_eq!(c.server.direct_read_min, Some(Size(1 << 20)));
        assert_eq!(c.server.lend_read_min, Some(Size(128 << 10)));
        assert_eq!(c.server.write_behind_min, Some(Size(1 << 20)));
        assert_eq!(c.server.read_cache, Some(Size(512 << 20)));
        assert_eq!(c.server.busy_poll_us, Some(20));
        assert_eq!(c.server.tcp_congestion.as_deref(), Some("reno"));
        assert_eq!(c.server.zero_copy.as_deref(), Some("always"));
        assert_eq!(c.server.max_connections, Some(10));
        let e = &c.exports[0];
        assert!(e.read_only);
        assert!(!e.sync);
        assert_eq!(e.squash, Squash::All);
        assert_eq!(e.anon_uid, 1000);
        assert_eq!(e.anon_gid, 65534);
        assert_eq!(e.max_write, Some(Size(512 << 10)));
        assert_eq!(e.clients.len(), 2);
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = parse("[[export]]\npath = \"/srv\"\nsquash = \"some\"\n", "x.toml").unwrap_err();
        assert!(e.starts_with("x.toml:3: export.squash:"), "{e}");
        assert!(e.contains("some"), "{e}");
        let e = parse("[[export]]\npath = \"/srv\"\nread_onyl = true\n", "x.toml").unwrap_err();
        assert!(e.starts_with("x.toml:3:") && e.contains("read_onyl"), "{e}");
        let e = parse(
            "[server]\nlease_time = \"long\"\n[[export]]\npath = \"/srv\"\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(e.starts_with("x.toml:2: server.lease_time:"), "{e}");
        let e = parse(
            "[[export]]\npath = \"/srv\"\nclients = [\"10.0.0.0/40\"]\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(
            e.starts_with("x.toml:3: export.clients:") && e.contains("prefix"),
            "{e}"
        );
        let e = parse("[[export]]\npath = \"/a\"\nmax_read = \"2M\"\n", "x.toml").unwrap_err();
        assert!(e.starts_with("x.toml:3:") && e.contains("max_read"), "{e}");
        let e = parse("[server]\n", "x.toml").unwrap_err();
        assert!(e.contains("no [[export]]"), "{e}");
        let e = parse(
            "[server]\nzero_copy = \"sometimes\"\n[[export]]\npath = \"/a\"\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(
            e.starts_with("x.toml:2: server.zero_copy:") && e.contains("remote"),
            "{e}"
        );
        let e = parse(
            "[[export]]\npath = \"/a\"\n[[export]]\npath = \"/b\"\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(
            e.contains("export.pseudo") && e.contains("single export"),
            "{e}"
        );
        let e = parse(
            "[[export]]\npath = \"/a\"\npseudo = \"/x\"\n[[export]]\npath = \"/b\"\npseudo = \"/x/y\"\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(
            e.starts_with("x.toml:6: export.pseudo") && e.contains("nested"),
            "{e}"
        );
        let e = parse("[[export]]\npath = \"/a\"\npseudo = \"x\"\n", "x.toml").unwrap_err();
        assert!(e.starts_with("x.toml:3: export.pseudo"), "{e}");
        let e = parse("[[export]]\npath = \"/a\"\npseudo = \"/../x\"\n", "x.toml").unwrap_err();
        assert!(e.contains("bad component"), "{e}");
    }

    #[test]
    fn several_exports_parse() {
        let c = parse(
            "[[export]]\npath = \"/a\"\npseudo = \"/home\"\n[[export]]\npath = \"/b\"\npseudo = \"/data/archive\"\nread_only = true\n",
            "x.toml",
        )
        .unwrap();
        assert_eq!(c.exports.len(), 2);
        assert_eq!(c.exports[1].pseudo, "/data/archive");
        assert!(c.exports[1].read_only && !c.exports[0].read_only);
        // Changes are synced before their answer unless an export says not.
        assert!(c.exports.iter().all(|e| e.sync));
    }

    #[test]
    fn ranges_match_addresses() {
        let r = IpRange::parse("10.1.0.0/16").unwrap();
        assert!(r.contains("10.1.200.3".parse().unwrap()));
        assert!(!r.contains("10.2.0.1".parse().unwrap()));
        assert!(r.contains("::ffff:10.1.0.9".parse().unwrap()));
        let all = IpRange::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let one = IpRange::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let v6 = IpRange::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(IpRange::parse("300.0.0.1").is_err());
        assert!(IpRange::parse("::1/129").is_err());
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("16X").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }
}
