//! TCP transport: accepts connections, reassembles records, runs each
//! request on a blocking worker and writes replies as they complete.

use crate::rpc::{self, FragmentHeader, RecordAssembler};
use crate::server::Server;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
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
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(256 * 1024, wr);
        while let Some(reply) = rx.recv().await {
            w.write_all(&rpc::record_mark(reply.len())).await?;
            w.write_all(&reply).await?;
            if rx.is_empty() {
                w.flush().await?;
            }
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
            let reply = tokio::task::spawn_blocking(move || srv.handle_record(&record)).await;
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
