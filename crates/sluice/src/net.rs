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
use tokio::sync::{mpsc, Semaphore};

/// Largest RPC record accepted (a 1 MiB WRITE plus headers fits easily).
pub const MAX_RECORD: usize = 2 * 1024 * 1024;
/// Requests of one connection processed at once.
pub const MAX_IN_FLIGHT: usize = 64;

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
        if !self.clients.is_empty() && !self.clients.iter().any(|r| r.contains(peer.ip())) {
            return Some("address not in any export's client list");
        }
        if self.require_privileged_port && peer.port() >= 1024 {
            return Some("source port not privileged (below 1024)");
        }
        None
    }
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
    let (tx, mut rx) = mpsc::channel::<Encoder>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        let mut w = wr;
        let mut parts: Vec<Bytes> = Vec::new();
        while let Some(reply) = rx.recv().await {
            // Send every reply that is ready in one go.
            push_record(&mut parts, reply);
            while parts.len() < BATCH_PARTS {
                match rx.try_recv() {
                    Ok(r) => push_record(&mut parts, r),
                    Err(_) => break,
                }
            }
            write_parts(&mut w, &mut parts).await?;
        }
        w.flush().await?;
        Ok::<(), std::io::Error>(())
    });
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut asm = RecordAssembler::new(MAX_RECORD);
    let mut body = Vec::new();
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
        body.resize(h.len, 0);
        rd.read_exact(&mut body).await?;
        let record = match asm.push(&body, h.last) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(_) => {
                tracing::warn!(?peer, "record too large; closing connection");
                break Ok(());
            }
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
                    let _ = tx.send(r).await;
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
