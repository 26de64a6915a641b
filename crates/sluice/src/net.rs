//! TCP transport: accepts connections, reassembles records, runs each
//! request on a blocking worker and writes replies as they complete.
//!
//! Replies go out with vectored writes: file data read for READ and
//! READ_PLUS stays in the buffer it was read into and is handed to the
//! socket as it is, next to the small encoded headers.

use crate::config::IpRange;
use crate::rpc::{self, FragmentHeader, RecordAssembler};
use crate::server::Server;
use crate::xdr::Encoder;
use bytes::Bytes;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

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
        if !crate::config::admitted(&self.clients, peer.ip()) {
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

/// Counts requests being processed, so shutdown can wait for them.
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
                tokio::spawn(async move {
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

/// Serves one connection: reads records, runs each request on a blocking
/// worker, writes the replies as they complete.
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
    // Exports check the address on every use; an unknown one (the socket
    // already broken) is admitted only where everyone is.
    let ip = Some(peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |p| p.ip()));
    let (mut rd, wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<(Encoder, OwnedSemaphorePermit)>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        let mut w = wr;
        let mut parts: Vec<Bytes> = Vec::new();
        let mut held: Vec<OwnedSemaphorePermit> = Vec::new();
        while let Some((reply, mem)) = rx.recv().await {
            // Send every reply that is ready in one go.
            push_record(&mut parts, reply);
            held.push(mem);
            while parts.len() < BATCH_PARTS {
                match rx.try_recv() {
                    Ok((r, m)) => {
                        push_record(&mut parts, r);
                        held.push(m);
                    }
                    Err(_) => break,
                }
            }
            write_parts(&mut w, &mut parts).await?;
            // Written: their memory is free for further requests.
            held.clear();
        }
        w.flush().await?;
        Ok::<(), std::io::Error>(())
    });
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let memory = Arc::new(Semaphore::new(CONN_MEMORY));
    let mut asm = RecordAssembler::new(MAX_RECORD);
    let mut partial = false;
    let result = loop {
        let mut mark = [0u8; 4];
        if let Err(e) = rd.read_exact(&mut mark).await {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(())
            } else {
                Err(e)
            };
        }
        let h = FragmentHeader::parse(mark);
        if asm.admit(h).is_err() {
            tracing::warn!(?peer, len = h.len, "record too large; closing connection");
            break Ok(());
        }
        let mut body = vec![0; h.len];
        rd.read_exact(&mut body).await?;
        let record = if h.last && !partial {
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
        };
        // While the connection's budget is spent, no more requests are read.
        let Some(mem) = reserve(&memory, CONN_MEMORY, record.len()).await else {
            break Ok(());
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break Ok(());
        };
        let srv = srv.clone();
        let tx = tx.clone();
        let busy = inflight.enter();
        tokio::spawn(async move {
            let reply = tokio::task::spawn_blocking(move || srv.handle_call(&record, ip)).await;
            match reply {
                Ok(Some(r)) => {
                    // The record is gone; keep what the reply takes.
                    let mut mem = mem;
                    shrink(&mut mem, r.len() + 4);
                    let _ = tx.send((r, mem)).await;
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "request handler failed"),
            }
            drop(busy);
            drop(permit);
        });
    };
    drop(tx);
    let _ = writer.await;
    result
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
    let need = (record + MAX_REPLY).min(total);
    memory
        .clone()
        .acquire_many_owned(u32::try_from(need).ok()?)
        .await
        .ok()
}

/// Gives back all of a reservation but `keep` bytes.
fn shrink(mem: &mut OwnedSemaphorePermit, keep: usize) {
    if keep < mem.num_permits() {
        drop(mem.split(mem.num_permits() - keep));
    }
}

/// Buffers gathered for one batch of replies at most.
const BATCH_PARTS: usize = 256;
/// Buffers handed to one writev call at most (below IOV_MAX).
const IOV_PER_WRITE: usize = 512;

/// Appends one reply record (record mark, then its parts) to `parts`.
fn push_record(parts: &mut Vec<Bytes>, reply: Encoder) {
    parts.push(Bytes::copy_from_slice(&rpc::record_mark(reply.len())));
    parts.extend(reply.into_parts());
}

/// Writes all of `parts` with vectored writes and empties it.
async fn write_parts<W: AsyncWrite + Unpin>(
    w: &mut W,
    parts: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let n = {
            let slices: Vec<IoSlice<'_>> = parts[first..]
                .iter()
                .take(IOV_PER_WRITE)
                .map(|b| IoSlice::new(b))
                .collect();
            w.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        // Drop what went out; keep the rest of a partly written buffer.
        let mut left = n;
        while left > 0 {
            let len = parts[first].len();
            if left >= len {
                left -= len;
                first += 1;
            } else {
                let rest = parts[first].slice(left..);
                parts[first] = rest;
                left = 0;
            }
        }
    }
    parts.clear();
    Ok(())
}

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

    /// A sink that takes at most a few bytes per write, to exercise the
    /// partial-write path.
    struct Trickle(Vec<u8>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(7);
            self.0.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
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
    async fn connections_watch_for_vanished_peers() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (_c, (s, _)) = tokio::join!(async { TcpStream::connect(addr).await.unwrap() }, async {
            l.accept().await.unwrap()
        });
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

    #[tokio::test]
    async fn records_survive_partial_vectored_writes() {
        let mut parts = Vec::new();
        let mut want = Vec::new();
        for i in 0..5u8 {
            let mut e = Encoder::new();
            e.u32(i as u32);
            e.opaque_shared(Bytes::from(vec![i; 3000 + i as usize]));
            let flat = e.to_vec();
            want.extend_from_slice(&rpc::record_mark(flat.len()));
            want.extend_from_slice(&flat);
            push_record(&mut parts, e);
        }
        let mut sink = Trickle(Vec::new());
        write_parts(&mut sink, &mut parts).await.unwrap();
        assert!(parts.is_empty());
        assert_eq!(sink.0, want);
    }
}
