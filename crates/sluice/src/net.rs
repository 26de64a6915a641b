//! TCP transport: accepts connections, reassembles records, runs each
//! request on a blocking worker and writes replies as they complete.
//!
//! Replies go out with vectored writes: file data read for READ and
//! READ_PLUS stays in the buffer it was read into and is handed to the
//! socket as it is, next to the small encoded headers.

use crate::rpc::{self, FragmentHeader, RecordAssembler};
use crate::server::Server;
use crate::xdr::Encoder;
use bytes::Bytes;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// Largest RPC record accepted (a 1 MiB WRITE plus headers fits easily).
pub const MAX_RECORD: usize = 2 * 1024 * 1024;
/// Requests of one connection processed at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// Accepts connections until the task is dropped.
pub async fn serve(listener: TcpListener, srv: Arc<Server>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tracing::debug!(%peer, "connection accepted");
                let _ = stream.set_nodelay(true);
                let srv = srv.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, srv).await {
                        tracing::debug!(%peer, error = %e, "connection closed");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::task::yield_now().await;
            }
        }
    }
}

async fn connection(stream: TcpStream, srv: Arc<Server>) -> std::io::Result<()> {
    let peer = stream.peer_addr().ok();
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
        tokio::spawn(async move {
            let reply = tokio::task::spawn_blocking(move || srv.handle_call(&record)).await;
            match reply {
                Ok(Some(r)) => {
                    let _ = tx.send(r).await;
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "request handler failed"),
            }
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
