//! Command-line pieces the load programs share: the protocol, where
//! NFSv3's MOUNT is asked for the root handle, and the user the calls
//! come from.

use crate::client::ClientError;
use crate::v3;
use sluice_proto::rpc;

/// The protocol a load program speaks.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// NFSv4.1 or 4.2: a session per client.
    V4,
    /// NFSv3: MOUNT v3 MNT of --mount-path, then stateless calls.
    V3,
}

/// The user the calls come from.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Caller {
    /// The user every call comes from (AUTH_SYS uid), root by default: a
    /// server then switches to that identity for each request, as it
    /// does for a client's users (root it may squash to another). What
    /// the calls open or make must be that user's to open or make.
    #[arg(long, default_value_t = 0)]
    pub uid: u32,
    /// The group every call comes from (AUTH_SYS gid; default: the
    /// same number as --uid).
    #[arg(long)]
    gid: Option<u32>,
}

impl Caller {
    /// The group: --gid, or the number of --uid.
    pub fn gid(&self) -> u32 {
        self.gid.unwrap_or(self.uid)
    }

    /// Makes every connection of this process call as this user (see
    /// [`crate::client::call_as`]).
    pub fn call_as(&self) {
        crate::client::call_as(self.uid, self.gid());
    }
}

/// NFSv3's MOUNT: which path, on which port.
#[derive(clap::Args, Clone, Debug)]
pub struct Mount {
    /// NFSv3: the path MOUNT v3 MNT asks for; the paths given are taken
    /// from the directory it mounts.
    #[arg(long, default_value = "/")]
    pub mount_path: String,
    /// NFSv3: the MOUNT port on the --server host (default: the NFS port
    /// of --server, which sluice also serves MOUNT on).
    #[arg(long)]
    pub mount_port: Option<u16>,
}

impl Mount {
    /// The MOUNT address: the host of `server` (host:port) with
    /// --mount-port, or `server` itself.
    pub fn address(&self, server: &str) -> String {
        match (self.mount_port, server.rsplit_once(':')) {
            (Some(port), Some((host, _))) => format!("{host}:{port}"),
            (Some(port), None) => format!("{server}:{port}"),
            (None, _) => server.to_string(),
        }
    }

    /// MNT of --mount-path at `server`'s MOUNT address: the handle of
    /// that directory, or what failed and what to do.
    pub async fn root(&self, server: &str) -> Result<Vec<u8>, String> {
        let at = self.address(server);
        match v3::mount(&at, &self.mount_path).await {
            Ok((fh, _flavors)) => Ok(fh),
            Err(e) => {
                // PROG_UNAVAIL: no MOUNT program on that port.
                let hint = match e {
                    ClientError::Rpc(rpc::ReplyError::NotAccepted(1))
                        if self.mount_port.is_none() =>
                    {
                        " (no MOUNT there: give the server's MOUNT port with --mount-port)"
                    }
                    _ => "",
                };
                Err(format!(
                    "cannot mount {} at {at}: {e}{hint}",
                    self.mount_path
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mount: Mount,
    }

    fn mount(extra: &[&str]) -> Mount {
        let mut argv = vec!["prog"];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).mount
    }

    #[test]
    fn mount_goes_to_the_nfs_port_unless_told_otherwise() {
        assert_eq!(mount(&[]).address("127.0.0.1:2049"), "127.0.0.1:2049");
        let m = mount(&["--mount-port", "20048"]);
        assert_eq!(m.address("10.0.0.2:20490"), "10.0.0.2:20048");
        assert_eq!(m.address("[::1]:2049"), "[::1]:20048");
        assert_eq!(m.address("server"), "server:20048");
        assert_eq!(mount(&[]).mount_path, "/");
    }
}
