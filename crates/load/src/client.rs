//! A small NFSv4.1/4.2 client on the project's own XDR and protocol code,
//! for the load generator and tests: one TCP connection, one session,
//! many requests in flight over the session's slots. The same
//! kind of connection carries the NFSv3 client of [`crate::v3`].

use bytes::{Bytes, BytesMut};
use sluice_proto::nfs4::consts::{attr, op, status};
use sluice_proto::nfs4::msg::{
    Bitmap4, CallbackSec, ChannelAttrs4, CloseArgs, CommitArgs, Component4, CompoundHeader,
    CompoundResHeader, CreateSessionArgs, CreateSessionResOk, Createhow4, ExchangeIdArgs,
    ExchangeIdResOk, Fattr4, NfsFh4, OpenArgs, OpenClaim4, OpenDelegation4, OpenResOk, Openflag4,
    ReadArgs, SequenceArgs, SequenceResOk, SessionId, StateOwner4, Stateid4, WriteArgs, WriteResOk,
    Xdr, SHARE_ACCESS_BOTH, SHARE_ACCESS_READ,
};
use sluice_proto::nfs4::Nfsstat4;
use sluice_proto::rpc;
use sluice_proto::xdr::{Decoder, Encoder};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Bytes>>>>;

/// An error from the server or the connection.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    /// An op failed with this NFS status.
    #[error("op {op} failed with NFS status {status}")]
    Status {
        /// The op number.
        op: u32,
        /// The nfsstat4.
        status: Nfsstat4,
    },
    /// A COMPOUND stopped at an op that failed with this NFS status.
    #[error("COMPOUND failed with NFS status {0}")]
    Compound(Nfsstat4),
    /// An NFSv3 procedure failed with this nfsstat3.
    #[error("NFSv3 {} failed with status {status}", sluice_proto::nfs3::proc_name(*proc_))]
    Status3 {
        /// The procedure number.
        proc_: u32,
        /// The nfsstat3.
        status: u32,
    },
    /// MOUNT refused the path with this mountstat3.
    #[error("MOUNT failed with status {0}")]
    Mount(u32),
    /// The server did not run the call (RPC-level error).
    #[error("{0}")]
    Rpc(rpc::ReplyError),
    /// The reply could not be parsed.
    #[error("malformed reply")]
    Malformed,
}

/// Result type of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;

fn bad<T>(_: T) -> ClientError {
    ClientError::Malformed
}

/// One TCP connection carrying RPC calls with AUTH_SYS as root, many in
/// flight, replies matched to calls by xid.
pub(crate) struct Conn {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    xid: AtomicU32,
    /// The credential of every call: AUTH_SYS as the user [`call_as`]
    /// set, root by default.
    cred: rpc::CallCred,
}

/// The user and group (AUTH_SYS uid, gid) the calls of this process's
/// connections carry, once [`call_as`] set them.
static CALLER: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// Makes the calls of every connection made from now on carry `uid` and
/// `gid` (AUTH_SYS, no other groups) instead of root's: a server that
/// does not squash root then works as that user, as it does for a
/// client's users, switching to that identity for each request. The
/// first setting holds.
pub fn call_as(uid: u32, gid: u32) {
    let _ = CALLER.set((uid, gid));
}

impl Conn {
    pub(crate) async fn connect(addr: &str) -> Result<Arc<Conn>> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut rd, wr) = stream.into_split();
        let pending: Pending = Arc::default();
        let p2 = pending.clone();
        tokio::spawn(async move {
            // Replies are read straight into their buffer, not zeroed
            // first, and handed on without copies: at 1 MiB per READ the
            // load generator must not spend the CPU that the server under
            // test shares with it.
            let mut rec = BytesMut::new();
            loop {
                let mut mark = [0u8; 4];
                if rd.read_exact(&mut mark).await.is_err() {
                    break;
                }
                let h = rpc::FragmentHeader::parse(mark);
                let end = rec.len() + h.len;
                rec.reserve(h.len);
                let mut gone = false;
                while rec.len() < end {
                    let mut part = (&mut rd).take((end - rec.len()) as u64);
                    if !matches!(part.read_buf(&mut rec).await, Ok(n) if n > 0) {
                        gone = true;
                        break;
                    }
                }
                if gone {
                    break;
                }
                if !h.last {
                    continue;
                }
                let r = rec.split().freeze();
                if r.len() < 4 {
                    continue;
                }
                let xid = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
                let tx = p2.lock().ok().and_then(|mut p| p.remove(&xid));
                if let Some(tx) = tx {
                    let _ = tx.send(r);
                }
            }
            // Connection gone: fail everything still waiting.
            if let Ok(mut p) = p2.lock() {
                p.clear();
            }
        });
        Ok(Arc::new(Conn {
            writer: tokio::sync::Mutex::new(wr),
            pending,
            xid: AtomicU32::new(1),
            cred: {
                let (uid, gid) = CALLER.get().copied().unwrap_or((0, 0));
                rpc::CallCred::Sys {
                    stamp: 0,
                    machine: b"sluice-load".to_vec(),
                    uid,
                    gid,
                    gids: Vec::new(),
                }
            },
        }))
    }

    /// Sends an NFSv4 COMPOUND (procedure 1) and returns the reply body
    /// after the RPC header.
    async fn call(&self, args: &[u8]) -> Result<Bytes> {
        self.call_proc(rpc::NFS_PROGRAM, 4, 1, args).await
    }

    /// Sends a call of procedure `proc_` of program `prog` version `vers`
    /// with the encoded arguments `args`, and returns the reply body after
    /// the RPC header.
    pub(crate) async fn call_proc(
        &self,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: &[u8],
    ) -> Result<Bytes> {
        let xid = self.xid.fetch_add(1, Ordering::Relaxed);
        // The record mark goes first, in the same buffer: one write, so
        // one TCP segment for a small call (the socket has TCP_NODELAY),
        // as the Linux client sends it. Two writes made two segments, and
        // the server's kernel then acknowledged each call on its own
        // instead of with the reply.
        let mut e = Encoder::with_capacity(args.len() + 132);
        e.u32(0);
        rpc::call_header(&mut e, xid, prog, vers, proc_, &self.cred);
        e.raw(args);
        let mut record = e.into_inner();
        let mark = rpc::record_mark(record.len() - 4);
        record[..4].copy_from_slice(&mark);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().map_err(bad)?.insert(xid, tx);
        {
            let mut w = self.writer.lock().await;
            w.write_all(&record).await?;
        }
        let reply = rx
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::ConnectionAborted, "connection closed"))?;
        let (_, at) = rpc::parse_reply(&reply).map_err(bad)?;
        let at = at.map_err(ClientError::Rpc)?;
        Ok(reply.slice(at..))
    }
}

/// Writes the COMPOUND header (empty tag, `minor`, `numops`) that the ops
/// follow.
fn compound_header(e: &mut Encoder, minor: u32, numops: u32) {
    CompoundHeader {
        tag: Vec::new(),
        minorversion: minor,
        numops,
    }
    .encode(e);
}

/// Reads the op number and status before an op's result; an error if the
/// op failed.
fn op_ok(d: &mut Decoder<'_>) -> Result<u32> {
    let opnum = d.u32().map_err(bad)?;
    let st = Nfsstat4::decode(d).map_err(bad)?;
    if st != status::OK {
        return Err(ClientError::Status {
            op: opnum,
            status: st,
        });
    }
    Ok(opnum)
}

/// Results of a COMPOUND: a decoder positioned after the per-op header of
/// each successful op is handed to the caller's parser.
pub struct Reply {
    body: Bytes,
    /// Where the first op's result starts.
    at: usize,
    /// How many op results follow.
    ops: u32,
    /// The COMPOUND's status: that of its last op.
    status: Nfsstat4,
}

impl Reply {
    /// A COMPOUND reply body: status, tag and the count of op results.
    fn parse(body: Bytes) -> Result<Reply> {
        let mut d = Decoder::new(&body);
        let h = CompoundResHeader::decode(&mut d).map_err(bad)?;
        let at = d.position();
        Ok(Reply {
            body,
            at,
            ops: h.numres,
            status: h.status,
        })
    }

    /// Ok when every op succeeded; else the COMPOUND's status (that of
    /// the op that failed).
    pub fn check(&self) -> Result<()> {
        if self.status == status::OK {
            Ok(())
        } else {
            Err(ClientError::Compound(self.status))
        }
    }

    /// Walks the results: calls `f(opnum, decoder)` for each op in order.
    /// `f` must consume the op's result body.
    pub fn walk(&self, mut f: impl FnMut(u32, &mut Decoder<'_>) -> Result<()>) -> Result<()> {
        let mut d = Decoder::new(&self.body[self.at..]);
        for _ in 0..self.ops {
            let opnum = op_ok(&mut d)?;
            f(opnum, &mut d)?;
        }
        Ok(())
    }
}

struct Slots {
    seq: Mutex<Vec<(bool, u32)>>,
    free: Semaphore,
}

/// An NFSv4.1 session over one connection.
pub struct Client {
    conn: Arc<Conn>,
    session: SessionId,
    slots: Slots,
    minor: u32,
    /// Client id from EXCHANGE_ID.
    pub clientid: u64,
}

/// A stateid as sent on the wire.
pub type Sid = Stateid4;

/// An open file.
#[derive(Debug, Clone)]
pub struct OpenFile {
    /// Its handle.
    pub fh: NfsFh4,
    /// Open stateid.
    pub sid: Sid,
    /// Size when opened.
    pub size: u64,
}

/// The channel attributes asked for: 2 MiB messages, 64 KiB cached
/// replies, 32 ops, `slots` slots.
fn channel(slots: u32) -> ChannelAttrs4 {
    ChannelAttrs4 {
        header_pad: 0,
        max_request: 2 << 20,
        max_response: 2 << 20,
        max_response_cached: 64 * 1024,
        max_ops: 32,
        max_requests: slots,
        rdma_ird: None,
    }
}

impl Client {
    /// Connects, creates a client record and a session with `slots` slots.
    pub async fn connect(addr: &str, minor: u32, slots: u32) -> Result<Client> {
        let conn = Conn::connect(addr).await?;
        let mut owner = [0u8; 16];
        getrandom::getrandom(&mut owner).map_err(bad)?;
        let mut a = Encoder::new();
        compound_header(&mut a, minor, 1);
        a.u32(op::EXCHANGE_ID);
        ExchangeIdArgs {
            verifier: owner[..8].try_into().map_err(bad)?,
            ownerid: owner.to_vec(),
            ..Default::default()
        }
        .encode(&mut a);
        let r = Reply::parse(conn.call(a.as_slice()).await?)?;
        let (mut clientid, mut seq) = (0, 0);
        r.walk(|_, d| {
            let x = ExchangeIdResOk::decode(d).map_err(bad)?;
            (clientid, seq) = (x.clientid, x.sequenceid);
            Ok(())
        })?;
        let mut a = Encoder::new();
        compound_header(&mut a, minor, 1);
        a.u32(op::CREATE_SESSION);
        CreateSessionArgs {
            clientid,
            sequence: seq,
            flags: 0,
            fore: channel(slots),
            back: channel(1),
            cb_program: 0x4000_0000,
            cb_sec: vec![CallbackSec::None],
        }
        .encode(&mut a);
        let r = Reply::parse(conn.call(a.as_slice()).await?)?;
        let mut session = SessionId::default();
        let mut granted = slots;
        r.walk(|_, d| {
            let x = CreateSessionResOk::decode(d).map_err(bad)?;
            session = x.sessionid;
            granted = x.fore.max_requests;
            Ok(())
        })?;
        let granted = granted.clamp(1, slots.max(1));
        let c = Client {
            conn,
            session,
            slots: Slots {
                seq: Mutex::new(vec![(false, 0); granted as usize]),
                free: Semaphore::new(granted as usize),
            },
            minor,
            clientid,
        };
        // RECLAIM_COMPLETE so that opens are allowed. Its only argument
        // is rca_one_fs (false: for every file system).
        c.compound(1, |e| {
            e.u32(op::RECLAIM_COMPLETE);
            false.encode(e);
        })
        .await?;
        Ok(c)
    }

    /// Ends the session (its client id and state stay until the lease runs
    /// out and someone conflicts with them).
    pub async fn destroy_session(&self) -> Result<()> {
        let mut a = Encoder::new();
        compound_header(&mut a, self.minor, 1);
        a.u32(op::DESTROY_SESSION);
        self.session.encode(&mut a);
        Reply::parse(self.conn.call(a.as_slice()).await?)?.walk(|_, _| Ok(()))
    }

    /// Leaves as a client does when it unmounts: ends the session, then
    /// gives the client id back (DESTROY_CLIENTID, which the server
    /// refuses while the client still holds state). Without it, every
    /// client id stays on the server until its lease runs out, and a run
    /// of many short-lived clients can fill the server's client table.
    pub async fn leave(&self) -> Result<()> {
        // The client id is given back even when the session could not be
        // (a server that lost it answers DESTROY_SESSION with an error).
        let session = self.destroy_session().await;
        let mut a = Encoder::new();
        compound_header(&mut a, self.minor, 1);
        a.u32(op::DESTROY_CLIENTID);
        self.clientid.encode(&mut a);
        let clientid =
            async { Reply::parse(self.conn.call(a.as_slice()).await?)?.walk(|_, _| Ok(())) }.await;
        session.and(clientid)
    }

    /// Runs SEQUENCE plus the `nops` ops written by `ops` and returns the
    /// reply positioned after SEQUENCE's result.
    pub async fn compound(&self, nops: u32, ops: impl FnOnce(&mut Encoder)) -> Result<Reply> {
        let _permit = self.slots.free.acquire().await.map_err(bad)?;
        let (slot, seqid) = {
            let mut s = self.slots.seq.lock().map_err(bad)?;
            let i = s
                .iter()
                .position(|(busy, _)| !busy)
                .ok_or(ClientError::Malformed)?;
            s[i].0 = true;
            s[i].1 = s[i].1.wrapping_add(1);
            (i as u32, s[i].1)
        };
        let mut e = Encoder::with_capacity(256);
        compound_header(&mut e, self.minor, nops + 1);
        e.u32(op::SEQUENCE);
        SequenceArgs {
            sessionid: self.session,
            sequenceid: seqid,
            slotid: slot,
            highest_slotid: slot,
            cachethis: false,
        }
        .encode(&mut e);
        ops(&mut e);
        let r = self.conn.call(e.as_slice()).await;
        if let Ok(mut s) = self.slots.seq.lock() {
            s[slot as usize].0 = false;
        }
        let mut reply = Reply::parse(r?)?;
        // Strip the SEQUENCE result so callers see only their ops.
        let mut d = Decoder::new(&reply.body[reply.at..]);
        op_ok(&mut d)?;
        SequenceResOk::decode(&mut d).map_err(bad)?;
        reply.at += d.position();
        reply.ops = reply.ops.saturating_sub(1);
        Ok(reply)
    }

    /// The state owner `owner` of this client (an open or lock owner).
    pub fn state_owner(&self, owner: &[u8]) -> StateOwner4 {
        StateOwner4 {
            clientid: self.clientid,
            owner: owner.to_vec(),
        }
    }

    /// Opens `path` (slash-separated from the root), creating it if asked.
    pub async fn open(&self, path: &str, write: bool, create: bool) -> Result<OpenFile> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let (name, dirs) = parts.split_last().ok_or(ClientError::Malformed)?;
        let nops = 1 + dirs.len() as u32 + 3;
        let r = self
            .compound(nops, |e| {
                e.u32(op::PUTROOTFH);
                for d in dirs {
                    e.u32(op::LOOKUP);
                    Component4::new(d).encode(e);
                }
                e.u32(op::OPEN);
                OpenArgs {
                    seqid: 0,
                    share_access: if write {
                        SHARE_ACCESS_BOTH
                    } else {
                        SHARE_ACCESS_READ
                    },
                    share_deny: 0, // OPEN4_SHARE_DENY_NONE
                    owner: self.state_owner(b"sluice-load"),
                    openhow: if create {
                        Openflag4::Create(Createhow4::Unchecked(Fattr4::default()))
                    } else {
                        Openflag4::NoCreate
                    },
                    claim: OpenClaim4::Null(Component4::new(name)),
                }
                .encode(e);
                e.u32(op::GETFH);
                e.u32(op::GETATTR);
                Bitmap4::of(&[attr::SIZE]).encode(e);
            })
            .await?;
        let mut f = OpenFile {
            fh: NfsFh4::default(),
            sid: Stateid4::default(),
            size: 0,
        };
        r.walk(|opnum, d| {
            match opnum {
                op::OPEN => {
                    let res = OpenResOk::decode(d).map_err(bad)?;
                    // This client cannot take delegations back when the
                    // server recalls them, and asks for none.
                    if !matches!(
                        res.delegation,
                        OpenDelegation4::None | OpenDelegation4::NoneExt(_)
                    ) {
                        return Err(ClientError::Malformed);
                    }
                    f.sid = res.stateid;
                }
                op::GETFH => f.fh = NfsFh4::decode(d).map_err(bad)?,
                op::GETATTR => {
                    // Only the size was asked for: it is all the values.
                    let attrs = Fattr4::decode(d).map_err(bad)?;
                    f.size = u64::decode(&mut Decoder::new(&attrs.vals)).map_err(bad)?;
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(f)
    }

    /// PUTFH of `f`, then op `opnum` with the arguments `args` writes.
    async fn on_file(
        &self,
        f: &OpenFile,
        opnum: u32,
        args: impl FnOnce(&mut Encoder),
    ) -> Result<Reply> {
        self.compound(2, |e| {
            e.u32(op::PUTFH);
            f.fh.encode(e);
            e.u32(opnum);
            args(e);
        })
        .await
    }

    async fn read_call(&self, f: &OpenFile, offset: u64, count: u32, opnum: u32) -> Result<Reply> {
        self.on_file(f, opnum, |e| {
            ReadArgs {
                stateid: f.sid,
                offset,
                count,
            }
            .encode(e)
        })
        .await
    }

    /// READ (or READ_PLUS with `plus`): returns (bytes of file covered,
    /// bytes of data received, eof).
    pub async fn read(
        &self,
        f: &OpenFile,
        offset: u64,
        count: u32,
        plus: bool,
    ) -> Result<(u64, u64, bool)> {
        let opnum = if plus { op::READ_PLUS } else { op::READ };
        let r = self.read_call(f, offset, count, opnum).await?;
        let mut out = (0, 0, false);
        // READ4resok and READ_PLUS4resok have no typed messages in
        // sluice_proto yet: they are read field by field.
        r.walk(|opnum, d| {
            if opnum == op::READ {
                out.2 = d.bool().map_err(bad)?;
                let n = d.opaque(usize::MAX).map_err(bad)?.len() as u64;
                out = (n, n, out.2);
            } else if opnum == op::READ_PLUS {
                out.2 = d.bool().map_err(bad)?;
                let n = d.u32().map_err(bad)?;
                let mut end = offset;
                let mut expect = offset;
                for _ in 0..n {
                    match d.u32().map_err(bad)? {
                        0 => {
                            let o = d.u64().map_err(bad)?;
                            if o != expect {
                                return Err(ClientError::Malformed);
                            }
                            let l = d.opaque(usize::MAX).map_err(bad)?.len() as u64;
                            expect = o + l;
                            out.1 += l;
                            end = o + l;
                        }
                        1 => {
                            let o = d.u64().map_err(bad)?;
                            if o != expect {
                                return Err(ClientError::Malformed);
                            }
                            end = o.saturating_add(d.u64().map_err(bad)?);
                            expect = end;
                        }
                        _ => return Err(ClientError::Malformed),
                    }
                }
                if end == offset && !out.2 {
                    // Nothing covered and not at EOF: no progress possible.
                    return Err(ClientError::Malformed);
                }
                out.0 = end - offset;
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// READ returning the bytes themselves.
    pub async fn read_bytes(&self, f: &OpenFile, offset: u64, count: u32) -> Result<Vec<u8>> {
        let r = self.read_call(f, offset, count, op::READ).await?;
        let mut out = Vec::new();
        r.walk(|opnum, d| {
            if opnum == op::READ {
                d.bool().map_err(bad)?;
                out = d.opaque(usize::MAX).map_err(bad)?.to_vec();
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// CLOSE of an open.
    pub async fn close(&self, f: &OpenFile) -> Result<()> {
        let args = CloseArgs {
            seqid: 0,
            stateid: f.sid,
        };
        self.on_file(f, op::CLOSE, |e| args.encode(e)).await?;
        Ok(())
    }

    /// COMMIT of the whole file.
    pub async fn commit(&self, f: &OpenFile) -> Result<()> {
        let args = CommitArgs {
            offset: 0,
            count: 0,
        };
        self.on_file(f, op::COMMIT, |e| args.encode(e)).await?;
        Ok(())
    }

    /// WRITE (FILE_SYNC when `sync`, else UNSTABLE).
    pub async fn write(&self, f: &OpenFile, offset: u64, data: &[u8], sync: bool) -> Result<u32> {
        let r = self
            .on_file(f, op::WRITE, |e| {
                WriteArgs {
                    stateid: f.sid,
                    offset,
                    stable: if sync { 2 } else { 0 },
                    data,
                }
                .encode(e)
            })
            .await?;
        let mut n = 0;
        r.walk(|opnum, d| {
            if opnum == op::WRITE {
                n = WriteResOk::decode(d).map_err(bad)?.count;
            }
            Ok(())
        })?;
        Ok(n)
    }
}
