//! Work handed to tokio's blocking threads.
//!
//! The threads that finish requests keep the last caller's file system
//! identity after a request (see [`crate::engine::cred::lending`]), so
//! that the next request of the same caller changes no credentials.
//! Anything else run on those threads must first give the thread back
//! the server's own identity: it goes through [`spawn`] (or
//! [`spawn_on`]), never straight to `tokio::task::spawn_blocking`
//! (clippy refuses that, see `clippy.toml`).

use tokio::task::JoinHandle;

/// Runs `f` on a blocking thread, as the server (see the module).
pub fn spawn<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    #[allow(clippy::disallowed_methods)]
    tokio::task::spawn_blocking(move || {
        crate::engine::cred::reclaim();
        f()
    })
}

/// [`spawn`] on runtime `rt`.
pub fn spawn_on<F, R>(rt: &tokio::runtime::Handle, f: F) -> JoinHandle<R>
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
pub(crate) fn spawn_lending<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    #[allow(clippy::disallowed_methods)]
    tokio::task::spawn_blocking(move || crate::engine::cred::lending(f))
}
