//! Tasks and blocking work, and the file system identity they run with.
//!
//! The threads that serve requests keep the last caller's identity after
//! a request (see [`crate::engine::cred::lending`]), so that the same
//! caller's next request there changes no credentials: the request
//! threads ([`blocking_lending`]) and the runtime's threads while they
//! run connections ([`spawn_requests`]). Request code takes the identity
//! it runs as at each entry (`cred::keep_lent_for` or `cred::reclaim`).
//! Everything else first gives the thread back the server's own
//! identity: it is started through [`spawn`] and [`blocking`] (or
//! [`spawn_on`] and [`blocking_on`]), never straight through tokio's
//! `spawn` or `spawn_blocking` (clippy refuses those, see `clippy.toml`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::task::JoinHandle;

/// A future polled with the server's own identity (see the module).
pub struct AsServer<F>(Pin<Box<F>>);

impl<F: Future> Future for AsServer<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        crate::engine::cred::reclaim();
        self.0.as_mut().poll(cx)
    }
}

/// `fut`, polled with the server's own identity: for the future a
/// runtime's `block_on` runs.
pub fn as_server<F: Future>(fut: F) -> AsServer<F> {
    AsServer(Box::pin(fut))
}

/// A future polled on a thread that lends callers' identities (see the
/// module).
struct Lending<F>(Pin<Box<F>>);

impl<F: Future> Future for Lending<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let inner = self.0.as_mut();
        crate::engine::cred::lending(|| inner.poll(cx))
    }
}

/// Runs `fut` as a task, as the server.
#[allow(clippy::disallowed_methods)]
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(as_server(fut))
}

/// [`spawn`] on runtime `rt`.
#[allow(clippy::disallowed_methods)]
pub fn spawn_on<F>(rt: &tokio::runtime::Handle, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    rt.spawn(as_server(fut))
}

/// Runs `fut`, a connection's work, as a task that lends callers'
/// identities: what it does outside its requests touches no file (socket
/// reads and writes, replies, state in memory), and each request takes
/// its identity where it enters (`Server::try_call` and the paused
/// calls' steps).
#[allow(clippy::disallowed_methods)]
pub(crate) fn spawn_requests<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(Lending(Box::pin(fut)))
}

/// Runs `f` on a blocking thread, as the server.
pub fn blocking<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    blocking_on(&tokio::runtime::Handle::current(), f)
}

/// [`blocking`] on runtime `rt`.
pub fn blocking_on<F, R>(rt: &tokio::runtime::Handle, f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    #[allow(clippy::disallowed_methods)]
    rt.spawn_blocking(move || {
        crate::engine::cred::reclaim();
        f()
    })
}

/// Runs request work `f` on a blocking thread that lends callers'
/// identities ([`crate::engine::cred::lending`]): `f` must take the
/// identity it runs as itself, by [`crate::engine::cred::keep_lent_for`]
/// or [`crate::engine::cred::reclaim`] before anything that depends on it.
pub(crate) fn blocking_lending<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    #[allow(clippy::disallowed_methods)]
    tokio::task::spawn_blocking(move || crate::engine::cred::lending(f))
}
