//! Server metrics in the Prometheus text format, served over HTTP at
//! `--metrics ADDR` (`GET /metrics`).

use crate::server::counters::Histogram;
use crate::server::Server;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Bytes this process caused to be read from storage (`read_bytes` of
/// /proc/self/io), or None where the kernel does not account I/O.
pub fn disk_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The server's metrics, read at each scrape: counters and gauges from
/// the server's atomics and state table, and the READ latency histogram.
#[derive(Debug)]
struct Collect(Arc<Server>);

/// One counter (its name without `_total`, which the encoding adds).
fn counter(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

/// One gauge.
fn gauge(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// Encodes one latency histogram.
fn histogram(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, h: &Histogram) -> fmt::Result {
    let h = &h.0;
    h.encode(e.encode_descriptor(name, help, None, h.metric_type())?)
}

impl Collector for Collect {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> fmt::Result {
        let srv = &self.0;
        let m = &srv.metrics;
        let ra = &srv.read.readahead.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let sc = &srv.state.counters;
        let counters: [(&str, &str, u64); 45] = [
            (
                "sluice_copies",
                "COPY operations that copied on the server (synchronously) or started copying (asynchronously).",
                load(&m.copies),
            ),
            (
                "sluice_copy_bytes",
                "Bytes of source ranges copied on the server by COPY (data, and holes kept as holes).",
                load(&m.copy_bytes),
            ),
            (
                "sluice_write_behind_bytes",
                "Bytes of UNSTABLE WRITEs through the page cache that started their own writeback at once (--write-behind-min), so that a COMMIT has less left to wait for.",
                load(&m.write_behind_bytes),
            ),
            (
                "sluice_write_turns_waited",
                "WRITEs of at least 512 KiB through the page cache that waited, asleep, while another WRITE of the same file copied its data, instead of spinning on the file's lock in the kernel.",
                load(&m.write_turns_waited),
            ),
            (
                "sluice_entries_listed_without_stat",
                "READDIR entries (not directories) answered from the directory alone, without a stat, because the client asked for names, types and file ids only.",
                load(&m.entries_listed_without_stat),
            ),
            (
                "sluice_flush_witnesses_opened",
                "Descriptors opened for stable WRITEs to flush through, so that each learns of every failed writeback of its data; each is kept for the next stable WRITE of its file while used within 2 s, and only new ones are counted.",
                load(&m.flush_witnesses_opened),
            ),
            (
                "sluice_credential_changes",
                "File system identity changes (fsuid, fsgid, supplementary groups, CAP_SYS_RESOURCE) made to run requests as their callers; each costs the kernel a new credential. A request thread keeps its last caller's identity, so the next request of that caller changes none.",
                crate::engine::cred::changes_total(),
            ),
            (
                "sluice_write_verifier_changes",
                "Times the write verifier changed because the file system failed to flush or write data, so that clients send their uncommitted writes again.",
                load(&m.write_verifier_changes),
            ),
            (
                "sluice_metadata_commits",
                "Directories and files synced to stable storage before an answer, so that the names made, removed or renamed and the attributes set are not lost in a crash (exports with sync, the default).",
                load(&m.metadata_commits),
            ),
            (
                "sluice_delegations_granted",
                "Delegations granted on OPEN.",
                load(&sc.delegs_granted),
            ),
            (
                "sluice_write_delegations_granted",
                "Write delegations granted on OPEN (also counted in sluice_delegations_granted).",
                load(&sc.write_delegs_granted),
            ),
            (
                "sluice_delegations_recalled",
                "Delegations recalled because another client (or the server) was about to change the file.",
                load(&sc.delegs_recalled),
            ),
            (
                "sluice_delegations_returned",
                "Delegations given back with DELEGRETURN.",
                load(&sc.delegs_returned),
            ),
            (
                "sluice_delegations_revoked",
                "Delegations revoked: not returned within a lease of the recall, or their client's lease ran out.",
                load(&sc.delegs_revoked),
            ),
            ("sluice_reads", "READ and READ_PLUS operations served.", load(&m.reads)),
            (
                "sluice_callbacks",
                "Calls to clients over their back channels that were answered.",
                load(&m.callbacks),
            ),
            (
                "sluice_callback_failures",
                "Calls to clients over their back channels that got no answer (timeout, refusal, connection gone).",
                load(&m.callback_failures),
            ),
            (
                "sluice_read_bytes_sent",
                "File data bytes sent in READ and READ_PLUS replies.",
                load(&m.read_bytes_sent),
            ),
            (
                "sluice_records_sent",
                "Records (replies, and calls to clients) the server sent over TCP connections.",
                load(&m.records_sent),
            ),
            (
                "sluice_record_writes",
                "System calls (writev, sendmsg) that wrote records to TCP connections; below sluice_records_sent where small replies were gathered into one write.",
                load(&m.record_writes),
            ),
            (
                "sluice_disk_read_bytes",
                "Bytes the server process read from storage (read_bytes of /proc/self/io).",
                disk_read_bytes().unwrap_or(0),
            ),
            (
                "sluice_readahead_issued_bytes",
                "Bytes the server read ahead: into the page cache, or with O_DIRECT into its read cache.",
                load(&ra.issued_bytes),
            ),
            (
                "sluice_readahead_dropped",
                "Readahead requests dropped because a readahead queue was full.",
                load(&ra.dropped),
            ),
            (
                "sluice_readahead_hits",
                "Reads of sequential streams served without waiting for the disk (from the page cache or from data read ahead into the read cache).",
                load(&ra.hits),
            ),
            (
                "sluice_readahead_misses",
                "Reads of sequential streams that had to wait for the disk.",
                load(&ra.misses),
            ),
            (
                "sluice_readahead_wasted_bytes",
                "Bytes read ahead that no read reached before the stream moved or ended.",
                load(&ra.wasted_bytes),
            ),
            (
                "sluice_direct_read_bytes",
                "Bytes of cold sequential streams read with O_DIRECT, past the page cache (their READs and their readahead).",
                load(&ra.direct_bytes),
            ),
            (
                "sluice_read_lent_bytes",
                "Bytes of cached file data sent from a mapping of the file, copied once (by the socket) instead of twice.",
                load(&ra.lent_bytes),
            ),
            (
                "sluice_read_lent_mappings",
                "Mappings of files made to lend cached data from: one per file, which all its readers share, and another when the file grew past it.",
                load(&ra.mappings),
            ),
            (
                "sluice_read_lent_settled_bytes",
                "Bytes of such data copied after all, because the reply had to wait for room in the socket.",
                crate::engine::mapped::settled_bytes(),
            ),
            (
                "sluice_read_cache_hits",
                "READs served from the server's cache of data read with O_DIRECT.",
                load(&srv.read.bufcache.stats.hits),
            ),
            (
                "sluice_read_spliced_bytes",
                "Bytes of the server's cache of data read with O_DIRECT handed to sockets by reference, without a copy (see --zero-copy).",
                crate::net::spliced_bytes(),
            ),
            (
                "sluice_read_cache_regions_unmapped",
                "Regions of that cache whose pages went to sockets by reference, unmapped instead of used again once dropped.",
                crate::engine::hugebuf::fixed_unmapped(),
            ),
            (
                "sluice_inline_requests",
                "Requests answered on their connection's thread with quick metadata work (names, small page-cache writes, directory listings) done there, not handed to a request thread.",
                srv.inline.counts().0,
            ),
            (
                "sluice_requests_polled",
                "Requests taken from the socket by a connection's thread polling for them right after its last answer (--busy-poll-us), without sleeping in between.",
                srv.pollers.polled.load(Ordering::Relaxed),
            ),
            (
                "sluice_polls_missed",
                "Polls for a next request that ended without one; each stops that connection's polling until its client is quick again.",
                srv.pollers.missed.load(Ordering::Relaxed),
            ),
            (
                "sluice_polls_left_to_the_reader",
                "Polls that found more than one request waiting (a client with several in flight) and left them to the connection's ordinary read, which takes them all at once.",
                srv.pollers.behind.load(Ordering::Relaxed),
            ),
            (
                "sluice_inline_slow",
                "Quick work on a connection's thread that waited for storage (slept in the kernel for longer than 4 ms while reading from storage, or for longer than 20 ms); each sends quick work to the request threads for 200 ms.",
                srv.inline.counts().1,
            ),
            (
                "sluice_listed_handles_remembered",
                "File handles of directory entries (READDIR, READDIRPLUS) found in the server's memo of handles instead of asked of the kernel.",
                srv.exports
                    .list()
                    .iter()
                    .map(|x| x.fs.memo().counts().1)
                    .sum(),
            ),
            (
                "sluice_listed_attributes_remembered",
                "Attributes of directory entries (READDIR, READDIRPLUS) answered from what an earlier listing stat'ed (--listing-cache-ms), instead of a stat.",
                srv.exports
                    .list()
                    .iter()
                    .map(|x| x.fs.attrs().counts().1)
                    .sum(),
            ),
            (
                "sluice_reclaims",
                "Opens and locks reclaimed during grace.",
                load(&srv.state.counters.reclaims),
            ),
            (
                "sluice_nlm_granted_callbacks",
                "NLM4_GRANTED calls accepted by NFSv3 clients' lock managers (a blocked lock granted).",
                load(&srv.nlm.granted_sent),
            ),
            (
                "sluice_nlm_results_sent",
                "Results of asynchronous NLM requests (TEST_RES, LOCK_RES, CANCEL_RES, UNLOCK_RES) sent to clients' lock managers.",
                load(&srv.nlm.results_sent),
            ),
            (
                "sluice_sm_notify_sent",
                "SM_NOTIFY calls answered by the status monitors of NLM client hosts after a start.",
                load(&srv.nlm.notify_sent),
            ),
            (
                "sluice_clients_expired",
                "Clients expired: silent with nothing to keep, out of courtesy time, or in the way of another client.",
                load(&srv.state.counters.expired),
            ),
        ];
        for (name, help, v) in counters {
            counter(&mut e, name, help, v)?;
        }
        let u = srv.state.usage();
        let g = srv.state.grace_status();
        let gauges: [(&str, &str, u64); 15] = [
            (
                "sluice_async_copies",
                "Asynchronous COPY operations running now.",
                srv.copies.running() as u64,
            ),
            (
                "sluice_delegations",
                "Delegations held by clients now.",
                srv.state.delegations() as u64,
            ),
            (
                "sluice_write_delegations",
                "Write delegations held by clients now (also counted in sluice_delegations).",
                srv.state.write_delegations() as u64,
            ),
            (
                "sluice_readahead_max_bytes",
                "Largest readahead window of a stream.",
                srv.read.readahead.config().max,
            ),
            (
                "sluice_read_cache_bytes",
                "Bytes held by the cache of data read with O_DIRECT.",
                load(&srv.read.bufcache.stats.bytes),
            ),
            ("sluice_clients", "Client records, confirmed or not.", u.clients as u64),
            (
                "sluice_courtesy_clients",
                "Clients whose lease ran out that keep their state until somebody conflicts with it.",
                u.courtesy as u64,
            ),
            ("sluice_sessions", "Sessions.", u.sessions as u64),
            ("sluice_opens", "Open stateids (one per open-owner and file).", u.opens as u64),
            (
                "sluice_lock_owners",
                "Lock stateids (one per lock-owner and file).",
                u.lock_owners as u64,
            ),
            ("sluice_locks", "Byte ranges locked by clients.", u.locks as u64),
            (
                "sluice_nlm_waiting_locks",
                "Blocking NLM LOCKs waiting for a conflicting lock to go.",
                srv.nlm.waiting() as u64,
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
            (
                "sluice_cluster_isolated",
                "1 while this cluster node cannot reach etcd: it grants no new state.",
                srv.state.cluster_isolated() as u64,
            ),
        ];
        for (name, help, v) in gauges {
            gauge(&mut e, name, help, v)?;
        }
        histogram(
            &mut e,
            "sluice_read_duration_seconds",
            "Time to serve one READ or READ_PLUS operation.",
            &m.read_latency,
        )?;
        histogram(
            &mut e,
            "sluice_callback_duration_seconds",
            "Time from sending a call to a client to its answer or failure.",
            &m.callback_latency,
        )
    }
}

/// The metrics page, in the OpenMetrics text format.
pub fn render(srv: &Arc<Server>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collect(srv.clone())));
    let mut out = String::with_capacity(8192);
    if let Err(e) = encode(&mut out, &registry) {
        tracing::warn!(error = %e, "metrics: cannot encode");
    }
    out
}

/// The content type of [`render`]'s page.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the metrics page over HTTP/1.1 (hyper) until the task is
/// dropped: `GET /metrics` (or `/`); other paths get 404, other methods 405.
pub async fn serve(listener: TcpListener, srv: Arc<Server>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let srv = srv.clone();
        crate::tasks::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| answer(req, srv.clone()));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_secs(10), conn).await;
        });
    }
}

/// Answers one request.
async fn answer(
    req: Request<Incoming>,
    srv: Arc<Server>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    };
    Ok(if req.method() != Method::GET {
        reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        )
    } else if matches!(req.uri().path(), "/metrics" | "/") {
        // The state table's lock and /proc reads: off the async threads.
        let body = crate::tasks::blocking(move || render(&srv))
            .await
            .unwrap_or_default();
        reply(StatusCode::OK, CONTENT_TYPE, body)
    } else {
        reply(StatusCode::NOT_FOUND, "text/plain", "see /metrics\n".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Arc<Server> {
        Server::scratch("metrics", Default::default())
    }

    #[test]
    fn the_page_has_counters_gauges_and_a_cumulative_histogram() {
        let srv = server();
        srv.metrics.reads.fetch_add(3, Ordering::Relaxed);
        let h = &srv.metrics.read_latency;
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_secs(10));
        let s = render(&srv);
        for want in [
            "# TYPE sluice_reads counter\n",
            "sluice_reads_total 3\n",
            "# TYPE sluice_in_grace gauge\n",
            "sluice_in_grace 0\n",
            "sluice_sessions 0\n",
            "sluice_read_duration_seconds_bucket{le=\"0.000025\"} 1\n",
            "sluice_read_duration_seconds_bucket{le=\"0.0005\"} 2\n",
            "sluice_read_duration_seconds_bucket{le=\"5.0\"} 2\n",
            "sluice_read_duration_seconds_bucket{le=\"+Inf\"} 3\n",
            "sluice_read_duration_seconds_count 3\n",
        ] {
            assert!(s.contains(want), "{want:?} not in:\n{s}");
        }
        assert!(s.ends_with("# EOF\n"), "{s}");
    }

    #[test]
    fn disk_read_bytes_is_readable() {
        // Every Linux kernel this runs on accounts task I/O.
        assert!(disk_read_bytes().is_some());
    }
}
