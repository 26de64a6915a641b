//! TCP transport: accepts connections, reassembles records, runs each
//! request on a blocking worker and writes replies as they complete.
//!
//! Replies go out with vectored writes: file data read for READ and
//! READ_PLUS stays in the buffer it was read into and is handed to the
//! socket as it is, next to the small encoded headers. For clients on
//! other machines, data of the read cache goes by reference further
//! still: its pages, not a copy, go into the socket ([`Kind::Fixed`]).

use crate::rpc::{self, FragmentHeader, RecordAssembler};
use crate::rules::IpRange;
use crate::server::callback::CbConn;
use crate::server::{Call, Paused, Server};
use crate::xdr::Encoder;
use bytes::Bytes;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest RPC record accepted (a 1 MiB WRITE plus headers fits easily).
pub const MAX_RECORD: usize = 2 * 1024 * 1024;
/// Requests of one connection processed at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Largest reply: a session's ca_maxresponsesize is at most this (1 MiB
/// of READ data plus room for the headers); replies outside a session
/// are small.
pub const MAX_REPLY: usize = crate::server::attrs::MAX_IO as usize + 64 * 1024;
/// Bytes of one connection's requests being processed and replies not
/// yet written. Each request holds its record's length plus
/// [`MAX_REPLY`] from the moment it is read until its reply is handed
/// to the socket (less once the reply's real size is known); when the
/// budget is spent, the connection reads no further requests until
/// replies have gone out. With the record being read (at most
/// 3 x [`MAX_RECORD`] while it is assembled), a connection's buffers stay
/// under `3 * MAX_RECORD + CONN_MEMORY` bytes.
pub const CONN_MEMORY: usize = 32 * 1024 * 1024;

const _: () = assert!(MAX_RECORD + MAX_REPLY <= CONN_MEMORY && CONN_MEMORY <= u32::MAX as usize);

/// Who may connect, and how many at once.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Address ranges allowed to connect; empty means everyone.
    pub clients: Vec<IpRange>,
    /// Refuse source ports of 1024 and above (only root can bind below).
    pub require_privileged_port: bool,
    /// Connections served at once; more are closed on arrival.
    pub max_connections: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            clients: Vec::new(),
            require_privileged_port: false,
            max_connections: 1024,
        }
    }
}

impl Policy {
    /// Why a connection from `peer` is refused, or None to serve it.
    pub fn refuse(&self, peer: SocketAddr) -> Option<&'static str> {
        if !crate::rules::admitted(&self.clients, peer.ip()) {
            return Some("address not in any export's client list");
        }
        if self.require_privileged_port && peer.port() >= 1024 {
            return Some("source port not privileged (below 1024)");
        }
        None
    }
}

/// TCP keepalive: after this many seconds without traffic the kernel
/// probes the peer ...
const KEEPALIVE_IDLE_SECS: i32 = 60;
/// ... every this many seconds ...
const KEEPALIVE_INTERVAL_SECS: i32 = 15;
/// ... and closes the connection after this many unanswered probes.
const KEEPALIVE_PROBES: i32 = 4;
// Silent for 60 s, then 4 probes 15 s apart: gone within 2 minutes.
const _: () = assert!(KEEPALIVE_IDLE_SECS + KEEPALIVE_INTERVAL_SECS * KEEPALIVE_PROBES <= 120);
/// Replies the peer leaves unacknowledged (or does not make room for)
/// this long end the connection (TCP_USER_TIMEOUT).
const USER_TIMEOUT_MS: u32 = 300_000;

/// Makes the kernel notice a peer that has gone (powered off, unplugged):
/// its connection is closed within two minutes of silence, and one that
/// takes no replies for five minutes, instead of both being held (with
/// their buffers and a place under `max_connections`) indefinitely. Lease
/// expiry then frees the client's state.
fn watch_peer(stream: &TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let set = |level: i32, name: i32, value: i32| -> std::io::Result<()> {
        // SAFETY: an int option on a socket we own, with its size.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_SECS)?;
    set(
        libc::IPPROTO_TCP,
        libc::TCP_KEEPINTVL,
        KEEPALIVE_INTERVAL_SECS,
    )?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES)?;
    set(
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        USER_TIMEOUT_MS as i32,
    )
}

/// Where the kernel lists the congestion control algorithms it has, and
/// those any user may choose (root may choose every one it has).
const CC_AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";
const CC_ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

/// Makes `name` the TCP congestion control algorithm of the socket `fd`.
/// Set on a listening socket, it is inherited by every connection the
/// socket accepts. The error says what the kernel offers instead.
pub fn set_congestion(fd: std::os::fd::BorrowedFd<'_>, name: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let listed = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "(unknown)".into())
    };
    if name.is_empty() || name.len() >= 16 || name.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "\"{name}\" is not a congestion control algorithm's name; this kernel has: {}",
            listed(CC_AVAILABLE)
        ));
    }
    // SAFETY: a string option on a socket the caller owns, with its length.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::ENOENT) => format!(
            "the kernel has no TCP congestion control \"{name}\"; it has: {} (a module may add it: modprobe tcp_{name})",
            listed(CC_AVAILABLE)
        ),
        Some(libc::EPERM) => format!(
            "TCP congestion control \"{name}\" needs CAP_NET_ADMIN (run as root); without it only these are allowed: {}",
            listed(CC_ALLOWED)
        ),
        _ => format!("cannot set TCP congestion control \"{name}\": {e}"),
    })
}

/// Checks that `name` can be set on this server's TCP sockets, on an
/// unbound socket made for the purpose (before anything listens).
pub fn check_congestion(name: &str) -> Result<(), String> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    // SAFETY: no pointers; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "cannot check TCP congestion control \"{name}\": {e}"
        ));
    }
    // SAFETY: a descriptor just made and owned by nothing else.
    let probe = unsafe { OwnedFd::from_raw_fd(fd) };
    set_congestion(probe.as_fd(), name)
}

/// Counts requests being processed, so shutdown can wait for them; a
/// connection also counts its own on request threads with one.
#[derive(Debug, Default)]
pub struct InFlight {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    /// Requests being processed now.
    pub fn count(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until no request is being processed.
    pub async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            idle.await;
        }
    }
}

struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self
            .0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

/// Accepts connections until the task is dropped.
pub async fn serve(listener: TcpListener, srv: Arc<Server>) {
    serve_with(listener, srv, Policy::default(), Arc::default()).await
}

/// Accepts connections allowed by `policy` until the task is dropped;
/// `inflight` counts the requests being processed.
pub async fn serve_with(
    listener: TcpListener,
    srv: Arc<Server>,
    policy: Policy,
    inflight: Arc<InFlight>,
) {
    let conns = Arc::new(Semaphore::new(policy.max_connections));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if let Some(why) = policy.refuse(peer) {
                    tracing::warn!(%peer, reason = why, "connection refused");
                    drop(stream);
                    continue;
                }
                let Ok(permit) = conns.clone().try_acquire_owned() else {
                    tracing::warn!(
                        %peer,
                        limit = policy.max_connections,
                        "connection refused: too many connections"
                    );
                    drop(stream);
                    continue;
                };
                tracing::debug!(%peer, "connection accepted");
                let _ = stream.set_nodelay(true);
                if let Err(e) = watch_peer(&stream) {
                    tracing::debug!(%peer, error = %e, "cannot set TCP keepalive");
                }
                let srv = srv.clone();
                let inflight = inflight.clone();
                crate::tasks::spawn_requests(async move {
                    if let Err(e) = connection(stream, srv, inflight).await {
                        tracing::debug!(%peer, error = %e, "connection closed");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Serves the NFS port's UDP side (MOUNT, NLM, NSM and the portmapper;
/// see [`Server::handle_datagram`]) until the task is dropped. Each call
/// runs on a blocking worker.
pub async fn serve_udp(socket: tokio::net::UdpSocket, srv: Arc<Server>, policy: Policy) {
    let socket = Arc::new(socket);
    let bound = socket
        .local_addr()
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified());
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            tokio::task::yield_now().await;
            continue;
        };
        if policy.refuse(from).is_some() {
            continue;
        }
        let record = buf[..n].to_vec();
        let (srv, socket) = (srv.clone(), socket.clone());
        // The address the caller reached: the socket's own when it is
        // bound to one; a loopback caller reached loopback.
        let local = bound.or_else(|| from.ip().is_loopback().then(|| from.ip()));
        crate::tasks::spawn(async move {
            let reply = crate::tasks::blocking(move || {
                srv.handle_datagram(&record, Some(from.ip()), local)
            })
            .await;
            if let Ok(Some(reply)) = reply {
                let _ = socket.send_to(&reply, from).await;
            }
        });
    }
}

/// Largest portmapper call taken (they are a few dozen bytes).
const PORTMAP_MAX_RECORD: usize = 4096;

/// Runs sluice's own portmapper at `at` over TCP and UDP (see
/// [`crate::server::portmap`]) until the returned tasks are aborted.
pub async fn serve_portmap(
    at: &str,
    table: crate::server::portmap::Table,
) -> std::io::Result<Vec<tokio::task::JoinHandle<()>>> {
    use crate::server::portmap::answer;
    let tcp = TcpListener::bind(at).await?;
    let udp = tokio::net::UdpSocket::bind(tcp.local_addr()?).await?;
    tracing::info!(addr = %tcp.local_addr()?, "portmapper (TCP and UDP)");
    let tcp_task = crate::tasks::spawn(async move {
        loop {
            let Ok((mut stream, _)) = tcp.accept().await else {
                tokio::task::yield_now().await;
                continue;
            };
            crate::tasks::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let local = stream.local_addr().ok().map(|a| a.ip());
                let mut asm = rpc::RecordAssembler::new(PORTMAP_MAX_RECORD);
                loop {
                    let mut mark = [0u8; 4];
                    if stream.read_exact(&mut mark).await.is_err() {
                        return;
                    }
                    let h = rpc::FragmentHeader::parse(mark);
                    if asm.admit(h).is_err() {
                        return;
                    }
                    let mut body = vec![0u8; h.len];
                    if stream.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let Ok(Some(record)) = asm.push(&body, h.last) else {
                        continue;
                    };
                    if let Some(reply) = answer(&table, &record, local) {
                        let mut out = rpc::record_mark(reply.len()).to_vec();
                        out.extend_from_slice(&reply);
                        if stream.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let udp_task = crate::tasks::spawn(async move {
        let mut buf = vec![0u8; PORTMAP_MAX_RECORD];
        let local = udp
            .local_addr()
            .ok()
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified());
        loop {
            let Ok((n, from)) = udp.recv_from(&mut buf).await else {
                continue;
            };
            // The address the caller reached: the socket's own when it is
            // bound to one, else the loopback the caller came from or
            // nothing (GETADDR then answers without an address).
            let here = local.or_else(|| from.ip().is_loopback().then(|| from.ip()));
            if let Some(reply) = answer(&table, &buf[..n], here) {
                let _ = udp.send_to(&reply, from).await;
            }
        }
    });
    Ok(vec![tcp_task, udp_task])
}

/// Serves one connection: reads records, runs each request on a blocking
/// worker, and writes each reply as it completes (small replies made
/// here while the next request waits whole in the buffer are gathered
/// and written together, see [`Outbox::send_or_gather`]).
///
/// The worker that made a reply writes it to the socket itself when
/// nothing is queued before it and the socket takes it whole; only what
/// does not fit goes to the connection's [`Outbox`] task. A small
/// request thus costs one hand-over between threads (to the worker),
/// not three (to the worker, back to a task, on to a writer task).
///
/// Memory: a record arriving in one fragment (what clients send) is read
/// into one buffer of its length, which becomes the request. A record in
/// several fragments is gathered by the assembler: the fragment being
/// read plus the assembled part, at most 3 x [`MAX_RECORD`] with the
/// assembler's growth. Complete requests and their replies count against
/// [`CONN_MEMORY`].
async fn connection(
    stream: TcpStream,
    srv: Arc<Server>,
    inflight: Arc<InFlight>,
) -> std::io::Result<()> {
    let peer = stream.peer_addr().ok();
    let local = stream.local_addr().ok().map(|a| a.ip());
    // Exports check the address on every use; an unknown one (the socket
    // already broken) is admitted only where everyone is.
    let ip = Some(peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |p| p.ip()));
    let (rd, wr) = stream.into_split();
    // Small records (most requests) come in with their record mark in
    // one read; large WRITE bodies are read straight into their buffer.
    let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER, rd);
    let zero_copy = match (peer, local) {
        (Some(p), Some(l)) => srv.config.zero_copy.applies(p.ip(), l),
        _ => false,
    };
    let outbox = Arc::new(
        Outbox::new(wr)
            .zero_copy(zero_copy)
            .counting(srv.metrics.clone()),
    );
    // Writes replies: no file, no identity.
    let writer = crate::tasks::spawn_requests(outbox.clone().run());
    let backlog = outbox.backlog.clone();
    // Calls to the client over this connection (the back channel of the
    // sessions it is bound to); their replies come in with the calls.
    let cb = {
        let outbox = Arc::downgrade(&outbox);
        CbConn::new(move |call| outbox.upgrade().is_some_and(|o| o.send_call(call)))
    };
    if let Some(ip) = local {
        cb.set_local(ip);
    }
    cb.set_backlog(backlog);
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let memory = Arc::new(Semaphore::new(CONN_MEMORY));
    // This connection's requests on request threads (or waiting there
    // for a directory's sync): while any is, its quick ops go there too.
    let handed_over = Arc::new(InFlight::default());
    let mut asm = RecordAssembler::new(MAX_RECORD);
    let mut partial = false;
    let mut poll = Poller::new(srv.config.busy_poll, srv.pollers.conn_id());
    let result = loop {
        // Replies gathered while requests waited in the buffer go out
        // before this thread may wait for more (see
        // `Outbox::send_or_gather`).
        if !whole_record(rd.buffer()) {
            outbox.flush();
        }
        // Right after answering on this thread, with nothing else to do
        // here or anywhere in the server: wait for the next request by
        // polling the socket (see `Poller`).
        let polled = if !partial
            && rd.buffer().is_empty()
            && slots.available_permits() == MAX_IN_FLIGHT
            && inflight.count() == 0
        {
            poll.next_record(rd.get_ref().as_ref(), &srv.pollers)
        } else {
            poll.answered = None;
            None
        };
        let record = match polled {
            Some(record) => record,
            None => {
                let mut mark = [0u8; 4];
                if let Err(e) = rd.read_exact(&mut mark).await {
                    break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        Ok(())
                    } else {
                        Err(e)
                    };
                }
                poll.arrived(&srv.pollers);
                let h = FragmentHeader::parse(mark);
                if asm.admit(h).is_err() {
                    tracing::warn!(?peer, len = h.len, "record too large; closing connection");
                    break Ok(());
                }
                let body = match read_body(&mut rd, h.len).await {
                    Ok(b) => b,
                    Err(e) => break Err(e),
                };
                if h.last && !partial {
                    body
                } else {
                    match asm.push(&body, h.last) {
                        Ok(Some(r)) => {
                            partial = false;
                            r
                        }
                        Ok(None) => {
                            partial = true;
                            continue;
                        }
                        Err(_) => {
                            tracing::warn!(?peer, "record too large; closing connection");
                            break Ok(());
                        }
                    }
                }
            }
        };
        if outbox.failed() {
            // Replies can no longer be sent; stop taking requests.
            break Ok(());
        }
        if rpc::is_reply(&record) {
            // The answer to a callback.
            cb.reply(record);
            continue;
        }
        // While replies of lent data wait for room in the socket, so does
        // the next request (see `Outbox::room`).
        outbox.room(|| cb.awaiting_replies()).await;
        if outbox.failed() {
            break Ok(());
        }
        // While the connection's budget is spent, no more requests are
        // read; the replies gathered here must go first, for they hold
        // part of it.
        if slots.available_permits() == 0
            || memory.available_permits() < reservation(CONN_MEMORY, record.len())
        {
            outbox.flush();
        }
        let Some(mem) = reserve(&memory, CONN_MEMORY, record.len()).await else {
            break Ok(());
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break Ok(());
        };
        let busy = inflight.enter();
        // First here, as far as it goes without waiting: requests for
        // cached data and in-memory state are answered without leaving
        // this thread.
        let mut call = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            srv.try_call_on(record, ip, Some(&cb))
        }));
        // Then its quick ops, here too, when none of this connection's
        // requests is on a request thread and the server has a turn free
        // (see `server::inline`): a worker's wake-up costs about as much
        // as a quick op, and quick ops here beside the same client's on
        // workers would contend with them for the same files' locks.
        // Requests behind it in the buffer wait for it, as they would for
        // a cached READ answered here.
        if let Ok(Call::Paused(p)) = call {
            if rd.buffer().is_empty() {
                // Replies gathered before this request go first: they
                // must not wait for its work, and they hold slots.
                outbox.flush();
            }
            let here = handed_over.count() == 0;
            call = quick_on_turn(p, &srv, here.then(|| srv.inline.enter()).flatten());
        }
        let paused = match call {
            Ok(Call::Paused(p)) => p,
            Ok(Call::Done(reply)) => {
                // While the next request waits whole in the buffer, a
                // small reply waits to go out with its: one write, and
                // one wake-up of the client, for all of them. Not one
                // that calls to the client follow (they may go on
                // another connection).
                let after = cb.take_after_reply();
                let more = whole_record(rd.buffer()) && after.is_empty();
                outbox.deliver_or_gather(Ok(reply), mem, permit, more);
                start_calls(after);
                poll.answered();
                continue;
            }
            Err(e) => {
                outbox.deliver(Err(e), mem, permit);
                continue;
            }
        };
        let srv = srv.clone();
        let outbox = outbox.clone();
        let cb = cb.clone();
        let busy = (busy, handed_over.enter());
        if paused.awaits_syncs() && paused.syncs_running(&srv) {
            // An op that ran here changed a directory of a `sync` export
            // while a sync of it runs: a task waits for the next sync,
            // sharing it with the other ops that changed the directory
            // meanwhile, without holding a thread; then the rest runs as
            // it would have here. (With no sync running, a worker runs
            // the op's own sync and answers, below.)
            drop(crate::tasks::spawn_requests(async move {
                let call = match CatchUnwind(Box::pin(paused.sync(&srv))).await {
                    Ok(call) => call,
                    Err(e) => return outbox.deliver(Err(e), mem, permit),
                };
                let call = match call {
                    Call::Paused(p) => quick_on_turn(p, &srv, srv.inline.enter()),
                    done => Ok(done),
                };
                match call {
                    Ok(Call::Paused(p)) => finish_on_worker(p, srv, outbox, cb, mem, permit, busy),
                    Ok(Call::Done(reply)) => {
                        outbox.deliver(Ok(reply), mem, permit);
                        start_callbacks(&cb);
                    }
                    Err(e) => outbox.deliver(Err(e), mem, permit),
                }
            }));
            continue;
        }
        finish_on_worker(paused, srv, outbox, cb, mem, permit, busy);
    };
    // Requests still being processed send their replies before the
    // connection closes: wait until every slot is back.
    outbox.flush();
    let _ = slots.acquire_many(MAX_IN_FLIGHT as u32).await;
    cb.close();
    outbox.close();
    let _ = writer.await;
    result
}

/// Goes on with a paused call's quick ops on this task when it has a
/// `turn` (see `server::inline`), counted answered when they finish the
/// call; without one the call comes back as it is.
fn quick_on_turn(
    p: Paused,
    srv: &Server,
    turn: Option<crate::server::inline::Turn<'_>>,
) -> std::thread::Result<Call> {
    let Some(turn) = turn else {
        return Ok(Call::Paused(p));
    };
    let quick = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.try_quick(srv)));
    if let Ok(Call::Done(_)) = quick {
        turn.answered();
    }
    quick
}

/// Finishes a paused call on a worker that may wait. Detached: the
/// worker hands its reply to the outbox itself.
fn finish_on_worker<B: Send + 'static>(
    paused: Paused,
    srv: Arc<Server>,
    outbox: Arc<Outbox>,
    cb: Arc<CbConn>,
    mem: OwnedSemaphorePermit,
    permit: OwnedSemaphorePermit,
    busy: B,
) {
    drop(crate::tasks::blocking_lending(move || {
        let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| paused.resume(&srv)));
        outbox.deliver(reply, mem, permit);
        start_callbacks(&cb);
        drop(busy);
    }));
}

/// A future whose panic comes back as an error, as
/// `std::panic::catch_unwind` gives a closure's.
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(e) => std::task::Poll::Ready(Err(e)),
        }
    }
}

/// Connections that busy poll for their next request: at most one
/// fewer than the CPUs at once, so that a CPU is always left for the
/// rest, and only a connection that brought the last [`ALONE`] requests
/// the server read: where several clients keep the server busy, a thread
/// polling one socket would hold up requests waiting on the others.
#[derive(Debug)]
pub struct Pollers {
    polling: AtomicUsize,
    max: usize,
    ids: AtomicU64,
    /// The connection the last request came on by the ordinary way (not
    /// polled), and how many came on it in a row before that one.
    last_conn: AtomicU64,
    run: AtomicU64,
    /// Requests found by polling.
    pub polled: AtomicU64,
    /// Polls that ended without a request.
    pub missed: AtomicU64,
    /// Polls that found several requests queued and left them to the
    /// ordinary read.
    pub behind: AtomicU64,
}

/// How many requests in a row one connection must have brought before it
/// may poll.
pub const ALONE: u64 = 64;

impl Pollers {
    /// Polling for at most `cpus - 1` connections at once.
    pub fn new(cpus: usize) -> Self {
        Pollers {
            polling: AtomicUsize::new(0),
            max: cpus.saturating_sub(1),
            ids: AtomicU64::new(0),
            last_conn: AtomicU64::new(0),
            run: AtomicU64::new(0),
            polled: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            behind: AtomicU64::new(0),
        }
    }

    /// An id for a new connection (never 0).
    pub fn conn_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A request came in on connection `id` by the ordinary way.
    pub fn arrival(&self, id: u64) {
        if self.last_conn.swap(id, Ordering::Relaxed) == id {
            self.run.fetch_add(1, Ordering::Relaxed);
        } else {
            self.run.store(0, Ordering::Relaxed);
        }
    }

    /// A turn to poll for connection `id`: when it brought the last
    /// [`ALONE`] requests and fewer than the most connections poll.
    pub fn enter(&self, id: u64) -> Option<PollTurn<'_>> {
        if self.last_conn.load(Ordering::Relaxed) != id || self.run.load(Ordering::Relaxed) < ALONE
        {
            return None;
        }
        self.polling
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| PollTurn(self))
    }
}

/// A connection's turn to poll; given back when dropped.
pub struct PollTurn<'a>(&'a Pollers);

impl Drop for PollTurn<'_> {
    fn drop(&mut self) {
        self.0.polling.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Busy polling for a connection's next request.
///
/// A client that sends its next request as soon as it has the answer to
/// the last one (one process working through files, each call waiting
/// for the one before) makes the server's thread sleep in `epoll_wait`
/// between requests, and every request then pays for waking it: a few
/// microseconds on an idle bare-metal core, more from a deep C-state, and
/// on a virtual machine whose idle CPUs halt, the host's wake-up of the
/// virtual CPU (about 35 us per wake-up on the 2-CPU benchmark machine,
/// where a loopback ping-pong between two cores took 80-86 us a round
/// trip and on one core 14 us). So after answering a request on its own
/// thread, a connection that has nothing else in flight, while the
/// server has nothing else in process, polls its socket for up to the
/// budget (`Config::busy_poll`) and takes the next request from it
/// directly.
///
/// It polls only while armed: a request that came by the ordinary way
/// within twice the budget of the answer before arms it, and a poll
/// that ends without a request disarms it, so a client that pauses
/// costs at most one budget of CPU.
///
/// Only a whole small record (one last fragment that fits
/// [`READ_BUFFER`]) is taken this way; anything else is left in the
/// socket for the ordinary path, which reads it next (the connection's
/// buffer is empty whenever it polls, so order is kept).
struct Poller {
    budget: Duration,
    /// This connection's id among the [`Pollers`].
    id: u64,
    armed: bool,
    /// When this thread last answered a request itself (None when the
    /// answer came otherwise, or polling is off).
    answered: Option<Instant>,
}

impl Poller {
    fn new(budget: Duration, id: u64) -> Self {
        Poller {
            budget,
            id,
            armed: false,
            answered: None,
        }
    }

    /// This connection's thread answered a request itself.
    fn answered(&mut self) {
        if !self.budget.is_zero() {
            self.answered = Some(Instant::now());
        }
    }

    /// A request came in by the ordinary way: count it among the
    /// [`Pollers`] (unless polling is off), and arm when it came soon
    /// after the answer before.
    fn arrived(&mut self, pollers: &Pollers) {
        if self.budget.is_zero() {
            return;
        }
        pollers.arrival(self.id);
        if let Some(t) = self.answered.take() {
            self.armed = t.elapsed() < self.budget * 2;
        }
    }

    /// The next request's record, when it comes within the budget.
    fn next_record(&mut self, sock: &TcpStream, pollers: &Pollers) -> Option<Vec<u8>> {
        use std::os::fd::AsRawFd;
        if !self.armed || self.answered.is_none() {
            return None;
        }
        let _turn = pollers.enter(self.id)?;
        self.answered = None;
        let start = Instant::now();
        let fd = sock.as_raw_fd();
        let mut mark = [0u8; 4];
        let marked = spin_until(start + self.budget, || match peek(fd, &mut mark) {
            Ok(4) => Some(true),
            // Closed, or an error: the ordinary path reports it.
            Ok(0) | Err(_) => None,
            Ok(_) => Some(false),
        });
        match marked {
            Some(true) => {}
            Some(false) => {
                self.armed = false;
                pollers.missed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            None => return None,
        }
        let h = FragmentHeader::parse(mark);
        if !h.last || h.len > READ_BUFFER {
            return None;
        }
        let need = 4 + h.len;
        let mut there = 0;
        if spin_until(start + self.budget * 2, || {
            queued(fd).ok().map(|n| {
                there = n;
                n >= need
            })
        }) != Some(true)
        {
            return None;
        }
        if there > need {
            // More requests wait behind this one (a client with several
            // in flight): the ordinary path takes them all in one read,
            // where polling would take three calls for each.
            pollers.behind.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // The whole record is queued: take its mark and its body at once.
        let mut body = vec![0u8; h.len];
        let iov = [
            libc::iovec {
                iov_base: mark.as_mut_ptr().cast(),
                iov_len: 4,
            },
            libc::iovec {
                iov_base: body.as_mut_ptr().cast(),
                iov_len: h.len,
            },
        ];
        // SAFETY: two buffers of ours of their lengths, on a socket we own.
        let n = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
        if n != need as isize {
            // Only this thread reads the socket, so what was queued is
            // there; should that ever fail, the connection's stream is no
            // longer whole.
            tracing::warn!(n, need, "a polled record was not there; closing connection");
            // SAFETY: a socket we own.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            return None;
        }
        pollers.polled.fetch_add(1, Ordering::Relaxed);
        Some(body)
    }
}

/// Spins until `ready` says Some(true) (there) or None (never: closed,
/// or an error), or until `deadline`: then Some(false).
///
/// No yield: a client woken on this CPU by the answer before normally
/// preempts this thread at once; should it not, it waits out one budget,
/// its call then comes too late, and the miss stops the polling.
fn spin_until(deadline: Instant, mut ready: impl FnMut() -> Option<bool>) -> Option<bool> {
    loop {
        match ready() {
            Some(false) => {}
            done => return done,
        }
        if Instant::now() >= deadline {
            return Some(false);
        }
        std::hint::spin_loop();
    }
}

/// Bytes queued for reading on socket `fd` (FIONREAD), none copied.
fn queued(fd: std::os::fd::RawFd) -> std::io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Bytes queued on socket `fd`, copied into `buf` without taking them:
/// Ok(n) for n bytes (0 when the peer closed), Ok(usize::MAX) when none
/// are queued yet.
fn peek(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: a buffer of ours of its length.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n >= 0 {
        return Ok(n as usize);
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(usize::MAX),
        _ => Err(e),
    }
}

/// Starts the callbacks a request queued to follow its reply (a CB_NULL
/// probe after CREATE_SESSION), each on a thread that may wait.
fn start_callbacks(cb: &CbConn) {
    start_calls(cb.take_after_reply());
}

/// Starts callbacks taken from a connection, each on a thread that may
/// wait.
fn start_calls(calls: Vec<Box<dyn FnOnce() + Send>>) {
    for call in calls {
        drop(crate::tasks::blocking(call));
    }
}

/// Whether `buf` starts with a whole record of one fragment, which
/// the connection can take without waiting.
fn whole_record(buf: &[u8]) -> bool {
    let Some(mark) = buf.first_chunk::<4>() else {
        return false;
    };
    let h = FragmentHeader::parse(*mark);
    h.last && buf.len() - 4 >= h.len
}

/// Bytes read from a connection at a time when records are small.
const READ_BUFFER: usize = 64 * 1024;

/// Reads a fragment of `len` bytes into a buffer of its own, without
/// zeroing the buffer first: glibc zeroes a reused heap chunk, and doing
/// so for 1 MiB WRITE bodies before reading over them took 8% of the
/// server's CPU in a write stream (19% in one).
async fn read_body<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    len: usize,
) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::with_capacity(len);
    while body.len() < len {
        let left = (len - body.len()) as u64;
        if (&mut *rd).take(left).read_buf(&mut body).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    debug_assert_eq!(body.capacity(), len);
    Ok(body)
}

/// What a reply holds until it has been written: its part of the
/// connection's memory budget and its in-flight slot.
struct Held(
    #[allow(dead_code)] OwnedSemaphorePermit,
    #[allow(dead_code)] OwnedSemaphorePermit,
);

/// What a buffer of a reply is, for the way it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Memory of the server's own: copied into the socket.
    Own,
    /// File data lent from a mapping of the file (see [`Queued::settle`]).
    Lent,
    /// Data that the server's read cache serves again
    /// (`hugebuf::is_cached`): its pages go to the socket by reference,
    /// through the connection's pipe ([`Pipe`]), once `hugebuf::fix` has
    /// made sure that their memory is never written again; that is done
    /// right before, so that the region of data copied after all (no
    /// pipe, a failed `vmsplice`) is used again as ever.
    Fixed,
}

/// Buffers at least this long that are [`Kind::Fixed`] are handed to the
/// socket by reference; shorter ones are copied, which costs less than
/// the two extra system calls.
const SPLICE_MIN: usize = 64 * 1024;

impl Kind {
    /// The kind of a buffer of a reply; [`Kind::Fixed`] only `by_ref`.
    fn of(b: &Bytes, lent: bool, by_ref: bool) -> Kind {
        if lent {
            Kind::Lent
        } else if by_ref && b.len() >= SPLICE_MIN && crate::engine::hugebuf::is_cached(b) {
            Kind::Fixed
        } else {
            Kind::Own
        }
    }
}

/// A connection's pipe, through which [`Kind::Fixed`] data goes to the
/// socket without a copy: `vmsplice` puts references to its pages into
/// the pipe, `splice` moves them on into the socket, where they stay
/// until the client has read them (which is why only memory that is
/// never written again may go this way).
struct Pipe {
    r: std::os::fd::OwnedFd,
    w: std::os::fd::OwnedFd,
}

impl Pipe {
    /// A pipe that holds a whole 1 MiB READ's data (the default holds 64
    /// KiB: it still works, in more calls).
    fn new() -> std::io::Result<Pipe> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made and are owned here only.
        let (r, w) = unsafe {
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        // SAFETY: fcntl on the pipe just made.
        let size = unsafe {
            libc::fcntl(fds[1], libc::F_SETPIPE_SZ, PIPE_SIZE as libc::c_int);
            libc::fcntl(fds[1], libc::F_GETPIPE_SZ)
        };
        // A user past its pipe memory (pipe-user-pages-soft, which binds
        // all but root) gets pipes of two pages: moving 1 MiB through
        // such a pipe costs more calls than copying it.
        if size < SPLICE_MIN as libc::c_int {
            return Err(std::io::Error::other(format!(
                "the pipe holds {size} bytes, less than {SPLICE_MIN}"
            )));
        }
        Ok(Pipe { r, w })
    }

    /// Puts references to the pages of `b` (or its first part, as much
    /// as the empty pipe takes) into the pipe; the bytes taken.
    fn take(&self, b: &[u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let iov = libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        };
        // SAFETY: the iovec describes memory that lives (the caller holds
        // it) and that nothing writes any more (`Kind::Fixed`).
        let n = unsafe { libc::vmsplice(self.w.as_raw_fd(), &iov, 1, libc::SPLICE_F_NONBLOCK) };
        match n {
            n if n > 0 => Ok(n as usize),
            0 => Err(std::io::ErrorKind::WriteZero.into()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

/// The size asked for each connection's pipe.
const PIPE_SIZE: usize = 1 << 20;

/// Bytes of replies handed to sockets by reference (see [`Kind::Fixed`]).
static SPLICED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes of file data sent by reference so far, for the metrics.
pub fn spliced_bytes() -> u64 {
    SPLICED_BYTES.load(Ordering::Relaxed)
}

/// One reply waiting to be written: its buffers, the first of them
/// possibly partly written, each with its [`Kind`], and what it holds.
struct Queued {
    parts: std::collections::VecDeque<(Bytes, Kind)>,
    /// None for calls the server makes (callbacks).
    _held: Option<Held>,
}

#[derive(Default)]
struct Queue {
    /// Replies in order; only whole replies are ever written between
    /// one another.
    replies: std::collections::VecDeque<Queued>,
    /// The writer task owns the socket until the queue is empty.
    draining: bool,
    /// A write failed: further replies are dropped.
    failed: bool,
    /// No more replies will come; the writer task ends once done.
    closed: bool,
    /// The connection's pipe for [`Kind::Fixed`] data, made when first
    /// needed; `Err` once making one failed (such data is then copied).
    pipe: Option<Result<Pipe, ()>>,
    /// Bytes in the pipe not yet moved into the socket: they go before
    /// anything else.
    in_pipe: usize,
    /// Replies that carried lent file data wait (see [`Outbox::room`]).
    lent_waits: bool,
    /// Bytes of replies queued but not yet written, gathered by the
    /// connection's thread while more requests wait in its buffer (see
    /// [`Outbox::send_or_gather`]).
    gathered: usize,
}

impl Queue {
    /// The connection's pipe, made now if need be.
    fn pipe(&mut self) -> Option<&Pipe> {
        self.pipe
            .get_or_insert_with(|| {
                Pipe::new().map_err(|e| {
                    tracing::debug!(error = %e, "no pipe for this connection; cached data is copied");
                })
            })
            .as_ref()
            .ok()
    }
}

/// The sending side of a connection. Workers write replies themselves
/// while the socket takes them; the rest is queued for the connection's
/// writer task, which waits for room in the socket. Replies never
/// interleave: a worker writes only when nothing is queued, under the
/// queue's lock.
struct Outbox {
    wr: tokio::net::tcp::OwnedWriteHalf,
    queue: std::sync::Mutex<Queue>,
    wake: tokio::sync::Notify,
    /// Set while replies wait for room in the socket (the queue's
    /// `draining`, for readers outside its lock: READs lend no file data
    /// meanwhile, see `Server::may_lend`; see also [`Outbox::room`]).
    backlog: Arc<std::sync::atomic::AtomicBool>,
    /// Told when the queue has been written (or the connection broke, or
    /// a callback went out).
    drained: tokio::sync::Notify,
    /// Data of the read cache goes to the socket by reference
    /// ([`Kind::Fixed`]; see `server::ZeroCopy`).
    by_ref: bool,
    /// Where records sent and the writes that sent them are counted.
    metrics: Arc<crate::server::counters::Metrics>,
}

impl Outbox {
    fn new(wr: tokio::net::tcp::OwnedWriteHalf) -> Self {
        Outbox {
            wr,
            queue: Default::default(),
            wake: tokio::sync::Notify::new(),
            backlog: Default::default(),
            drained: tokio::sync::Notify::new(),
            by_ref: false,
            metrics: Default::default(),
        }
    }

    /// Counting records sent and writes in `metrics`.
    fn counting(mut self, metrics: Arc<crate::server::counters::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// With `by_ref`, data of the read cache goes to the socket by
    /// reference.
    fn zero_copy(mut self, by_ref: bool) -> Self {
        self.by_ref = by_ref;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self) -> bool {
        self.lock().failed
    }

    /// Returns once no reply that carried lent file data waits for room
    /// in the socket, or the connection is broken, or `answers_due` (a
    /// callback of the server's waits for the client's answer, which
    /// comes in behind the requests: a callback times out). The next
    /// request waits for this: its reply would only queue behind them,
    /// and a READ from the page cache taken now could not lend its data
    /// (see `Server::may_lend`) but would copy it twice. (The Linux
    /// server takes no request at all from a socket without room for its
    /// reply; replies of other data do not hold requests up here, so that
    /// the disk reads of a cold stream keep going while the client
    /// catches up.)
    async fn room(&self, answers_due: impl Fn() -> bool) {
        while self.backlog.load(Ordering::Acquire) {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            // Listening before looking again: a drain in between is not
            // missed.
            drained.as_mut().enable();
            if !self.backlog.load(Ordering::Acquire) {
                return;
            }
            {
                let q = self.lock();
                if q.failed || !q.lent_waits {
                    return;
                }
            }
            if answers_due() {
                return;
            }
            drained.await;
        }
    }

    /// Sends the reply a handler made, if any, keeping of the request's
    /// memory reservation only what the reply takes; a handler that
    /// panicked sends nothing.
    fn deliver(
        &self,
        reply: std::thread::Result<Option<Encoder>>,
        mem: OwnedSemaphorePermit,
        slot: OwnedSemaphorePermit,
    ) {
        self.deliver_or_gather(reply, mem, slot, false)
    }

    /// As [`Outbox::deliver`], but with `gather` a small reply of the
    /// server's own memory is only queued, to go out with the next ones
    /// (see [`Outbox::send_or_gather`]).
    fn deliver_or_gather(
        &self,
        reply: std::thread::Result<Option<Encoder>>,
        mut mem: OwnedSemaphorePermit,
        slot: OwnedSemaphorePermit,
        gather: bool,
    ) {
        match reply {
            Ok(Some(r)) => {
                // The record is gone; keep what the reply takes.
                shrink(&mut mem, r.len() + 4);
                self.send_or_gather(r, Some(Held(mem, slot)), gather);
            }
            Ok(None) => {}
            Err(_) => tracing::error!("request handler panicked; no reply sent"),
        }
    }

    /// Sends a call record of the server's (a callback); false when the
    /// connection is broken.
    fn send_call(&self, call: Encoder) -> bool {
        self.send(call, None);
        // A connection waiting for room takes the answer in.
        self.drained.notify_waiters();
        !self.failed()
    }

    /// Sends one reply record: at once if the socket takes it, else
    /// after the replies queued before it.
    fn send(&self, reply: Encoder, held: Option<Held>) {
        self.send_or_gather(reply, held, false)
    }

    /// As [`Outbox::send`]; but with `gather`, a reply that
    /// holds no file data only joins the queue while the gathered
    /// replies stay below [`GATHER_MAX`] bytes; the connection's thread
    /// writes them with [`Outbox::flush`] once no request waits in its
    /// buffer.
    fn send_or_gather(&self, reply: Encoder, held: Option<Held>, gather: bool) {
        let mut parts = std::collections::VecDeque::with_capacity(4);
        parts.push_back((
            Bytes::copy_from_slice(&rpc::record_mark(reply.len())),
            Kind::Own,
        ));
        parts.extend(reply.into_marked_parts().into_iter().map(|(b, lent)| {
            let kind = Kind::of(&b, lent, self.by_ref);
            (b, kind)
        }));
        let len: usize = parts.iter().map(|(b, _)| b.len()).sum();
        let own = parts.iter().all(|(_, kind)| *kind == Kind::Own);
        let mut reply = Queued { parts, _held: held };
        let mut q = self.lock();
        if q.failed {
            return;
        }
        self.metrics.records_sent.fetch_add(1, Ordering::Relaxed);
        if gather && own && !q.draining && q.in_pipe == 0 && q.gathered + len <= GATHER_MAX {
            q.gathered += len;
            q.replies.push_back(reply);
            return;
        }
        if q.draining {
            // The writer task owns the socket and will get to it, when
            // the client makes room.
            q.lent_waits |= reply.settle();
            q.replies.push_back(reply);
            return;
        }
        q.replies.push_back(reply);
        self.write_queued(&mut q);
    }

    /// Writes the replies gathered so far (see [`Outbox::send_or_gather`]).
    fn flush(&self) {
        self.flush_locked(&mut self.lock());
    }

    /// [`Outbox::flush`] with the queue's lock held.
    fn flush_locked(&self, q: &mut Queue) {
        if q.gathered > 0 && !q.failed && !q.draining {
            self.write_queued(q);
        }
    }

    /// Writes what is queued while the socket takes it; the rest goes to
    /// the writer task.
    fn write_queued(&self, q: &mut Queue) {
        match self.drain(q) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                q.draining = true;
                self.backlog
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let mut lent = false;
                for r in &mut q.replies {
                    lent |= r.settle();
                }
                q.lent_waits = lent;
                self.wake.notify_one();
            }
            Err(e) => self.fail(q, e),
        }
    }

    /// Writes queued replies, several per writev, until the queue is
    /// empty (Ok) or the socket is full (WouldBlock) or broken.
    /// [`Kind::Fixed`] data goes through the connection's pipe instead.
    fn drain(&self, q: &mut Queue) -> std::io::Result<()> {
        // Whatever was gathered goes now, or with the writer task.
        q.gathered = 0;
        loop {
            if q.in_pipe > 0 {
                let n = self.splice_out(q)?;
                q.in_pipe -= n;
                continue;
            }
            let Some(r) = q.replies.front() else {
                return Ok(());
            };
            let front = r.parts.front().expect("queued replies have parts");
            if front.1 == Kind::Fixed {
                let data = front.0.clone();
                let taken = match q.pipe() {
                    Some(p) if crate::engine::hugebuf::fix(&data) => Some(p.take(&data)),
                    _ => None,
                };
                match taken {
                    Some(Ok(n)) => {
                        q.in_pipe = n;
                        self.written(q, n);
                        continue;
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "vmsplice failed; cached data is copied");
                    }
                    None => {}
                }
                // Copied instead, like memory of the server's own.
                let r = q.replies.front_mut().expect("looked at above");
                r.parts.front_mut().expect("looked at above").1 = Kind::Own;
            }
            let n = {
                // Fixed data goes through the pipe unless there is none.
                let piped = !matches!(q.pipe, Some(Err(())));
                let mut slices: Vec<IoSlice<'_>> = Vec::new();
                let mut before_fixed = false;
                for (b, kind) in q.replies.iter().flat_map(|r| r.parts.iter()) {
                    if slices.len() == IOV_PER_WRITE {
                        break;
                    }
                    if *kind == Kind::Fixed && piped {
                        before_fixed = true;
                        break;
                    }
                    slices.push(IoSlice::new(b));
                }
                // Right before data that follows through the pipe: the
                // socket waits for it instead of sending the headers
                // alone (it follows at once, without the flag).
                self.write_parts(&slices, before_fixed)?
            };
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.metrics.record_writes.fetch_add(1, Ordering::Relaxed);
            self.written(q, n);
        }
    }

    /// Counts `n` bytes of the queued replies as written (or in the
    /// pipe), dropping the replies wholly written.
    fn written(&self, q: &mut Queue, n: usize) {
        let mut left = n;
        while left > 0 {
            let r = q.replies.front_mut().expect("written bytes were queued");
            left = advance(&mut r.parts, left);
            if r.parts.is_empty() {
                // Written: its memory and slot are free again.
                q.replies.pop_front();
            }
        }
    }

    /// One vectored write of `slices`; with `more`, telling the socket
    /// that more data follows at once (`MSG_MORE`).
    fn write_parts(&self, slices: &[IoSlice<'_>], more: bool) -> std::io::Result<usize> {
        if !more {
            return self.wr.try_write_vectored(slices);
        }
        use std::os::fd::AsRawFd;
        let sock = self.wr.as_ref();
        sock.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: a msghdr that points at the caller's live slices
            // (IoSlice is an iovec) and nothing else.
            let n = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = slices.len() as _;
                libc::sendmsg(
                    sock.as_raw_fd(),
                    &msg,
                    libc::MSG_MORE | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        })
    }

    /// Moves what the pipe holds on into the socket, as much as it
    /// takes; the bytes moved.
    fn splice_out(&self, q: &Queue) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let Some(Ok(pipe)) = &q.pipe else {
            unreachable!("bytes in a pipe that is not there");
        };
        let sock = self.wr.as_ref();
        // More follows at once (the rest of the reply, or the next): the
        // socket waits for it rather than send a short segment.
        let more = if q.replies.is_empty() {
            0
        } else {
            libc::SPLICE_F_MORE
        };
        let n = sock.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: splice between two descriptors this connection owns.
            let n = unsafe {
                libc::splice(
                    pipe.r.as_raw_fd(),
                    std::ptr::null_mut(),
                    sock.as_raw_fd(),
                    std::ptr::null_mut(),
                    q.in_pipe,
                    libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | more,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        })?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        SPLICED_BYTES.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// No more replies will be sent; the writer task ends once the queue
    /// is written.
    fn close(&self) {
        let mut q = self.lock();
        self.flush_locked(&mut q);
        q.closed = true;
        drop(q);
        self.wake.notify_one();
    }

    /// The writer task: writes queued replies as the socket makes room.
    async fn run(self: Arc<Self>) {
        loop {
            let (done, idle) = {
                let q = self.lock();
                // A reply whose last part is in the pipe has left the
                // queue: the pipe must be empty too.
                (
                    q.closed && q.replies.is_empty() && q.in_pipe == 0,
                    !q.draining,
                )
            };
            if done {
                return;
            }
            if idle {
                self.wake.notified().await;
                continue;
            }
            let ready = self.wr.writable().await;
            let mut q = self.lock();
            match ready.and_then(|()| self.drain(&mut q)) {
                Ok(()) => {
                    q.draining = false;
                    q.lent_waits = false;
                    self.backlog.store(false, Ordering::Release);
                    self.drained.notify_waiters();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => self.fail(&mut q, e),
            }
        }
    }

    /// The connection is broken: drops what is queued (giving back what
    /// it holds) and every later reply, and shuts the socket down, so
    /// that the reading side ends too and the client connects again.
    /// (A reply of file data that another process truncated away while it
    /// was lent fails to be written with EFAULT, after part of the record
    /// went out: the client must see the connection go.)
    fn fail(&self, q: &mut Queue, e: std::io::Error) {
        tracing::debug!(error = %e, "replies not sent; connection broken");
        q.failed = true;
        q.in_pipe = 0;
        q.draining = false;
        q.replies.clear();
        q.gathered = 0;
        q.lent_waits = false;
        self.drained.notify_waiters();
        let fd = std::os::fd::AsRawFd::as_raw_fd(self.wr.as_ref());
        // SAFETY: shutdown of the connection's own socket, still open.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }
}

impl Queued {
    /// Copies lent file data into memory of the server's own, letting go
    /// of its range lock: a reply that waits for the client to make room
    /// must not hold up the server's WRITEs to that range meanwhile.
    /// Whether it had any.
    fn settle(&mut self) -> bool {
        let mut any = false;
        for (b, kind) in &mut self.parts {
            if *kind == Kind::Lent {
                *b = crate::engine::mapped::settle(b);
                *kind = Kind::Own;
                any = true;
            }
        }
        any
    }
}

/// Drops `n` written bytes from the front of `parts` (or as many as it
/// holds); returns how many of the `n` were beyond its end.
fn advance(parts: &mut std::collections::VecDeque<(Bytes, Kind)>, mut n: usize) -> usize {
    while n > 0 {
        let Some((first, _)) = parts.front_mut() else {
            return n;
        };
        if n >= first.len() {
            n -= first.len();
            parts.pop_front();
        } else {
            let rest = first.slice(n..);
            *first = rest;
            n = 0;
        }
    }
    0
}

/// Takes from a connection's memory budget (`total` bytes in all) what a
/// request of `record` bytes may need: the record and the largest reply,
/// or the whole budget if that is less. Waits while the budget is spent;
/// None once the budget is closed.
async fn reserve(
    memory: &Arc<Semaphore>,
    total: usize,
    record: usize,
) -> Option<OwnedSemaphorePermit> {
    let need = reservation(total, record);
    memory
        .clone()
        .acquire_many_owned(u32::try_from(need).ok()?)
        .await
        .ok()
}

/// What [`reserve`] takes for a request of `record` bytes.
fn reservation(total: usize, record: usize) -> usize {
    (record + MAX_REPLY).min(total)
}

/// Gives back all of a reservation but `keep` bytes.
fn shrink(mem: &mut OwnedSemaphorePermit, keep: usize) {
    if keep < mem.num_permits() {
        drop(mem.split(mem.num_permits() - keep));
    }
}

/// Buffers handed to one writev call at most (below IOV_MAX).
const IOV_PER_WRITE: usize = 512;

/// Bytes of small replies the connection's thread gathers at most
/// before writing them (see [`Outbox::send_or_gather`]).
const GATHER_MAX: usize = 128 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_refuses_outside_addresses_and_unprivileged_ports() {
        let mut p = Policy::default();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        assert_eq!(p.refuse(peer), None);
        p.clients = vec![IpRange::parse("10.0.0.0/8").unwrap()];
        assert!(p.refuse(peer).is_some());
        p.clients.push(IpRange::parse("127.0.0.1").unwrap());
        assert_eq!(p.refuse(peer), None);
        p.require_privileged_port = true;
        assert!(p.refuse(peer).is_some());
        assert_eq!(p.refuse("127.0.0.1:800".parse().unwrap()), None);
    }

    /// The TCP congestion control algorithm of the socket `fd`.
    fn congestion(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<String> {
        use std::os::fd::AsRawFd;
        let mut name = [0u8; 16];
        let mut len = name.len() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `name`.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let name = &name[..(len as usize).min(name.len())];
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Ok(String::from_utf8_lossy(&name[..end]).into_owned())
    }

    #[test]
    fn accepted_connections_take_the_listener_s_congestion_control() {
        use std::os::fd::AsFd;
        let accepted_cc = |set: Option<&str>| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            if let Some(name) = set {
                set_congestion(l.as_fd(), name).unwrap();
            }
            let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            congestion(s.as_fd()).unwrap()
        };
        let default = accepted_cc(None);
        // One the kernel has that connections do not get by default, so
        // that the inheritance is what the test sees (reno is built in).
        let available = std::fs::read_to_string(CC_AVAILABLE).unwrap();
        let other = available
            .split_whitespace()
            .find(|&n| n != default)
            .unwrap_or("reno")
            .to_string();
        assert_eq!(accepted_cc(Some(&other)), other, "default {default}");
        check_congestion(&other).unwrap();
    }

    #[test]
    fn unknown_congestion_controls_are_refused_with_what_the_kernel_has() {
        let e = check_congestion("nonesuch").unwrap_err();
        assert!(e.contains("no TCP congestion control \"nonesuch\""), "{e}");
        assert!(e.contains("reno"), "{e}");
        for bad in ["", "two words", "a-name-far-too-long"] {
            let e = check_congestion(bad).unwrap_err();
            assert!(e.contains("is not a congestion control"), "{bad:?}: {e}");
        }
    }

    /// A connected (client, server) pair on loopback.
    async fn socket_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (client, (server, _)) =
            tokio::join!(async { TcpStream::connect(addr).await.unwrap() }, async {
                l.accept().await.unwrap()
            });
        (client, server)
    }

    fn get(stream: &TcpStream, level: i32, name: i32) -> i32 {
        use std::os::fd::AsRawFd;
        let mut v: i32 = 0;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: reads an int option of a socket we own.
        let r = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                level,
                name,
                (&mut v as *mut i32).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        v
    }

    #[tokio::test]
    async fn a_body_is_read_whole_across_pieces_and_no_further() {
        use tokio::io::AsyncWriteExt;
        let (mut client, server) = socket_pair().await;
        let mut rd = tokio::io::BufReader::with_capacity(16, server);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let w = crate::tasks::spawn(async move {
            for piece in sent.chunks(7_777) {
                client.write_all(piece).await.unwrap();
                client.flush().await.unwrap();
            }
            client.write_all(b"next").await.unwrap();
            client
        });
        let body = read_body(&mut rd, 150_000).await.unwrap();
        assert_eq!(body, data[..150_000]);
        assert_eq!(body.capacity(), 150_000, "the buffer grew past its length");
        let rest = read_body(&mut rd, 50_000).await.unwrap();
        assert_eq!(rest, data[150_000..]);
        let mut next = [0u8; 4];
        rd.read_exact(&mut next).await.unwrap();
        assert_eq!(&next, b"next", "the body read past its end");
        drop(w.await.unwrap());
        let e = read_body(&mut rd, 10).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn small_bodies_come_out_of_the_read_buffer_exactly() {
        // Small records arrive together and are read into the buffered
        // reader at once; each body takes its own bytes and no more.
        use tokio::io::AsyncWriteExt;
        let (mut client, server) = socket_pair().await;
        let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER, server);
        let bodies: Vec<Vec<u8>> = [100usize, 2000, 0, 5, 70_000]
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8 + 1; n])
            .collect();
        let mut wire = Vec::new();
        for b in &bodies {
            wire.extend((b.len() as u32).to_be_bytes());
            wire.extend(b);
        }
        client.write_all(&wire).await.unwrap();
        for b in &bodies {
            let mut mark = [0u8; 4];
            rd.read_exact(&mut mark).await.unwrap();
            let got = read_body(&mut rd, u32::from_be_bytes(mark) as usize)
                .await
                .unwrap();
            assert_eq!(&got, b);
        }
    }

    #[tokio::test]
    async fn connections_watch_for_vanished_peers() {
        let (_c, s) = socket_pair().await;
        assert_eq!(get(&s, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        watch_peer(&s).unwrap();
        assert_eq!(get(&s, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 60);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 15);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 4);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 300_000);
    }

    /// True when `fut` is not ready on its first poll.
    async fn pending<F: std::future::Future>(fut: F) -> bool {
        tokio::select! {
            biased;
            _ = fut => false,
            _ = std::future::ready(()) => true,
        }
    }

    #[tokio::test]
    async fn memory_budget_holds_requests_until_replies_shrink_or_go() {
        let total = 3 * MAX_REPLY;
        let memory = Arc::new(Semaphore::new(total));
        // Two requests of 1000 bytes fit; the third has to wait.
        let mut a = reserve(&memory, total, 1000).await.unwrap();
        let b = reserve(&memory, total, 1000).await.unwrap();
        assert_eq!(a.num_permits(), 1000 + MAX_REPLY);
        assert!(pending(reserve(&memory, total, 1000)).await);
        // A's reply turned out small: what it does not need is free again.
        shrink(&mut a, 100);
        assert_eq!(a.num_permits(), 100);
        let c = reserve(&memory, total, 1000).await.unwrap();
        assert!(pending(reserve(&memory, total, 1000)).await);
        // Written replies give everything back.
        drop((b, c));
        let d = reserve(&memory, total, 1000).await.unwrap();
        // A request larger than the whole budget waits for all of it,
        // and then runs instead of waiting forever.
        assert!(pending(reserve(&memory, total, 4 * MAX_REPLY)).await);
        drop((a, d));
        let big = reserve(&memory, total, 4 * MAX_REPLY).await.unwrap();
        assert_eq!(big.num_permits(), total);
        memory.close();
        drop(big);
        assert!(reserve(&memory, total, 1).await.is_none());
    }

    /// Replies sent from many threads at once, most of them while the
    /// peer is not reading (so the socket fills and the writer task
    /// takes over), arrive whole, each record uninterrupted, with their
    /// slots and memory given back once written. Lent data among them is
    /// copied while it waits, and the connection says it is backlogged
    /// until the queue is written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_from_many_workers_arrive_whole() {
        let (client, server) = socket_pair().await;
        let (_rd, wr) = server.into_split();
        let outbox = Arc::new(Outbox::new(wr));
        let writer = crate::tasks::spawn(outbox.clone().run());
        let settled = crate::engine::mapped::settled_bytes();
        const THREADS: usize = 8;
        const EACH: usize = 40;
        let slots = Arc::new(Semaphore::new(THREADS * EACH));
        let memory = Arc::new(Semaphore::new(THREADS * EACH));
        let mut senders = Vec::new();
        for t in 0..THREADS {
            let (outbox, slots, memory) = (outbox.clone(), slots.clone(), memory.clone());
            senders.push(std::thread::spawn(move || {
                for i in 0..EACH {
                    // Sizes from a few bytes to 300 KB, data spliced in.
                    let len = (t * 7919 + i * 104_729) % 300_000 + 4;
                    let mut e = Encoder::new();
                    e.u32((t * EACH + i) as u32);
                    let data = Bytes::from(vec![(t * EACH + i) as u8; len]);
                    if i % 2 == 0 {
                        e.opaque_lent(data);
                    } else {
                        e.opaque_shared(data);
                    }
                    let held = Held(
                        memory.clone().try_acquire_owned().unwrap(),
                        slots.clone().try_acquire_owned().unwrap(),
                    );
                    outbox.send(e, Some(held));
                }
            }));
        }
        for s in senders {
            s.join().unwrap();
        }
        // Now read everything: the queue was left for the writer task.
        assert!(outbox.backlog.load(std::sync::atomic::Ordering::Relaxed));
        assert!(
            crate::engine::mapped::settled_bytes() > settled,
            "no lent data was copied"
        );
        let mut seen = vec![false; THREADS * EACH];
        let mut rd = client;
        for _ in 0..THREADS * EACH {
            let (body, id, len) = next_reply(&mut rd).await;
            assert!(!seen[id], "reply {id} twice");
            seen[id] = true;
            assert_eq!(
                body.len(),
                8 + len.div_ceil(4) * 4,
                "reply {id} framed wrongly"
            );
            assert!(
                body[8..8 + len].iter().all(|&b| b == id as u8),
                "reply {id} mixed with another"
            );
        }
        outbox.close();
        writer.await.unwrap();
        assert!(!outbox.backlog.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(slots.available_permits(), THREADS * EACH);
        assert_eq!(memory.available_permits(), THREADS * EACH);
        assert!(!outbox.failed());
    }

    /// The next record from `rd` (one fragment), with the reply number and
    /// the data length of the test replies that start it.
    async fn next_reply(rd: &mut TcpStream) -> (Vec<u8>, usize, usize) {
        let mut mark = [0u8; 4];
        rd.read_exact(&mut mark).await.unwrap();
        let h = FragmentHeader::parse(mark);
        assert!(h.last);
        let mut body = vec![0u8; h.len];
        rd.read_exact(&mut body).await.unwrap();
        let id = u32::from_be_bytes(body[0..4].try_into().unwrap()) as usize;
        let len = u32::from_be_bytes(body[4..8].try_into().unwrap()) as usize;
        (body, id, len)
    }

    /// Data of the read cache goes to the socket by reference, through
    /// the connection's pipe, and arrives whole and in order between the
    /// bytes around it and the replies around it, also when the socket
    /// is full and the writer task moves what the pipe holds later.
    #[tokio::test]
    async fn cached_data_sent_by_reference_arrives_whole() {
        let (client, server) = socket_pair().await;
        let (_rd, wr) = server.into_split();
        let outbox = Arc::new(Outbox::new(wr).zero_copy(true));
        let writer = crate::tasks::spawn(outbox.clone().run());
        let spliced = spliced_bytes();
        const THREADS: usize = 4;
        const EACH: usize = 24;
        let mut fixed_total = 0;
        let mut replies = Vec::new();
        for t in 0..THREADS {
            let mut mine = Vec::new();
            for i in 0..EACH {
                let id = t * EACH + i;
                // 1 byte to 1 MiB; every other reply in a fixed region.
                let len = (id * 104_729) % (1 << 20) + 1;
                let fixed = id.is_multiple_of(2);
                let data = if fixed {
                    let mut b = crate::engine::hugebuf::Buf::new(len).unwrap();
                    // SAFETY: within the buffer's capacity.
                    unsafe { std::ptr::write_bytes(b.as_mut_ptr(), id as u8, len) };
                    let data = b.freeze(len);
                    crate::engine::hugebuf::cached(&data);
                    if len >= SPLICE_MIN {
                        fixed_total += len;
                    }
                    data
                } else {
                    Bytes::from(vec![id as u8; len])
                };
                mine.push((id, data));
            }
            replies.push(mine);
        }
        let slots = Arc::new(Semaphore::new(THREADS * EACH));
        let memory = Arc::new(Semaphore::new(THREADS * EACH));
        let senders: Vec<_> = replies
            .into_iter()
            .map(|mine| {
                let (outbox, slots, memory) = (outbox.clone(), slots.clone(), memory.clone());
                std::thread::spawn(move || {
                    for (id, data) in mine {
                        let mut e = Encoder::new();
                        e.u32(id as u32);
                        e.opaque_shared(data);
                        e.u32(!(id as u32));
                        let held = Held(
                            memory.clone().try_acquire_owned().unwrap(),
                            slots.clone().try_acquire_owned().unwrap(),
                        );
                        outbox.send(e, Some(held));
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
        // The client has read nothing: the socket is full, replies wait.
        assert!(outbox.backlog.load(std::sync::atomic::Ordering::Relaxed));
        let mut seen = [false; THREADS * EACH];
        let mut rd = client;
        for _ in 0..THREADS * EACH {
            let (body, id, len) = next_reply(&mut rd).await;
            assert!(!seen[id], "reply {id} twice");
            seen[id] = true;
            let padded = len.div_ceil(4) * 4;
            assert_eq!(body.len(), 12 + padded, "reply {id} framed wrongly");
            assert!(
                body[8..8 + len].iter().all(|&b| b == id as u8),
                "reply {id} mixed with another"
            );
            let tail = u32::from_be_bytes(body[8 + padded..].try_into().unwrap());
            assert_eq!(tail, !(id as u32), "reply {id}: bytes after its data");
        }
        assert!(
            spliced_bytes() >= spliced + fixed_total as u64,
            "cached data was copied, not sent by reference"
        );
        outbox.close();
        writer.await.unwrap();
        assert_eq!(slots.available_permits(), THREADS * EACH);
        assert!(!outbox.failed());
    }

    #[test]
    fn zero_copy_goes_to_clients_on_other_machines_by_default() {
        use crate::server::ZeroCopy;
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let here = ip("192.0.2.2");
        for local in [
            "127.0.0.1",
            "::1",
            "::ffff:127.0.0.1",
            "192.0.2.2",
            "::ffff:192.0.2.2",
        ] {
            assert!(
                !ZeroCopy::Remote.applies(ip(local), here),
                "{local} taken for remote"
            );
            assert!(ZeroCopy::Always.applies(ip(local), here));
        }
        for remote in ["192.0.2.7", "2001:db8::7", "::ffff:10.1.2.3"] {
            assert!(
                ZeroCopy::Remote.applies(ip(remote), here),
                "{remote} taken for local"
            );
            assert!(!ZeroCopy::Never.applies(ip(remote), here));
        }
        assert_eq!("remote".parse::<ZeroCopy>(), Ok(ZeroCopy::Remote));
        assert!("sometimes"
            .parse::<ZeroCopy>()
            .unwrap_err()
            .contains("\"never\""));
    }

    /// A peer that has gone makes sends fail quietly: replies are
    /// dropped with what they hold, and the writer task ends.
    #[tokio::test]
    async fn replies_to_a_closed_peer_are_dropped() {
        let (client, server) = socket_pair().await;
        drop(client);
        let (_rd, wr) = server.into_split();
        let outbox = Arc::new(Outbox::new(wr));
        let writer = crate::tasks::spawn(outbox.clone().run());
        let slots = Arc::new(Semaphore::new(1000));
        let memory = Arc::new(Semaphore::new(1000));
        let mut n = 0;
        while !outbox.failed() {
            n += 1;
            assert!(n < 1000, "writes to a closed peer kept succeeding");
            let mut e = Encoder::new();
            e.opaque_shared(Bytes::from(vec![1u8; 200_000]));
            let held = Held(
                memory.clone().try_acquire_owned().unwrap(),
                slots.clone().try_acquire_owned().unwrap(),
            );
            outbox.send(e, Some(held));
            tokio::task::yield_now().await;
        }
        outbox.close();
        writer.await.unwrap();
        assert_eq!(slots.available_permits(), 1000);
        assert_eq!(memory.available_permits(), 1000);
    }

    /// A buffer of `len` bytes filled with `byte`, in a region the read
    /// cache has marked as served again.
    fn cached_buffer(len: usize, byte: u8) -> Bytes {
        let mut b = crate::engine::hugebuf::Buf::new(len).unwrap();
        // SAFETY: within the buffer's capacity.
        unsafe { std::ptr::write_bytes(b.as_mut_ptr(), byte, len) };
        let data = b.freeze(len);
        crate::engine::hugebuf::cached(&data);
        data
    }

    /// A reply whose data is the last of it and is still in the pipe
    /// when the connection closes (small socket buffers, a client that
    /// reads late) has left the queue, and given back its slot; the
    /// writer task still moves it on before it ends, so the client gets
    /// the whole record.
    #[tokio::test]
    async fn data_in_the_pipe_goes_out_before_the_connection_closes() {
        let (client, server) = socket_pair().await;
        let small = |s: &TcpStream, name: i32| {
            use std::os::fd::AsRawFd;
            let v: libc::c_int = 32 * 1024;
            // SAFETY: setsockopt of an int on a live socket.
            let r = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    name,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0);
        };
        small(&server, libc::SO_SNDBUF);
        small(&client, libc::SO_RCVBUF);
        let (_rd, wr) = server.into_split();
        let outbox = Arc::new(Outbox::new(wr).zero_copy(true));
        let writer = crate::tasks::spawn(outbox.clone().run());
        const LEN: usize = 1 << 20;
        let mut e = Encoder::new();
        e.u32(7);
        // An NFSv3 READ's shape: the data ends the record.
        e.opaque_shared(cached_buffer(LEN, 9));
        let slots = Arc::new(Semaphore::new(1));
        let memory = Arc::new(Semaphore::new(1));
        let held = Held(
            memory.clone().try_acquire_owned().unwrap(),
            slots.clone().try_acquire_owned().unwrap(),
        );
        outbox.send(e, Some(held));
        assert!(outbox.lock().in_pipe > 0, "nothing was left in the pipe");
        // The connection waits for its slots, then closes.
        assert_eq!(slots.available_permits(), 1);
        outbox.close();
        let mut rd = client;
        let (body, id, len) = tokio::time::timeout(Duration::from_secs(30), next_reply(&mut rd))
            .await
            .expect("the rest of the reply never came");
        assert_eq!((id, len, body.len()), (7, LEN, 8 + LEN));
        assert!(body[8..].iter().all(|&b| b == 9));
        writer.await.unwrap();
        assert_eq!(outbox.lock().in_pipe, 0);
    }

    /// Cached data that a connection meant to send by reference but
    /// copied (it has no usable pipe) leaves its region as it was, to be
    /// used again for new data, and counts as nothing spliced.
    #[tokio::test]
    async fn cached_data_copied_after_all_leaves_its_region_free() {
        let (client, server) = socket_pair().await;
        let (_rd, wr) = server.into_split();
        let outbox = Arc::new(Outbox::new(wr).zero_copy(true));
        // As when making the pipe failed, or it held too little.
        outbox.lock().pipe = Some(Err(()));
        let writer = crate::tasks::spawn(outbox.clone().run());
        // A region of its own: marks are the region's, and other tests
        // fix theirs meanwhile.
        const LEN: usize = crate::engine::hugebuf::REGION;
        let data = cached_buffer(LEN, 3);
        let mut e = Encoder::new();
        e.u32(1);
        e.opaque_shared(data.clone());
        outbox.send(e, None);
        let mut rd = client;
        let (body, id, len) = next_reply(&mut rd).await;
        assert_eq!((id, len, body.len()), (1, LEN, 8 + LEN));
        assert!(body[8..].iter().all(|&b| b == 3));
        assert!(
            !crate::engine::hugebuf::is_fixed(&data),
            "a region whose data was only copied was kept from being used again"
        );
        // Through a pipe, the same data is fixed.
        let (client, server) = socket_pair().await;
        let (_rd, wr) = server.into_split();
        let piped = Arc::new(Outbox::new(wr).zero_copy(true));
        let piped_writer = crate::tasks::spawn(piped.clone().run());
        let mut e = Encoder::new();
        e.u32(2);
        e.opaque_shared(data.clone());
        piped.send(e, None);
        let mut rd = client;
        assert_eq!(next_reply(&mut rd).await.1, 2);
        assert!(crate::engine::hugebuf::is_fixed(&data));
        for (o, w) in [(outbox, writer), (piped, piped_writer)] {
            o.close();
            w.await.unwrap();
        }
    }

    /// The connection takes its next request only when no reply of lent
    /// data waits for room in the socket (`Outbox::room`): at once while
    /// replies go straight out, not while lent ones wait, then as soon as
    /// the client has read enough for the last of them to be written;
    /// at once while only replies of other data wait; and at once when
    /// the connection breaks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_wait_while_replies_of_lent_data_wait_for_room() {
        let (mut client, server) = socket_pair().await;
        let (_rd, wr) = server.into_split();
        let outbox = Arc::new(Outbox::new(wr));
        let writer = crate::tasks::spawn(outbox.clone().run());
        let none = || false;
        assert!(
            !pending(outbox.room(none)).await,
            "waited with nothing queued"
        );
        const LEN: usize = 256 << 10;
        // Replies until `after` of them wait (the socket is full).
        let fill = |outbox: &Outbox, from: usize, after: usize, lent: bool| {
            let mut n = from;
            while outbox.lock().replies.len() < after {
                assert!(n < from + 1000, "a socket nobody reads never filled");
                let mut e = Encoder::new();
                e.u32(n as u32);
                let data = Bytes::from(vec![n as u8; LEN]);
                if lent {
                    e.opaque_lent(data);
                } else {
                    e.opaque_shared(data);
                }
                outbox.send(e, None);
                n += 1;
            }
            n
        };
        let room = |outbox: &Arc<Outbox>, due: Arc<std::sync::atomic::AtomicBool>| {
            let outbox = outbox.clone();
            crate::tasks::spawn(async move { outbox.room(|| due.load(Ordering::Acquire)).await })
        };
        let not_due = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Replies from..upto, each whole.
        async fn read(client: &mut TcpStream, from: usize, upto: usize) {
            for i in from..upto {
                let (body, id, len) = next_reply(client).await;
                assert_eq!((id, len), (i, LEN));
                assert!(body[8..].iter().all(|&b| b == i as u8), "reply {i}");
            }
        }
        let sent = fill(&outbox, 0, 16, true);
        assert!(
            pending(outbox.room(none)).await,
            "did not wait for lent replies"
        );
        let waiting = room(&outbox, not_due.clone());
        // Every reply but the last read: the last one is still queued or
        // on its way, and the task may not go on before it is written.
        read(&mut client, 0, sent - 1).await;
        tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("the queue was written, yet the next request still waited")
            .unwrap();
        assert!(!outbox.backlog.load(Ordering::Acquire));
        read(&mut client, sent - 1, sent).await;
        // Replies of the server's own data wait: requests do not.
        let sent = fill(&outbox, sent, 16, false);
        assert!(outbox.backlog.load(Ordering::Acquire));
        assert!(
            !pending(outbox.room(none)).await,
            "waited for replies of no lent data"
        );
        // A lent one among them: they do.
        fill(&outbox, sent, 17, true);
        assert!(
            pending(outbox.room(none)).await,
            "did not wait for a lent reply"
        );
        // Not while a callback waits for its answer, which the client
        // sends behind its requests: a waiting connection goes on once
        // the call is out.
        let due = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiting = room(&outbox, due.clone());
        due.store(true, Ordering::Release);
        let mut call = Encoder::new();
        call.u32(0);
        assert!(outbox.send_call(call));
        tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("a callback's answer waited behind a held request")
            .unwrap();
        let waiting = room(&outbox, not_due);
        drop(client);
        tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("a broken connection still held its next request")
            .unwrap();
        assert!(outbox.failed());
        outbox.close();
        writer.await.unwrap();
    }

    #[test]
    fn advance_drops_written_bytes() {
        let mut parts: std::collections::VecDeque<(Bytes, Kind)> = [&b"abc"[..], b"de", b"fghij"]
            .into_iter()
            .map(|b| (Bytes::from_static(b), Kind::Own))
            .collect();
        let bytes = |p: &std::collections::VecDeque<(Bytes, Kind)>| {
            p.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>()
        };
        assert_eq!(advance(&mut parts, 4), 0);
        assert_eq!(bytes(&parts), [&b"e"[..], b"fghij"]);
        assert_eq!(advance(&mut parts, 3), 0);
        assert_eq!(bytes(&parts), [&b"hij"[..]]);
        assert_eq!(advance(&mut parts, 5), 2);
        assert!(parts.is_empty());
    }

    #[test]
    fn only_a_connection_alone_polls_and_a_cpu_is_left_over() {
        let p = Pollers::new(2);
        let (a, b) = (p.conn_id(), p.conn_id());
        assert_ne!(a, b);
        assert!(p.enter(a).is_none(), "polled before any request");
        // The first request starts a run; ALONE more make it long enough.
        for _ in 0..ALONE {
            p.arrival(a);
        }
        assert!(p.enter(a).is_none(), "polled after {} requests", ALONE);
        p.arrival(a);
        assert!(
            p.enter(b).is_none(),
            "a connection that brought nothing polled"
        );
        let turn = p.enter(a).expect("alone for long enough, and a CPU free");
        // Two CPUs: one poller at most.
        assert!(p.enter(a).is_none(), "a second poller on two CPUs");
        drop(turn);
        assert!(p.enter(a).is_some());
        // Another client's request ends the run, for both.
        p.arrival(b);
        assert!(p.enter(a).is_none());
        assert!(p.enter(b).is_none());
        for _ in 0..=ALONE {
            p.arrival(b);
        }
        assert!(p.enter(b).is_some());
        assert!(p.enter(a).is_none());
        // One CPU: never, since the client could not run meanwhile.
        let one = Pollers::new(1);
        let c = one.conn_id();
        for _ in 0..=2 * ALONE {
            one.arrival(c);
        }
        assert!(one.enter(c).is_none());
    }

    /// A NULL call to NFS (program 100003, version `vers`), record mark
    /// included.
    fn null_call(xid: u32, vers: u32) -> Vec<u8> {
        let mut r = Vec::new();
        for w in [0x8000_0028, xid, 0, 2, 100_003, vers, 0, 0, 0, 0, 0] {
            r.extend(u32::to_be_bytes(w));
        }
        r
    }

    /// Reads one reply record and checks that it accepts call `xid`.
    fn read_reply(c: &mut std::net::TcpStream, xid: u32) {
        use std::io::Read;
        let mut mark = [0u8; 4];
        c.read_exact(&mut mark).unwrap();
        let h = FragmentHeader::parse(mark);
        assert!(h.last && h.len >= 24, "reply to {xid}: {h:?}");
        let mut body = vec![0u8; h.len];
        c.read_exact(&mut body).unwrap();
        let word = |i: usize| u32::from_be_bytes(body[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(word(0), xid, "a reply out of order");
        assert_eq!((word(1), word(2)), (1, 0), "not an accepted reply");
        // SUCCESS, or GARBAGE_ARGS for a call with more than it takes.
        assert!(
            matches!(word(5), 0 | 4),
            "reply to {xid}: accept_stat {}",
            word(5)
        );
    }

    /// A server on loopback that polls for `busy_poll`, and its address.
    async fn serving(busy_poll: Duration) -> (Arc<Server>, SocketAddr) {
        let config = crate::server::Config {
            busy_poll,
            ..Default::default()
        };
        let srv = Server::scratch("poll", config);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        crate::tasks::spawn(serve_with(
            l,
            srv.clone(),
            Policy::default(),
            Arc::default(),
        ));
        (srv, addr)
    }

    /// One client sending a call at a time, each as soon as it has the
    /// answer to the one before: after a run of requests its next ones
    /// are polled for, and every answer is right; with no budget, none
    /// is polled for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_client_s_calls_are_polled_for_and_answered() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for budget in [Duration::from_millis(2), Duration::ZERO] {
            let (srv, addr) = serving(budget).await;
            crate::tasks::blocking(move || {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.set_nodelay(true).unwrap();
                for xid in 1..=1000u32 {
                    std::io::Write::write_all(&mut c, &null_call(xid, 4)).unwrap();
                    read_reply(&mut c, xid);
                }
            })
            .await
            .unwrap();
            let polled = srv.pollers.polled.load(Ordering::Relaxed);
            if budget.is_zero() || cpus < 2 {
                assert_eq!(
                    polled, 0,
                    "polled with a budget of {budget:?} on {cpus} CPUs"
                );
                assert_eq!(srv.pollers.missed.load(Ordering::Relaxed), 0);
            } else {
                // Only a client that took longer than the budget to send
                // its next call (a CPU taken away) is not polled for.
                assert!(polled > 0, "none of 1,000 calls in a row was polled for");
            }
        }
    }

    /// `rounds` batches of `batch` NFSv3 NULL calls, each sent in one
    /// write once the batch before is answered; every answer checked.
    fn in_batches(c: &mut std::net::TcpStream, rounds: u32, batch: u32) {
        for round in 0..rounds {
            let first = round * batch + 1;
            let calls: Vec<u8> = (first..first + batch)
                .flat_map(|x| null_call(x, 3))
                .collect();
            std::io::Write::write_all(c, &calls).unwrap();
            for xid in first..first + batch {
                read_reply(c, xid);
            }
        }
    }

    /// A client with several calls in flight: after each batch is
    /// answered the next one is queued whole, and polling leaves it to
    /// the ordinary read, which takes the batch at once, instead of
    /// taking its calls one by one (three system calls each); every
    /// answer comes, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_queued_behind_one_another_are_read_together() {
        const BATCH: u32 = 8;
        const ROUNDS: u32 = 200;
        let (srv, addr) = serving(Duration::from_millis(2)).await;
        crate::tasks::blocking(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_nodelay(true).unwrap();
            in_batches(&mut c, ROUNDS, BATCH);
        })
        .await
        .unwrap();
        let polled = srv.pollers.polled.load(Ordering::Relaxed);
        let behind = srv.pollers.behind.load(Ordering::Relaxed);
        // Taking every call of a batch by polling polls 7 of each 8.
        assert!(
            polled < u64::from(ROUNDS),
            "{polled} of {} calls taken one by one by polling ({behind} batches left to the read)",
            ROUNDS * BATCH
        );
        if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
            assert!(
                behind > 0,
                "no poll found a batch waiting ({polled} calls polled)"
            );
        }
    }

    /// Calls that arrive together are answered together: the replies
    /// the connection's thread makes while more calls wait in its
    /// buffer are gathered into one write, every answer comes in
    /// order, and a lone call is answered at once (the client waits for
    /// it before sending the next).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_to_calls_that_came_together_go_out_together() {
        const BATCH: u32 = 8;
        const ROUNDS: u32 = 100;
        let (srv, addr) = serving(Duration::ZERO).await;
        let client = crate::tasks::blocking(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_nodelay(true).unwrap();
            in_batches(&mut c, ROUNDS, BATCH);
            let last = ROUNDS * BATCH + 1;
            std::io::Write::write_all(&mut c, &null_call(last, 3)).unwrap();
            read_reply(&mut c, last);
            // A batch followed by the start of a call whose rest the
            // client sends only once it has the batch's answers: they
            // must not wait for it.
            let first = last + 1;
            let mut calls: Vec<u8> = (first..first + BATCH)
                .flat_map(|x| null_call(x, 3))
                .collect();
            let next = null_call(first + BATCH, 3);
            calls.extend(&next[..10]);
            std::io::Write::write_all(&mut c, &calls).unwrap();
            for xid in first..first + BATCH {
                read_reply(&mut c, xid);
            }
            std::io::Write::write_all(&mut c, &next[10..]).unwrap();
            read_reply(&mut c, first + BATCH);
        });
        tokio::time::timeout(Duration::from_secs(30), client)
            .await
            .expect("replies held back behind a call that had not come whole")
            .unwrap();
        let m = &srv.metrics;
        let sent = m.records_sent.load(Ordering::Relaxed);
        let writes = m.record_writes.load(Ordering::Relaxed);
        assert_eq!(sent, u64::from((ROUNDS + 1) * BATCH + 2));
        // One write per batch that arrived whole; a batch split by TCP
        // takes one per piece.
        assert!(
            writes <= sent / 2,
            "{writes} writes for {sent} replies to batches of {BATCH}"
        );
    }

    /// Records that polling does not take whole (one arriving in pieces,
    /// one in two fragments, one larger than the read buffer) are read
    /// the ordinary way, in order, and the connection goes on; a client
    /// that closes while the server polls is let go, and others served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_polling_leaves_are_read_in_order() {
        let (srv, addr) = serving(Duration::from_millis(2)).await;
        crate::tasks::blocking(move || {
            use std::io::Write;
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_nodelay(true).unwrap();
            let mut xid = 0;
            let mut calls = |c: &mut std::net::TcpStream, n: u32| {
                for _ in 0..n {
                    xid += 1;
                    c.write_all(&null_call(xid, 4)).unwrap();
                    read_reply(c, xid);
                }
                xid
            };
            calls(&mut c, 2 * ALONE as u32);
            // In pieces, the second after more than the budget twice.
            let x = calls(&mut c, 1) + 1;
            let call = null_call(x, 4);
            c.write_all(&call[..14]).unwrap();
            std::thread::sleep(Duration::from_millis(10));
            c.write_all(&call[14..]).unwrap();
            read_reply(&mut c, x);
            // Two fragments: the first not the last.
            calls(&mut c, 20);
            let x = calls(&mut c, 1) + 2;
            let call = null_call(x, 4);
            let mut two = Vec::new();
            two.extend(u32::to_be_bytes(16));
            two.extend(&call[4..20]);
            two.extend(u32::to_be_bytes(0x8000_0000 | (call.len() as u32 - 20)));
            two.extend(&call[20..]);
            c.write_all(&two).unwrap();
            read_reply(&mut c, x);
            // Larger than the read buffer: a call with more than it takes.
            let x = calls(&mut c, 20) + 1;
            let mut big = null_call(x, 4);
            big.extend(vec![0u8; 2 * READ_BUFFER]);
            let len = big.len() as u32 - 4;
            big[..4].copy_from_slice(&(0x8000_0000 | len).to_be_bytes());
            c.write_all(&big).unwrap();
            read_reply(&mut c, x);
            let x = calls(&mut c, 20);
            // Everything in order, and the next calls still answered.
            assert!(x > 2 * ALONE as u32 + 60);
            drop(c);
            let mut d = std::net::TcpStream::connect(addr).unwrap();
            d.write_all(&null_call(7, 4)).unwrap();
            read_reply(&mut d, 7);
        })
        .await
        .unwrap();
        if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
            assert!(srv.pollers.polled.load(Ordering::Relaxed) > 0);
        }
    }
}
