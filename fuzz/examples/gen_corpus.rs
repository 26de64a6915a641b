//! Writes the seed corpus of the fuzz targets to `fuzz/corpus/<target>/`
//! (or under the directory given as the first argument), and checks that
//! every `compound` seed gets the answer it was written for from a real
//! server over the fuzz harness's scratch export (so it must run as root).
//!
//! Seed files are named `seed-*`; other files in the corpus directories
//! (saved reproducers) are left alone.
//!
//! ```sh
//! cd fuzz && cargo run --example gen_corpus
//! ```

use sluice::nfs4::consts::{attr, ftype, op, status};
use sluice::nfs4::msg::{AuthSysParms, CallbackSec, ChannelAttrs4, CreateSessionArgs, Xdr};
use sluice::nfs4::Nfsstat4;
use sluice::rpc;
use sluice::xdr::Encoder;
use sluice_fuzz::harness::{self, Harness, FILE_DATA, FILE_HOLE_END};
use sluice_fuzz::wire::{self, Auth, Compound};
use std::path::{Path, PathBuf};

const NO_SESSION: [u8; 16] = [0; 16];

/// The "current stateid" of RFC 8881 section 16.2.3.1.2.
const CURRENT: (u32, [u8; 12]) = (1, [0; 12]);
/// The anonymous stateid.
const ANONYMOUS: (u32, [u8; 12]) = (0, [0; 12]);
/// The READ bypass stateid.
const BYPASS: (u32, [u8; 12]) = (u32::MAX, [0xff; 12]);

const SHARE_READ: u32 = 1;
const SHARE_WRITE: u32 = 2;
const SHARE_BOTH: u32 = 3;
const FILE_SYNC: u32 = 2;
const UNSTABLE: u32 = 0;
const READ_LT: u32 = 1;
const WRITE_LT: u32 = 2;

fn stateid(e: &mut Encoder, sid: (u32, [u8; 12])) {
    e.u32(sid.0);
    e.opaque_fixed(&sid.1);
}

fn bitmap(list: &[u32]) -> [u32; 3] {
    let mut w = [0u32; 3];
    for &b in list {
        w[(b / 32) as usize] |= 1 << (b % 32);
    }
    w
}

/// fattr4 with MODE only.
fn fattr_mode(e: &mut Encoder, mode: u32) {
    e.bitmap(&bitmap(&[attr::MODE]));
    let mut v = Encoder::new();
    v.u32(mode);
    e.opaque(v.as_slice());
}

/// fattr4 with nothing in it.
fn fattr_empty(e: &mut Encoder) {
    e.u32(0);
    e.u32(0);
}

/// Every attribute the server supports.
fn all_attrs() -> [u32; 3] {
    sluice::server::attrs::supported()
}

fn getattr(c: Compound, attrs: &[u32; 3]) -> Compound {
    c.op(op::GETATTR, |e| e.bitmap(attrs))
}

fn lookup(c: Compound, name: &str) -> Compound {
    c.op(op::LOOKUP, |e| e.string(name))
}

/// SEQUENCE (patched by the harness) and PUTROOTFH.
fn in_session(minor: u32, tag: &str) -> Compound {
    Compound::new(minor, tag)
        .sequence(&NO_SESSION, 1, 0, false)
        .bare(op::PUTROOTFH)
}

/// OPEN of `name` in the current directory with CLAIM_NULL; creates it
/// (UNCHECKED, mode 0644) when `create` is set.
fn open(c: Compound, name: &str, access: u32, create: bool) -> Compound {
    c.op(op::OPEN, |e| {
        e.u32(0); // seqid
        e.u32(access);
        e.u32(0); // deny none
        e.u64(0); // owner's client id (the session's is used)
        e.opaque(b"fuzz-owner");
        if create {
            e.u32(1);
            e.u32(0); // UNCHECKED4
            fattr_mode(e, 0o644);
        } else {
            e.u32(0);
        }
        e.u32(0); // CLAIM_NULL
        e.string(name);
    })
}

fn close(c: Compound) -> Compound {
    c.op(op::CLOSE, |e| {
        e.u32(0);
        stateid(e, CURRENT);
    })
}

fn io_op(c: Compound, opnum: u32, sid: (u32, [u8; 12]), offset: u64, count: u32) -> Compound {
    c.op(opnum, |e| {
        stateid(e, sid);
        e.u64(offset);
        e.u32(count);
    })
}

fn write(c: Compound, sid: (u32, [u8; 12]), offset: u64, stable: u32, data: &[u8]) -> Compound {
    c.op(op::WRITE, |e| {
        stateid(e, sid);
        e.u64(offset);
        e.u32(stable);
        e.opaque(data);
    })
}

fn range_op(c: Compound, opnum: u32, offset: u64, length: u64) -> Compound {
    c.op(opnum, |e| {
        stateid(e, CURRENT);
        e.u64(offset);
        e.u64(length);
    })
}

fn seek(c: Compound, offset: u64, hole: bool) -> Compound {
    c.op(op::SEEK, |e| {
        stateid(e, ANONYMOUS);
        e.u64(offset);
        e.u32(hole as u32);
    })
}

/// One `compound` seed: its name, input, and the COMPOUND status (or, for
/// raw records that are not COMPOUNDs, `None`) a fresh harness answers.
struct Seed {
    name: &'static str,
    input: Vec<u8>,
    expect: Option<Nfsstat4>,
}

fn session_seed(name: &'static str, ctl: u8, c: Compound, expect: Nfsstat4) -> Seed {
    Seed {
        name,
        input: harness::input(ctl, &c.encode()),
        expect: Some(expect),
    }
}

fn compound_seeds() -> Vec<Seed> {
    let s = harness::MODE_SESSION;
    let mut seeds = vec![
        session_seed(
            "seq-putrootfh-getattr",
            s,
            getattr(in_session(1, "getattr"), &all_attrs()),
            status::OK,
        ),
        session_seed(
            "seq-getattr-cached",
            s,
            getattr(
                Compound::new(2, "")
                    .sequence(&NO_SESSION, 1, 1, true)
                    .bare(op::PUTROOTFH),
                &bitmap(&[attr::TYPE, attr::SIZE, attr::CHANGE]),
            ),
            status::OK,
        ),
        session_seed(
            "seq-lookup-getfh-getattr",
            s,
            getattr(
                lookup(lookup(in_session(1, "lookup"), "dir"), "inner").bare(op::GETFH),
                &bitmap(&[attr::TYPE, attr::SIZE, attr::FILEID, attr::OWNER]),
            ),
            status::OK,
        ),
        session_seed(
            "seq-lookupp-savefh-restorefh",
            s,
            lookup(in_session(1, ""), "dir")
                .bare(op::SAVEFH)
                .bare(op::LOOKUPP)
                .bare(op::RESTOREFH)
                .bare(op::GETFH),
            status::OK,
        ),
        session_seed(
            "seq-access",
            s,
            lookup(in_session(1, ""), "file").op(op::ACCESS, |e| e.u32(0x3f)),
            status::OK,
        ),
        session_seed(
            "seq-readdir",
            s,
            in_session(1, "readdir").op(op::READDIR, |e| {
                e.u64(0);
                e.opaque_fixed(&[0; 8]);
                e.u32(4096);
                e.u32(8192);
                e.bitmap(&bitmap(&[attr::TYPE, attr::FILEID, attr::MODE]));
            }),
            status::OK,
        ),
        session_seed(
            "seq-readlink",
            s,
            lookup(in_session(1, ""), "link").bare(op::READLINK),
            status::OK,
        ),
        session_seed(
            "seq-open-read-close",
            s,
            close(io_op(
                open(in_session(1, "open"), "file", SHARE_READ, false).bare(op::GETFH),
                op::READ,
                CURRENT,
                0,
                8192,
            )),
            status::OK,
        ),
        session_seed(
            "seq-read-anonymous",
            s,
            io_op(
                lookup(in_session(1, ""), "file"),
                op::READ,
                ANONYMOUS,
                FILE_HOLE_END - 100,
                4096,
            ),
            status::OK,
        ),
        session_seed(
            "seq-read-bypass",
            s,
            io_op(lookup(in_session(1, ""), "file"), op::READ, BYPASS, 0, 100),
            status::OK,
        ),
        session_seed(
            "seq-read-plus-sparse",
            s,
            io_op(
                lookup(in_session(2, "read_plus"), "file"),
                op::READ_PLUS,
                ANONYMOUS,
                0,
                256 * 1024,
            ),
            status::OK,
        ),
        session_seed(
            "seq-open-read-plus-close",
            s,
            close(io_op(
                open(in_session(2, ""), "file", SHARE_READ, false),
                op::READ_PLUS,
                CURRENT,
                FILE_DATA as u64 - 10,
                64 * 1024,
            )),
            status::OK,
        ),
        session_seed(
            "seq-seek-data",
            s,
            seek(
                lookup(in_session(2, "seek"), "file"),
                FILE_DATA as u64,
                false,
            ),
            status::OK,
        ),
        session_seed(
            "seq-seek-hole",
            s,
            seek(lookup(in_session(2, ""), "file"), 0, true),
            status::OK,
        ),
        session_seed(
            "seq-open-create-write-commit-close",
            s,
            close(getattr(
                write(
                    open(in_session(1, "write"), "new", SHARE_BOTH, true),
                    CURRENT,
                    0,
                    UNSTABLE,
                    b"hello, sluice\n",
                )
                .op(op::COMMIT, |e| {
                    e.u64(0);
                    e.u32(0);
                }),
                &bitmap(&[attr::SIZE, attr::CHANGE]),
            )),
            status::OK,
        ),
        session_seed(
            "seq-write-anonymous-filesync",
            s,
            write(
                lookup(in_session(1, ""), "empty"),
                ANONYMOUS,
                100,
                FILE_SYNC,
                &[0x55; 300],
            ),
            status::OK,
        ),
        session_seed(
            "seq-allocate-deallocate",
            s,
            close(seek(
                range_op(
                    range_op(
                        open(in_session(2, "sparse"), "sparse", SHARE_BOTH, true),
                        op::ALLOCATE,
                        0,
                        64 * 1024,
                    ),
                    op::DEALLOCATE,
                    8192,
                    32 * 1024,
                ),
                0,
                true,
            )),
            status::OK,
        ),
        session_seed(
            "seq-setattr-mode-size",
            s,
            getattr(
                lookup(in_session(1, ""), "file").op(op::SETATTR, |e| {
                    stateid(e, ANONYMOUS);
                    e.bitmap(&bitmap(&[attr::SIZE, attr::MODE]));
                    let mut v = Encoder::new();
                    v.u64(10_000);
                    v.u32(0o640);
                    e.opaque(v.as_slice());
                }),
                &bitmap(&[attr::SIZE, attr::MODE]),
            ),
            status::OK,
        ),
        session_seed(
            "seq-setattr-owner-times",
            s,
            lookup(in_session(1, ""), "file").op(op::SETATTR, |e| {
                stateid(e, ANONYMOUS);
                e.bitmap(&bitmap(&[
                    attr::OWNER,
                    attr::OWNER_GROUP,
                    attr::TIME_ACCESS_SET,
                    attr::TIME_MODIFY_SET,
                ]));
                let mut v = Encoder::new();
                v.string("1000");
                v.string("100");
                v.u32(0); // atime: server time
                v.u32(1); // mtime: this time
                v.i64(1_000_000);
                v.u32(5);
                e.opaque(v.as_slice());
            }),
            status::OK,
        ),
        session_seed(
            "seq-create-dir-getfh",
            s,
            in_session(1, "mkdir")
                .op(op::CREATE, |e| {
                    e.u32(ftype::DIR);
                    e.string("newdir");
                    fattr_mode(e, 0o750);
                })
                .bare(op::GETFH),
            status::OK,
        ),
        session_seed(
            "seq-create-symlink-readlink",
            s,
            in_session(1, "")
                .op(op::CREATE, |e| {
                    e.u32(ftype::LNK);
                    e.opaque(b"dir/inner");
                    e.string("sym");
                    fattr_empty(e);
                })
                .bare(op::READLINK),
            status::OK,
        ),
        session_seed(
            "seq-create-fifo",
            s,
            in_session(1, "").op(op::CREATE, |e| {
                e.u32(ftype::FIFO);
                e.string("pipe");
                fattr_mode(e, 0o600);
            }),
            status::OK,
        ),
        session_seed(
            "seq-create-remove",
            s,
            in_session(1, "rm")
                .op(op::CREATE, |e| {
                    e.u32(ftype::DIR);
                    e.string("gone");
                    fattr_empty(e);
                })
                .bare(op::PUTROOTFH)
                .op(op::REMOVE, |e| e.string("gone")),
            status::OK,
        ),
        session_seed(
            "seq-rename",
            s,
            in_session(1, "mv").bare(op::SAVEFH).op(op::RENAME, |e| {
                e.string("empty");
                e.string("renamed");
            }),
            status::OK,
        ),
        session_seed(
            "seq-link",
            s,
            lookup(in_session(1, "ln"), "file")
                .bare(op::SAVEFH)
                .bare(op::PUTROOTFH)
                .op(op::LINK, |e| e.string("hardlink")),
            status::OK,
        ),
        session_seed(
            "seq-lock-lockt-locku",
            s,
            open(in_session(1, "lock"), "file", SHARE_BOTH, false)
                .op(op::LOCK, |e| {
                    e.u32(WRITE_LT);
                    e.bool(false);
                    e.u64(0);
                    e.u64(100);
                    e.bool(true); // new lock owner
                    e.u32(0);
                    stateid(e, CURRENT);
                    e.u32(0);
                    e.u64(0);
                    e.opaque(b"fuzz-lock-owner");
                })
                .op(op::LOCKT, |e| {
                    e.u32(READ_LT);
                    e.u64(200);
                    e.u64(u64::MAX);
                    e.u64(0);
                    e.opaque(b"another-owner");
                })
                .op(op::LOCKU, |e| {
                    e.u32(WRITE_LT);
                    e.u32(0);
                    stateid(e, CURRENT);
                    e.u64(0);
                    e.u64(100);
                }),
            status::OK,
        ),
        session_seed(
            "seq-open-downgrade",
            s,
            close(
                open(in_session(1, ""), "file", SHARE_BOTH, false).op(op::OPEN_DOWNGRADE, |e| {
                    stateid(e, CURRENT);
                    e.u32(0);
                    e.u32(SHARE_READ);
                    e.u32(0);
                }),
            ),
            status::OK,
        ),
        session_seed(
            "seq-open-exclusive41",
            s,
            in_session(1, "excl").op(op::OPEN, |e| {
                e.u32(0);
                e.u32(SHARE_WRITE);
                e.u32(0);
                e.u64(0);
                e.opaque(b"fuzz-owner");
                e.u32(1);
                e.u32(3); // EXCLUSIVE4_1
                e.opaque_fixed(&[1, 2, 3, 4, 5, 6, 7, 8]);
                fattr_mode(e, 0o600);
                e.u32(0);
                e.string("exclusive");
            }),
            status::OK,
        ),
        session_seed(
            "seq-open-claim-fh",
            s,
            close(lookup(in_session(1, ""), "file").op(op::OPEN, |e| {
                e.u32(0);
                e.u32(SHARE_READ);
                e.u32(0);
                e.u64(0);
                e.opaque(b"fuzz-owner");
                e.u32(0);
                e.u32(4); // CLAIM_FH
            })),
            status::OK,
        ),
        session_seed(
            "seq-test-free-stateid",
            s,
            Compound::new(1, "")
                .sequence(&NO_SESSION, 1, 0, false)
                .op(op::TEST_STATEID, |e| {
                    e.u32(2);
                    stateid(e, ANONYMOUS);
                    stateid(e, (1, [7; 12]));
                })
                .op(op::FREE_STATEID, |e| stateid(e, (1, [7; 12]))),
            status::BAD_STATEID,
        ),
        session_seed(
            "seq-secinfo",
            s,
            in_session(1, "")
                .op(op::SECINFO, |e| e.string("file"))
                .bare(op::PUTROOTFH)
                .op(op::SECINFO_NO_NAME, |e| e.u32(0)),
            status::OK,
        ),
        session_seed(
            "seq-verify-nverify",
            s,
            in_session(1, "")
                .op(op::VERIFY, |e| {
                    e.bitmap(&bitmap(&[attr::TYPE]));
                    let mut v = Encoder::new();
                    v.u32(ftype::DIR);
                    e.opaque(v.as_slice());
                })
                .op(op::NVERIFY, |e| {
                    e.bitmap(&bitmap(&[attr::TYPE]));
                    let mut v = Encoder::new();
                    v.u32(ftype::REG);
                    e.opaque(v.as_slice());
                }),
            status::OK,
        ),
        session_seed(
            "seq-getattr-device",
            s,
            getattr(
                lookup(in_session(1, ""), "null"),
                &bitmap(&[attr::TYPE, attr::RAWDEV, attr::MODE]),
            ),
            status::OK,
        ),
        session_seed(
            "seq-open-fifo-nocreate",
            s,
            open(in_session(1, ""), "fifo", SHARE_READ, false),
            status::WRONG_TYPE,
        ),
        // Once hung the server: the open of an existing FIFO waited for a
        // writer.
        session_seed(
            "seq-open-unchecked-fifo",
            s,
            open(in_session(1, ""), "fifo", SHARE_READ, true),
            status::WRONG_TYPE,
        ),
        session_seed(
            "seq-open-unchecked-device",
            s,
            open(in_session(1, ""), "null", SHARE_BOTH, true),
            status::WRONG_TYPE,
        ),
        session_seed(
            "seq-reclaim-complete-again",
            s,
            Compound::new(1, "")
                .sequence(&NO_SESSION, 1, 0, false)
                .op(op::RECLAIM_COMPLETE, |e| e.bool(false)),
            status::COMPLETE_ALREADY,
        ),
        session_seed(
            "user-open-create-write",
            s | harness::FLAG_USER,
            close(write(
                open(in_session(1, "user"), "owned-by-1000", SHARE_BOTH, true),
                CURRENT,
                0,
                FILE_SYNC,
                b"x",
            )),
            status::OK,
        ),
        session_seed(
            "none-getattr",
            s | harness::FLAG_AUTH_NONE,
            getattr(
                lookup(in_session(1, ""), "dir"),
                &bitmap(&[attr::OWNER, attr::MODE]),
            ),
            status::OK,
        ),
        session_seed(
            "replay-slot0",
            s | harness::FLAG_REPLAY,
            getattr(in_session(1, ""), &bitmap(&[attr::TYPE])),
            status::OK,
        ),
        session_seed(
            "bad-slot",
            s | harness::FLAG_RAW_SLOT,
            Compound::new(1, "").sequence(&NO_SESSION, 1, 9, false),
            status::BADSLOT,
        ),
    ];
    let w = harness::MODE_WRAPPED;
    seeds.extend([
        session_seed(
            "wrapped-exchange-id",
            w,
            Compound::new(1, "xid").op(op::EXCHANGE_ID, |e| {
                e.opaque_fixed(&[9; 8]);
                e.string("fuzz-client");
                e.u32(0);
                e.u32(0);
                e.u32(0);
            }),
            status::OK,
        ),
        session_seed(
            "wrapped-create-session-stale",
            w,
            Compound::new(1, "").op(op::CREATE_SESSION, |e| {
                let channel = |max: u32, cached: u32, ops: u32, reqs: u32| ChannelAttrs4 {
                    header_pad: 0,
                    max_request: max,
                    max_response: max,
                    max_response_cached: cached,
                    max_ops: ops,
                    max_requests: reqs,
                    rdma_ird: None,
                };
                CreateSessionArgs {
                    clientid: 0x1234,
                    sequence: 1,
                    flags: 0,
                    fore: channel(65536, 4096, 8, 4),
                    back: channel(4096, 0, 2, 1),
                    cb_program: 0x4000_0000,
                    cb_sec: vec![CallbackSec::Sys(AuthSysParms {
                        machine: b"cb".to_vec(),
                        ..Default::default()
                    })],
                }
                .encode(e)
            }),
            status::STALE_CLIENTID,
        ),
        session_seed(
            "wrapped-destroy-session",
            w,
            Compound::new(1, "").op(op::DESTROY_SESSION, |e| e.opaque_fixed(&[3; 16])),
            status::BADSESSION,
        ),
        session_seed(
            "wrapped-bind-conn",
            w,
            Compound::new(1, "").op(op::BIND_CONN_TO_SESSION, |e| {
                e.opaque_fixed(&[3; 16]);
                e.u32(3);
                e.bool(false);
            }),
            status::BADSESSION,
        ),
        session_seed(
            "wrapped-destroy-clientid",
            w,
            Compound::new(1, "").op(op::DESTROY_CLIENTID, |e| e.u64(77)),
            status::STALE_CLIENTID,
        ),
        session_seed(
            "wrapped-no-session",
            w,
            Compound::new(2, "").bare(op::PUTROOTFH),
            status::OP_NOT_IN_SESSION,
        ),
        session_seed(
            "wrapped-minor0",
            w,
            Compound::new(0, "v4.0").bare(op::PUTROOTFH),
            status::MINOR_VERS_MISMATCH,
        ),
        session_seed("wrapped-empty", w, Compound::new(1, "empty"), status::OK),
    ]);
    let raw = harness::MODE_RAW;
    let mut null = Encoder::new();
    wire::call_header(&mut null, 1, rpc::NFS_PROGRAM, 4, 0, Auth::None);
    let mut badvers = Encoder::new();
    wire::call_header(&mut badvers, 2, rpc::NFS_PROGRAM, 3, 1, Auth::ROOT);
    let mut badproc = Encoder::new();
    wire::call_header(&mut badproc, 3, rpc::NFS_PROGRAM, 4, 7, Auth::ROOT);
    seeds.extend([
        Seed {
            name: "raw-null",
            input: harness::input(raw, null.as_slice()),
            expect: None,
        },
        Seed {
            name: "raw-prog-mismatch",
            input: harness::input(raw, badvers.as_slice()),
            expect: None,
        },
        Seed {
            name: "raw-proc-unavail",
            input: harness::input(raw, badproc.as_slice()),
            expect: None,
        },
        Seed {
            name: "raw-compound-exchange-id",
            input: harness::input(
                raw,
                &wire::compound_call(
                    4,
                    Auth::Sys { uid: 7, gid: 7 },
                    &Compound::new(1, "raw")
                        .op(op::EXCHANGE_ID, |e| {
                            e.opaque_fixed(&[4; 8]);
                            e.string("raw-client");
                            e.u32(0);
                            e.u32(0);
                            e.u32(0);
                        })
                        .encode(),
                ),
            ),
            expect: Some(status::OK),
        },
    ]);
    seeds
}

/// Record-marked streams for `rpc_record`: the first byte is the small
/// bound (times four) of the second assembler.
fn rpc_record_seeds() -> Vec<(&'static str, Vec<u8>)> {
    fn mark(len: usize, last: bool) -> [u8; 4] {
        (len as u32 | if last { rpc::LAST_FRAGMENT } else { 0 }).to_be_bytes()
    }
    fn one(bound: u8, record: &[u8]) -> Vec<u8> {
        let mut v = vec![bound];
        v.extend_from_slice(&mark(record.len(), true));
        v.extend_from_slice(record);
        v
    }
    let mut null = Encoder::new();
    wire::call_header(&mut null, 0x11, rpc::NFS_PROGRAM, 4, 0, Auth::None);
    let null = null.into_inner();
    let getattr = Compound::new(1, "t")
        .sequence(&[1; 16], 1, 0, false)
        .bare(op::PUTROOTFH)
        .op(op::GETATTR, |e| e.bitmap(&[1 << attr::TYPE]));
    let call = wire::compound_call(0x22, Auth::ROOT, &getattr.encode());
    let mut split = vec![40];
    for (i, part) in call.chunks(24).enumerate() {
        split.extend_from_slice(&mark(part.len(), (i + 1) * 24 >= call.len()));
        split.extend_from_slice(part);
    }
    let mut two = one(200, &null);
    two.extend_from_slice(&one(0, &call)[1..]);
    let mut groups = Encoder::new();
    groups.u32(0x33);
    groups.u32(rpc::MSG_CALL);
    groups.u32(2);
    groups.u32(rpc::NFS_PROGRAM);
    groups.u32(4);
    groups.u32(0);
    let mut cred = Encoder::new();
    cred.u32(7);
    cred.string("host.example");
    cred.u32(1000);
    cred.u32(100);
    cred.u32(3);
    for g in [4, 24, 27] {
        cred.u32(g);
    }
    groups.u32(rpc::AUTH_SYS);
    groups.opaque(cred.as_slice());
    groups.u32(rpc::AUTH_NONE);
    groups.u32(0);
    let mut rpcv3 = null.clone();
    rpcv3[8..12].copy_from_slice(&3u32.to_be_bytes());
    let mut reply = null.clone();
    reply[4..8].copy_from_slice(&rpc::MSG_REPLY.to_be_bytes());
    let mut gss = null.clone();
    gss[24..28].copy_from_slice(&6u32.to_be_bytes());
    let mut huge = vec![8];
    huge.extend_from_slice(&mark(3 << 20, true));
    huge.extend_from_slice(&null);
    let mut empty_frags = vec![1];
    empty_frags.extend_from_slice(&mark(0, false));
    empty_frags.extend_from_slice(&mark(0, false));
    empty_frags.extend_from_slice(&mark(null.len(), true));
    empty_frags.extend_from_slice(&null);
    vec![
        ("null", one(255, &null)),
        ("compound-fragmented", split),
        ("two-records", two),
        ("auth-sys-groups", one(50, groups.as_slice())),
        ("rpc-version-3", one(10, &rpcv3)),
        ("reply-message", one(10, &reply)),
        ("flavor-gss", one(10, &gss)),
        ("record-too-large", huge),
        ("empty-fragments", empty_frags),
        ("truncated", one(10, &call[..call.len() - 9])),
    ]
}

/// Scripts and data for `xdr` (see `fuzz_targets/xdr.rs`).
fn xdr_seeds() -> Vec<(&'static str, Vec<u8>)> {
    fn script(ops: &[u8], data: &Encoder) -> Vec<u8> {
        let mut v = vec![ops.len() as u8];
        v.extend_from_slice(ops);
        v.extend_from_slice(data.as_slice());
        v
    }
    let mut ints = Encoder::new();
    ints.u32(7);
    ints.i32(-7);
    ints.u64(1 << 40);
    ints.i64(-1);
    ints.bool(true);
    let mut opaques = Encoder::new();
    opaques.opaque(b"hello");
    opaques.opaque_fixed(b"fixed-ten!");
    opaques.opaque_fixed(&[9; 16]);
    opaques.opaque_fixed(&[1; 7]);
    let mut arrays = Encoder::new();
    arrays.u32(2);
    arrays.u32(0xdead);
    arrays.u32(0xbeef);
    arrays.bitmap(&[1, 2, 3]);
    arrays.u32(0xffff_ffff);
    vec![
        ("integers", script(&[0x00, 0x01, 0x02, 0x03, 0x04], &ints)),
        // opaque limit 10, fixed 10, array 16, array 7
        ("opaques", script(&[0x26, 0x25, 0x07, 0x08], &opaques)),
        // count limit 5, two u32, bitmap limit 5, count limit 0, rest
        (
            "arrays",
            script(&[0x19, 0x00, 0x00, 0x1a, 0x09, 0x0b], &arrays),
        ),
        ("bad-bool", script(&[0x04, 0x04], &ints)),
    ]
}

fn named(seeds: Vec<(&str, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    seeds
        .into_iter()
        .map(|(n, d)| (format!("seed-{n}"), d))
        .collect()
}

fn write_dir(dir: &Path, files: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with("seed-") {
            std::fs::remove_file(e.path())?;
        }
    }
    for (name, data) in files {
        std::fs::write(dir.join(name), data)?;
    }
    println!("{}: {} seeds", dir.display(), files.len());
    Ok(())
}

fn main() -> std::io::Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));

    let seeds = compound_seeds();
    let mut h = Harness::new();
    let mut failed = 0;
    for s in &seeds {
        h.reset();
        let reply = h.run(&s.input);
        let got = reply.as_deref().and_then(wire::reply_first_op);
        let ok = match (s.expect, got) {
            (Some(want), Some((st, _))) => st == want,
            (None, _) => reply.is_some(),
            (Some(_), None) => false,
        };
        if !ok {
            eprintln!(
                "seed {}: expected status {:?}, got {:?}",
                s.name, s.expect, got
            );
            failed += 1;
        }
    }
    if failed > 0 {
        eprintln!("{failed} compound seeds did not get the expected answer");
        std::process::exit(1);
    }
    let compound: Vec<(String, Vec<u8>)> = seeds
        .into_iter()
        .map(|s| (format!("seed-{}", s.name), s.input))
        .collect();
    write_dir(&out.join("compound"), &compound)?;
    write_dir(&out.join("rpc_record"), &named(rpc_record_seeds()))?;
    write_dir(&out.join("xdr"), &named(xdr_seeds()))?;
    Ok(())
}
