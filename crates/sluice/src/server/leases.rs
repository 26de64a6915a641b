//! Changes by local processes on the server machine (RFC 8881 section
//! 10.4.5 leaves how a server notices them to it; the Linux server does it
//! the same way): every delegation holds a kernel read lease on its file,
//! so a local process that opens the file for writing or truncates it is
//! held back by the kernel, and this process is told with a signal. The
//! watcher thread takes the signal, recalls the delegations of that
//! descriptor, and the lease is released when they are returned or
//! revoked; then the local open goes on.

use super::{callback, Server};
use crate::engine::fs;
use std::sync::Arc;
use std::time::Duration;

/// How long the kernel holds back a local opener before it breaks a
/// lease by force (`/proc/sys/fs/lease-break-time`, 45 s by default).
pub fn lease_break_time() -> Duration {
    std::fs::read_to_string("/proc/sys/fs/lease-break-time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map_or(Duration::from_secs(45), Duration::from_secs)
}

/// Starts the thread that turns lease breaks into recalls. The lease
/// signal must have been blocked ([`fs::block_lease_signal`]) before any
/// thread of the process started.
pub fn watch(srv: Arc<Server>) -> std::io::Result<()> {
    let lease_break = lease_break_time();
    std::thread::Builder::new()
        .name("sluice-leases".into())
        .spawn(move || {
            // The server's identity, whatever the starter's.
            crate::engine::cred::reclaim();
            loop {
            let fd = match fs::wait_lease_break() {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::error!(error = %e, "cannot wait for lease breaks; local writers now wait for the kernel's lease-break time");
                    return;
                }
            };
            let recalls = srv.state.lease_broken(fd, lease_break);
            if !recalls.is_empty() {
                tracing::info!(
                    delegations = recalls.len(),
                    "a local process wants a delegated file: recalling"
                );
                callback::start_recalls(recalls, |c| srv.state.sessions_of(c), &srv.metrics);
            }
            }
        })
        .map(drop)
}
