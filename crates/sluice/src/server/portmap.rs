//! The portmapper (RFC 1833): PMAP version 2 and rpcbind versions 3 and 4
//! answer where sluice's programs are. Every program sluice serves is on
//! the NFS port, so the table is fixed: NFS (3 and 4) over TCP, and
//! MOUNT (1 and 3), NLM (4) and NSM (1) over TCP and UDP. It answers on the NFS port itself, and on port 111 over TCP
//! and UDP when sluice runs its own portmapper (`--portmap`), for clients
//! that ask the usual way and a machine that runs no rpcbind.
//!
//! Without `--portmap`, [`register`] tells a running rpcbind about the
//! same programs (PMAPPROC_SET over loopback), when there is one, and
//! [`unregister`] takes back what it took.

use crate::mount::{
    pmapproc, Mapping, Rpcb, IPPROTO_TCP, IPPROTO_UDP, MOUNT_PROGRAM, NLM_PROGRAM, NSM_PROGRAM,
    PMAP_PROGRAM,
};
use crate::rpc::{self, AcceptStat, CallError};
use crate::xdr::{Decoder, Encoder};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// rpcbind GETADDR (versions 3 and 4).
const RPCBPROC_GETADDR: u32 = 3;
/// rpcbind DUMP (versions 3 and 4).
const RPCBPROC_DUMP: u32 = 4;

/// The programs on the NFS port: (program, version, protocol).
pub const PROGRAMS: [(u32, u32, u32); 10] = [
    (rpc::NFS_PROGRAM, 3, IPPROTO_TCP),
    (rpc::NFS_PROGRAM, 4, IPPROTO_TCP),
    (MOUNT_PROGRAM, 1, IPPROTO_TCP),
    (MOUNT_PROGRAM, 3, IPPROTO_TCP),
    (MOUNT_PROGRAM, 1, IPPROTO_UDP),
    (MOUNT_PROGRAM, 3, IPPROTO_UDP),
    (NLM_PROGRAM, 4, IPPROTO_TCP),
    (NLM_PROGRAM, 4, IPPROTO_UDP),
    (NSM_PROGRAM, 1, IPPROTO_TCP),
    (NSM_PROGRAM, 1, IPPROTO_UDP),
];

/// The table a portmapper answers from.
#[derive(Debug, Clone, Copy)]
pub struct Table {
    /// The NFS port.
    pub port: u16,
}

impl Table {
    fn port_of(&self, prog: u32, vers: u32, prot: u32) -> u32 {
        if prog == PMAP_PROGRAM && (2..=4).contains(&vers) {
            return 111;
        }
        if PROGRAMS.contains(&(prog, vers, prot)) {
            self.port as u32
        } else {
            0
        }
    }

    fn mappings(&self) -> Vec<Mapping> {
        PROGRAMS
            .iter()
            .map(|&(prog, vers, prot)| Mapping {
                prog,
                vers,
                prot,
                port: self.port as u32,
            })
            .collect()
    }
}

/// The universal address (RFC 5665) of `ip` at `port`.
fn uaddr(ip: IpAddr, port: u16) -> String {
    format!("{ip}.{}.{}", port >> 8, port & 0xff)
}

/// Answers one portmapper call in `record` (the whole RPC call) from a
/// caller that reached this server at `local`. None: no reply (a
/// malformed record that carries no xid).
pub fn answer(table: &Table, record: &[u8], local: Option<IpAddr>) -> Option<Vec<u8>> {
    let call = match rpc::parse_call(record) {
        Ok(c) => c,
        Err(e) => return rpc::error_reply(&e),
    };
    answer_call(table, &call, record, local).map(Encoder::into_inner)
}

/// Answers a parsed portmapper call.
pub(super) fn answer_call(
    table: &Table,
    call: &rpc::CallHeader,
    record: &[u8],
    local: Option<IpAddr>,
) -> Option<Encoder> {
    let xid = call.xid;
    if call.prog != PMAP_PROGRAM {
        return Some(rpc::accepted_reply(xid, AcceptStat::ProgUnavail));
    }
    if !(2..=4).contains(&call.vers) {
        return Some(Encoder::from(rpc::prog_mismatch(xid, 2, 4)));
    }
    let garbage = || rpc::error_reply(&CallError::Garbage(xid)).map(Encoder::from);
    let mut d = Decoder::new(&record[call.args_at..]);
    let mut e = rpc::accepted_reply(xid, AcceptStat::Success);
    match (call.vers, call.proc_) {
        (_, pmapproc::NULL) => {}
        // Registrations are fixed: SET and UNSET answer false.
        (2, pmapproc::SET | pmapproc::UNSET) => {
            if Mapping::decode(&mut d).is_err() {
                return garbage();
            }
            e.bool(false);
        }
        (_, pmapproc::SET | pmapproc::UNSET) => {
            if Rpcb::decode(&mut d).is_err() {
                return garbage();
            }
            e.bool(false);
        }
        (2, pmapproc::GETPORT) => {
            let Ok(m) = Mapping::decode(&mut d) else {
                return garbage();
            };
            e.u32(table.port_of(m.prog, m.vers, m.prot));
        }
        (2, pmapproc::DUMP) => {
            for m in table.mappings() {
                e.bool(true);
                e.u32(m.prog);
                e.u32(m.vers);
                e.u32(m.prot);
                e.u32(m.port);
            }
            e.bool(false);
        }
        (_, RPCBPROC_GETADDR) => {
            let Ok(r) = Rpcb::decode(&mut d) else {
                return garbage();
            };
            let v6 = r.netid == b"tcp6" || r.netid == b"udp6";
            let port = match r.netid {
                b"tcp" | b"tcp6" => table.port_of(r.prog, r.vers, IPPROTO_TCP),
                b"udp" | b"udp6" => table.port_of(r.prog, r.vers, IPPROTO_UDP),
                _ => 0,
            };
            let ip = local.filter(|ip| ip.is_ipv6() == v6);
            match (port, ip) {
                (0, _) | (_, None) => e.string(""),
                (p, Some(ip)) => e.string(&uaddr(ip, p as u16)),
            }
        }
        (_, RPCBPROC_DUMP) => {
            let ip = local.unwrap_or(IpAddr::from([0, 0, 0, 0]));
            for m in table.mappings() {
                let netid = match (m.prot == IPPROTO_TCP, ip.is_ipv6()) {
                    (true, false) => "tcp",
                    (true, true) => "tcp6",
                    (false, false) => "udp",
                    (false, true) => "udp6",
                };
                e.bool(true);
                e.u32(m.prog);
                e.u32(m.vers);
                e.string(netid);
                e.string(&uaddr(ip, m.port as u16));
                e.string("sluice");
            }
            e.bool(false);
        }
        _ => return Some(rpc::accepted_reply(xid, AcceptStat::ProcUnavail)),
    }
    Some(e)
}

/// Registers sluice's programs on `port` with the rpcbind running on
/// this machine, if one answers on 127.0.0.1:111 (PMAPPROC_SET). Returns
/// the programs rpcbind took, for [`unregister`]; rpcbind refuses a
/// program another server has registered, and that registration stays.
/// An error when there is no rpcbind.
pub fn register(port: u16) -> std::io::Result<Vec<(u32, u32, u32)>> {
    let mut taken = Vec::new();
    let mut s = rpcbind()?;
    for &(prog, vers, prot) in PROGRAMS.iter() {
        if pmap_call(&mut s, pmapproc::SET, (prog, vers, prot), port)? {
            taken.push((prog, vers, prot));
        }
    }
    Ok(taken)
}

/// Takes back the programs [`register`] registered.
pub fn unregister(port: u16, taken: &[(u32, u32, u32)]) -> std::io::Result<()> {
    let mut s = rpcbind()?;
    for &m in taken {
        pmap_call(&mut s, pmapproc::UNSET, m, port)?;
    }
    Ok(())
}

fn rpcbind() -> std::io::Result<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 111));
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(s)
}

/// One PMAP version 2 SET or UNSET call; rpcbind's yes or no.
fn pmap_call(
    s: &mut TcpStream,
    proc_: u32,
    (prog, vers, prot): (u32, u32, u32),
    port: u16,
) -> std::io::Result<bool> {
    let mut e = Encoder::new();
    let cred = rpc::CallCred::Sys {
        stamp: 0,
        machine: b"localhost".to_vec(),
        uid: 0,
        gid: 0,
        gids: vec![],
    };
    let xid = 0x5100_0000 ^ (prog << 4) ^ (vers << 2) ^ proc_;
    rpc::call_header(&mut e, xid, PMAP_PROGRAM, 2, proc_, &cred);
    e.u32(prog);
    e.u32(vers);
    e.u32(prot);
    e.u32(port as u32);
    let body = e.into_inner();
    s.write_all(&rpc::record_mark(body.len()))?;
    s.write_all(&body)?;
    let mut mark = [0u8; 4];
    s.read_exact(&mut mark)?;
    let len = (u32::from_be_bytes(mark) & !rpc::LAST_FRAGMENT) as usize;
    if len > 1024 {
        return Err(std::io::Error::other("rpcbind sent an oversized reply"));
    }
    let mut reply = vec![0u8; len];
    s.read_exact(&mut reply)?;
    match rpc::parse_reply(&reply) {
        Ok((_, Ok(at))) => Ok(reply.get(at..at + 4) == Some(&[0, 0, 0, 1][..])),
        _ => Err(std::io::Error::other("rpcbind refused the call")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(vers: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        let mut e = Encoder::new();
        rpc::call_header(&mut e, 7, PMAP_PROGRAM, vers, proc_, &rpc::CallCred::None);
        e.raw(args);
        e.into_inner()
    }

    fn result(reply: &[u8]) -> Vec<u8> {
        let (_, r) = rpc::parse_reply(reply).unwrap();
        reply[r.unwrap()..].to_vec()
    }

    #[test]
    fn getport_finds_what_is_served() {
        let t = Table { port: 2049 };
        let q = |prog: u32, vers: u32, prot: u32| {
            let mut a = Encoder::new();
            for v in [prog, vers, prot, 0] {
                a.u32(v);
            }
            let r = answer(&t, &call(2, pmapproc::GETPORT, &a.into_inner()), None).unwrap();
            u32::from_be_bytes(result(&r)[..4].try_into().unwrap())
        };
        assert_eq!(q(100003, 3, IPPROTO_TCP), 2049);
        assert_eq!(q(100005, 3, IPPROTO_TCP), 2049);
        assert_eq!(q(100005, 3, IPPROTO_UDP), 2049);
        assert_eq!(q(100003, 3, IPPROTO_UDP), 0);
        assert_eq!(q(100003, 2, IPPROTO_TCP), 0);
        assert_eq!(q(100021, 4, IPPROTO_TCP), 2049);
        assert_eq!(q(100021, 1, IPPROTO_TCP), 0);
        assert_eq!(q(100024, 1, IPPROTO_UDP), 2049);
    }

    #[test]
    fn getaddr_gives_a_universal_address() {
        let t = Table { port: 2049 };
        let mut a = Encoder::new();
        a.u32(100005);
        a.u32(3);
        a.string("tcp");
        a.string("");
        a.string("");
        let r = answer(
            &t,
            &call(4, RPCBPROC_GETADDR, &a.into_inner()),
            Some("10.0.2.2".parse().unwrap()),
        )
        .unwrap();
        let body = result(&r);
        let mut d = Decoder::new(&body);
        assert_eq!(d.opaque(64).unwrap(), b"10.0.2.2.8.1");
    }

    #[test]
    fn other_versions_and_garbage() {
        let t = Table { port: 2049 };
        let r = answer(&t, &call(5, 0, &[]), None).unwrap();
        assert!(matches!(
            rpc::parse_reply(&r),
            Ok((7, Err(rpc::ReplyError::NotAccepted(2))))
        ));
        let r = answer(&t, &call(2, pmapproc::GETPORT, &[0, 0]), None).unwrap();
        assert!(matches!(
            rpc::parse_reply(&r),
            Ok((7, Err(rpc::ReplyError::NotAccepted(4))))
        ));
    }
}
