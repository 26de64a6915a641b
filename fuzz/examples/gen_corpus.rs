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
use sluice::nfs4::msg::*;
use sluice::nfs4::Nfsstat4;
use sluice::rpc;
use sluice::xdr::Encoder;
use sluice_fuzz::harness::{self, Harness, FILE_DATA, FILE_HOLE_END};
use sluice_fuzz::msg;
use sluice_fuzz::wire::{self, Auth, Compound};
use std::path::{Path, PathBuf};

const NO_SESSION: [u8; 16] = [0; 16];

/// The "current stateid" of RFC 8881 section 16.2.3.1.2.
const CURRENT: Stateid4 = Stateid4::CURRENT;
/// The anonymous stateid.
const ANONYMOUS: Stateid4 = Stateid4::ANONYMOUS;
/// The READ bypass stateid.
const BYPASS: Stateid4 = Stateid4::BYPASS;

const SHARE_READ: u32 = SHARE_ACCESS_READ;
const SHARE_WRITE: u32 = SHARE_ACCESS_WRITE;
const SHARE_BOTH: u32 = SHARE_ACCESS_BOTH;
/// stable_how4 FILE_SYNC4.
const FILE_SYNC: u32 = 2;
/// stable_how4 UNSTABLE4.
const UNSTABLE: u32 = 0;

fn bitmap(list: &[u32]) -> Bitmap4 {
    Bitmap4::of(list)
}

/// fattr4 with the attributes `list` and their values `vals` writes.
fn fattr(list: &[u32], vals: impl FnOnce(&mut Encoder)) -> Fattr4 {
    let mut v = Encoder::new();
    vals(&mut v);
    Fattr4 {
        mask: bitmap(list),
        vals: v.into_inner(),
    }
}

/// fattr4 with MODE only.
fn fattr_mode(mode: u32) -> Fattr4 {
    fattr(&[attr::MODE], |v| v.u32(mode))
}

/// fattr4 with nothing in it.
fn fattr_empty() -> Fattr4 {
    Fattr4::default()
}

/// Every attribute the server supports.
fn all_attrs() -> Bitmap4 {
    Bitmap4::trimmed(&sluice::server::attrs::supported())
}

fn getattr(c: Compound, attrs: &Bitmap4) -> Compound {
    c.op_args(op::GETATTR, attrs)
}

fn lookup(c: Compound, name: &str) -> Compound {
    c.op_args(op::LOOKUP, &Component4::new(name))
}

/// The open or lock owner of the seeds.
fn owner(name: &str) -> StateOwner4 {
    StateOwner4 {
        clientid: 0, // the session's client id is used
        owner: name.as_bytes().to_vec(),
    }
}

/// OPEN4args (seqid 0, deny none, owner "fuzz-owner").
fn open_args(access: u32, openhow: Openflag4, claim: OpenClaim4) -> OpenArgs {
    OpenArgs {
        seqid: 0,
        share_access: access,
        share_deny: 0,
        owner: owner("fuzz-owner"),
        openhow,
        claim,
    }
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
    let openhow = if create {
        Openflag4::Create(Createhow4::Unchecked(fattr_mode(0o644)))
    } else {
        Openflag4::NoCreate
    };
    c.op_args(
        op::OPEN,
        &open_args(access, openhow, OpenClaim4::Null(Component4::new(name))),
    )
}

fn close(c: Compound) -> Compound {
    c.op_args(
        op::CLOSE,
        &CloseArgs {
            seqid: 0,
            stateid: CURRENT,
        },
    )
}

/// READ or READ_PLUS (whose arguments are those of READ).
fn io_op(c: Compound, opnum: u32, stateid: Stateid4, offset: u64, count: u32) -> Compound {
    c.op_args(
        opnum,
        &ReadArgs {
            stateid,
            offset,
            count,
        },
    )
}

fn write(c: Compound, stateid: Stateid4, offset: u64, stable: u32, data: &[u8]) -> Compound {
    c.op(op::WRITE, |e| {
        WriteArgs {
            stateid,
            offset,
            stable,
            data,
        }
        .encode(e)
    })
}

/// ALLOCATE or DEALLOCATE of the current stateid.
fn range_op(c: Compound, opnum: u32, offset: u64, length: u64) -> Compound {
    c.op_args(
        opnum,
        &AllocateArgs {
            stateid: CURRENT,
            offset,
            length,
        },
    )
}

fn seek(c: Compound, offset: u64, hole: bool) -> Compound {
    c.op_args(
        op::SEEK,
        &SeekArgs {
            stateid: ANONYMOUS,
            offset,
            what: hole as u32,
        },
    )
}

/// A stateid no client holds.
const UNKNOWN_STATEID: Stateid4 = Stateid4 {
    seqid: 1,
    other: [7; 12],
};

/// EXCHANGE_ID4args of a new client: no flags, SP4_NONE, no
/// implementation id.
fn exchange_id(verifier: [u8; 8], owner: &str) -> ExchangeIdArgs {
    ExchangeIdArgs {
        verifier,
        ownerid: owner.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// CREATE_SESSION4args of a client id the server never gave out.
fn create_session() -> CreateSessionArgs {
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
            in_session(1, "readdir").op_args(
                op::READDIR,
                &ReaddirArgs {
                    cookie: 0,
                    verifier: [0; 8],
                    dircount: 4096,
                    maxcount: 8192,
                    attr_request: bitmap(&[attr::TYPE, attr::FILEID, attr::MODE]),
                },
            ),
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
                .op_args(
                    op::COMMIT,
                    &CommitArgs {
                        offset: 0,
                        count: 0,
                    },
                ),
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
            "seq-copy-file-into-empty",
            s,
            lookup(
                lookup(in_session(2, ""), "file")
                    .bare(op::SAVEFH)
                    .bare(op::PUTROOTFH),
                "empty",
            )
            .op_args(
                op::COPY,
                &CopyArgs {
                    src_stateid: ANONYMOUS,
                    dst_stateid: ANONYMOUS,
                    src_offset: 0,
                    dst_offset: 0,
                    count: 0,
                    consecutive: true,
                    synchronous: false,
                    source_server: Vec::new(),
                },
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
                lookup(in_session(1, ""), "file").op_args(
                    op::SETATTR,
                    &SetattrArgs {
                        stateid: ANONYMOUS,
                        attrs: fattr(&[attr::SIZE, attr::MODE], |v| {
                            v.u64(10_000);
                            v.u32(0o640);
                        }),
                    },
                ),
                &bitmap(&[attr::SIZE, attr::MODE]),
            ),
            status::OK,
        ),
        session_seed(
            "seq-setattr-owner-times",
            s,
            lookup(in_session(1, ""), "file").op_args(
                op::SETATTR,
                &SetattrArgs {
                    stateid: ANONYMOUS,
                    attrs: fattr(
                        &[
                            attr::OWNER,
                            attr::OWNER_GROUP,
                            attr::TIME_ACCESS_SET,
                            attr::TIME_MODIFY_SET,
                        ],
                        |v| {
                            v.string("1000");
                            v.string("100");
                            v.u32(0); // atime: server time
                            v.u32(1); // mtime: this time
                            v.i64(1_000_000);
                            v.u32(5);
                        },
                    ),
                },
            ),
            status::OK,
        ),
        session_seed(
            "seq-create-dir-getfh",
            s,
            in_session(1, "mkdir")
                .op_args(
                    op::CREATE,
                    &CreateArgs {
                        objtype: Createtype4::Dir,
                        objname: Component4::new("newdir"),
                        attrs: fattr_mode(0o750),
                    },
                )
                .bare(op::GETFH),
            status::OK,
        ),
        session_seed(
            "seq-create-symlink-readlink",
            s,
            in_session(1, "")
                .op_args(
                    op::CREATE,
                    &CreateArgs {
                        objtype: Createtype4::Link(b"dir/inner".to_vec()),
                        objname: Component4::new("sym"),
                        attrs: fattr_empty(),
                    },
                )
                .bare(op::READLINK),
            status::OK,
        ),
        session_seed(
            "seq-create-fifo",
            s,
            in_session(1, "").op_args(
                op::CREATE,
                &CreateArgs {
                    objtype: Createtype4::Fifo,
                    objname: Component4::new("pipe"),
                    attrs: fattr_mode(0o600),
                },
            ),
            status::OK,
        ),
        session_seed(
            "seq-create-remove",
            s,
            in_session(1, "rm")
                .op_args(
                    op::CREATE,
                    &CreateArgs {
                        objtype: Createtype4::Dir,
                        objname: Component4::new("gone"),
                        attrs: fattr_empty(),
                    },
                )
                .bare(op::PUTROOTFH)
                .op_args(op::REMOVE, &Component4::new("gone")),
            status::OK,
        ),
        session_seed(
            "seq-rename",
            s,
            in_session(1, "mv").bare(op::SAVEFH).op_args(
                op::RENAME,
                &RenameArgs {
                    oldname: Component4::new("empty"),
                    newname: Component4::new("renamed"),
                },
            ),
            status::OK,
        ),
        session_seed(
            "seq-link",
            s,
            lookup(in_session(1, "ln"), "file")
                .bare(op::SAVEFH)
                .bare(op::PUTROOTFH)
                .op_args(op::LINK, &Component4::new("hardlink")),
            status::OK,
        ),
        session_seed(
            "seq-lock-lockt-locku",
            s,
            open(in_session(1, "lock"), "file", SHARE_BOTH, false)
                .op_args(
                    op::LOCK,
                    &LockArgs {
                        locktype: lock_type::WRITE,
                        reclaim: false,
                        offset: 0,
                        length: 100,
                        locker: Locker4::New(OpenToLockOwner4 {
                            open_seqid: 0,
                            open_stateid: CURRENT,
                            lock_seqid: 0,
                            lock_owner: owner("fuzz-lock-owner"),
                        }),
                    },
                )
                .op_args(
                    op::LOCKT,
                    &LocktArgs {
                        locktype: lock_type::READ,
                        offset: 200,
                        length: u64::MAX,
                        owner: owner("another-owner"),
                    },
                )
                .op_args(
                    op::LOCKU,
                    &LockuArgs {
                        locktype: lock_type::WRITE,
                        seqid: 0,
                        lock_stateid: CURRENT,
                        offset: 0,
                        length: 100,
                    },
                ),
            status::OK,
        ),
        // An OPEN for both, then a downgrade to read alone, which no OPEN
        // of the open asked for: NFS4ERR_INVAL (RFC 8881 section 18.18.3).
        session_seed(
            "seq-open-downgrade",
            s,
            close(open(in_session(1, ""), "file", SHARE_BOTH, false).op_args(
                op::OPEN_DOWNGRADE,
                &OpenDowngradeArgs {
                    stateid: CURRENT,
                    seqid: 0,
                    share_access: SHARE_READ,
                    share_deny: 0,
                },
            )),
            status::INVAL,
        ),
        session_seed(
            "seq-open-exclusive41",
            s,
            in_session(1, "excl").op_args(
                op::OPEN,
                &open_args(
                    SHARE_WRITE,
                    Openflag4::Create(Createhow4::Exclusive41 {
                        verifier: [1, 2, 3, 4, 5, 6, 7, 8],
                        attrs: fattr_mode(0o600),
                    }),
                    OpenClaim4::Null(Component4::new("exclusive")),
                ),
            ),
            status::OK,
        ),
        session_seed(
            "seq-open-claim-fh",
            s,
            close(lookup(in_session(1, ""), "file").op_args(
                op::OPEN,
                &open_args(SHARE_READ, Openflag4::NoCreate, OpenClaim4::Fh),
            )),
            status::OK,
        ),
        session_seed(
            "seq-test-free-stateid",
            s,
            Compound::new(1, "")
                .sequence(&NO_SESSION, 1, 0, false)
                .op_args(
                    op::TEST_STATEID,
                    &TestStateidArgs {
                        stateids: vec![ANONYMOUS, UNKNOWN_STATEID],
                    },
                )
                .op_args(op::FREE_STATEID, &UNKNOWN_STATEID),
            status::BAD_STATEID,
        ),
        session_seed(
            "seq-secinfo",
            s,
            in_session(1, "")
                .op_args(op::SECINFO, &Component4::new("file"))
                .bare(op::PUTROOTFH)
                .op(op::SECINFO_NO_NAME, |e| e.u32(0)),
            status::OK,
        ),
        session_seed(
            "seq-verify-nverify",
            s,
            in_session(1, "")
                .op_args(op::VERIFY, &fattr(&[attr::TYPE], |v| v.u32(ftype::DIR)))
                .op_args(op::NVERIFY, &fattr(&[attr::TYPE], |v| v.u32(ftype::REG))),
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
            // Not cached (cachethis false): the replay is refused on the
            // op after SEQUENCE (RFC 8881 section 2.10.6.1.3).
            status::RETRY_UNCACHED_REP,
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
            Compound::new(1, "xid").op_args(op::EXCHANGE_ID, &exchange_id([9; 8], "fuzz-client")),
            status::OK,
        ),
        session_seed(
            "wrapped-create-session-stale",
            w,
            Compound::new(1, "").op_args(op::CREATE_SESSION, &create_session()),
            status::STALE_CLIENTID,
        ),
        session_seed(
            "wrapped-destroy-session",
            w,
            Compound::new(1, "").op_args(op::DESTROY_SESSION, &[3u8; 16]),
            status::BADSESSION,
        ),
        session_seed(
            "wrapped-bind-conn",
            w,
            Compound::new(1, "").op_args(
                op::BIND_CONN_TO_SESSION,
                &BindConnToSessionArgs {
                    sessionid: [3; 16],
                    dir: cdfc::FORE_OR_BOTH,
                    use_conn_in_rdma_mode: false,
                },
            ),
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
                        .op_args(op::EXCHANGE_ID, &exchange_id([4; 8], "raw-client"))
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
        .op_args(op::GETATTR, &bitmap(&[attr::TYPE]));
    let call = wire::compound_call(0x22, Auth::ROOT, &getattr.encode());
    let mut split = vec![40];
    for (i, part) in call.chunks(24).enumerate() {
        split.extend_from_slice(&mark(part.len(), (i + 1) * 24 >= call.len()));
        split.extend_from_slice(part);
    }
    let mut two = one(200, &null);
    two.extend_from_slice(&one(0, &call)[1..]);
    let mut groups = Encoder::new();
    rpc::call_header(
        &mut groups,
        0x33,
        rpc::NFS_PROGRAM,
        4,
        0,
        &rpc::CallCred::Sys {
            stamp: 7,
            machine: b"host.example".to_vec(),
            uid: 1000,
            gid: 100,
            gids: vec![4, 24, 27],
        },
    );
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

/// `msg` seeds: one or more values of every message type (each variant
/// of the unions at least once), encoded after their type's byte.
fn msg_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Seeds::default();
    let sid = Stateid4 {
        seqid: 3,
        other: *b"stateid-0123",
    };
    let session = *b"session-id-01234";
    let attrs = fattr(&[attr::SIZE, attr::MODE], |v| {
        v.u64(4096);
        v.u32(0o644);
    });
    let cinfo = ChangeInfo4 {
        atomic: true,
        before: 10,
        after: 11,
    };
    let ace = Nfsace4 {
        acetype: 0,
        flag: 0,
        access_mask: 0x1f,
        who: b"EVERYONE@".to_vec(),
    };
    let impl_id = ImplId {
        domain: b"example.org".to_vec(),
        name: b"fuzz 1.0".to_vec(),
        date: Nfstime4 {
            seconds: 1_700_000_000,
            nseconds: 5,
        },
    };
    let ops = StateProtectOps {
        must_enforce: bitmap(&[op::PUTFH, op::EXCHANGE_ID, op::SEQUENCE]).0,
        must_allow: bitmap(&[op::BIND_CONN_TO_SESSION]).0,
    };
    let channel = ChannelAttrs4 {
        header_pad: 0,
        max_request: 1 << 20,
        max_response: 1 << 20,
        max_response_cached: 4096,
        max_ops: 16,
        max_requests: 8,
        rdma_ird: None,
    };
    let sys = CallbackSec::Sys(AuthSysParms {
        stamp: 1,
        machine: b"client".to_vec(),
        uid: 1000,
        gid: 100,
        gids: vec![4, 24],
    });
    let gss = CallbackSec::Gss(1, b"server-handle".to_vec(), b"client-handle".to_vec());
    let lock_owner = OpenToLockOwner4 {
        open_seqid: 0,
        open_stateid: sid,
        lock_seqid: 0,
        lock_owner: owner("lock-owner"),
    };
    let exist = ExistLockOwner4 {
        lock_stateid: sid,
        lock_seqid: 0,
    };
    let read_deleg = OpenReadDelegation4 {
        stateid: sid,
        recall: false,
        permissions: ace.clone(),
    };
    let write_deleg = OpenWriteDelegation4 {
        stateid: sid,
        recall: true,
        space_limit: SpaceLimit4::Size(1 << 30),
        permissions: ace.clone(),
    };
    let contention = OpenNoneDelegation4 {
        why: why_no_deleg::CONTENTION,
        later: true,
    };
    let calls = ReferringCallList4 {
        sessionid: session,
        calls: vec![ReferringCall4 {
            sequenceid: 4,
            slotid: 0,
        }],
    };
    let name = Component4::new("name");

    seeds.add(
        "compound-header",
        &CompoundHeader {
            tag: b"tag".to_vec(),
            minorversion: 1,
            numops: 3,
        },
    );
    seeds.add(
        "compound-res-header",
        &CompoundResHeader {
            status: status::NOENT,
            tag: b"tag".to_vec(),
            numres: 2,
        },
    );
    seeds.add(
        "sequence-args",
        &SequenceArgs {
            sessionid: session,
            sequenceid: 7,
            slotid: 1,
            highest_slotid: 3,
            cachethis: true,
        },
    );
    seeds.add(
        "sequence-res",
        &SequenceResOk {
            sessionid: session,
            sequenceid: 7,
            slotid: 1,
            highest_slotid: 3,
            target_highest_slotid: 3,
            status_flags: 0,
        },
    );
    seeds.add("exchange-id-args", &exchange_id([9; 8], "fuzz-client"));
    seeds.add(
        "exchange-id-args-mach-cred",
        &ExchangeIdArgs {
            flags: 0x1_0000,
            state_protect: StateProtectArgs::MachCred(ops.clone()),
            impl_id: vec![impl_id.clone()],
            ..exchange_id([1; 8], "mach-cred")
        },
    );
    seeds.add(
        "exchange-id-args-ssv",
        &ExchangeIdArgs {
            state_protect: StateProtectArgs::Ssv(ops.clone()),
            ..exchange_id([2; 8], "ssv")
        },
    );
    seeds.add(
        "exchange-id-res",
        &ExchangeIdResOk {
            clientid: 0x1234_5678_9abc,
            sequenceid: 1,
            flags: 0x0002_0000,
            state_protect: 0,
            owner_minor: 0,
            owner_major: b"sluice".to_vec(),
            scope: b"scope".to_vec(),
            impl_id: vec![impl_id.clone()],
        },
    );
    seeds.add("create-session-args", &create_session());
    seeds.add(
        "create-session-args-rdma-gss",
        &CreateSessionArgs {
            fore: ChannelAttrs4 {
                rdma_ird: Some(4),
                ..channel
            },
            cb_sec: vec![CallbackSec::None, gss.clone(), sys.clone()],
            ..create_session()
        },
    );
    seeds.add(
        "create-session-res",
        &CreateSessionResOk {
            sessionid: session,
            sequence: 1,
            flags: 0,
            fore: channel,
            back: channel,
        },
    );
    let bind = BindConnToSessionArgs {
        sessionid: session,
        dir: cdfc::FORE_OR_BOTH,
        use_conn_in_rdma_mode: false,
    };
    seeds.add("bind-conn-args", &bind);
    seeds.add(
        "bind-conn-res",
        &BindConnToSessionResOk {
            sessionid: bind.sessionid,
            dir: cdfc::FORE,
            use_conn_in_rdma_mode: true,
        },
    );
    let opens = [
        (
            "nocreate-null",
            Openflag4::NoCreate,
            OpenClaim4::Null(name.clone()),
        ),
        (
            "unchecked",
            Openflag4::Create(Createhow4::Unchecked(attrs.clone())),
            OpenClaim4::Null(name.clone()),
        ),
        (
            "guarded",
            Openflag4::Create(Createhow4::Guarded(fattr_empty())),
            OpenClaim4::Null(name.clone()),
        ),
        (
            "exclusive",
            Openflag4::Create(Createhow4::Exclusive([5; 8])),
            OpenClaim4::Null(name.clone()),
        ),
        (
            "exclusive41",
            Openflag4::Create(Createhow4::Exclusive41 {
                verifier: [6; 8],
                attrs: attrs.clone(),
            }),
            OpenClaim4::Null(name.clone()),
        ),
        (
            "previous",
            Openflag4::NoCreate,
            OpenClaim4::Previous(deleg::READ),
        ),
        (
            "delegate-cur",
            Openflag4::NoCreate,
            OpenClaim4::DelegateCur {
                stateid: sid,
                file: name.clone(),
            },
        ),
        (
            "delegate-prev",
            Openflag4::NoCreate,
            OpenClaim4::DelegatePrev(name.clone()),
        ),
        ("fh", Openflag4::NoCreate, OpenClaim4::Fh),
        (
            "deleg-cur-fh",
            Openflag4::NoCreate,
            OpenClaim4::DelegCurFh(sid),
        ),
        (
            "deleg-prev-fh",
            Openflag4::NoCreate,
            OpenClaim4::DelegPrevFh,
        ),
    ];
    for (variant, openhow, claim) in opens {
        seeds.add(
            &format!("open-args-{variant}"),
            &open_args(SHARE_BOTH, openhow, claim),
        );
    }
    let delegations = [
        ("none", OpenDelegation4::None),
        ("read", OpenDelegation4::Read(read_deleg.clone())),
        ("write", OpenDelegation4::Write(write_deleg.clone())),
        (
            "write-blocks",
            OpenDelegation4::Write(OpenWriteDelegation4 {
                space_limit: SpaceLimit4::Blocks {
                    num_blocks: 16,
                    bytes_per_block: 4096,
                },
                ..write_deleg.clone()
            }),
        ),
        ("none-ext-contention", OpenDelegation4::NoneExt(contention)),
        (
            "none-ext-not-wanted",
            OpenDelegation4::NoneExt(OpenNoneDelegation4 {
                why: why_no_deleg::NOT_WANTED,
                later: false,
            }),
        ),
    ];
    for (variant, delegation) in delegations {
        seeds.add(
            &format!("open-res-{variant}"),
            &OpenResOk {
                stateid: sid,
                cinfo: cinfo.clone(),
                rflags: OPEN_RESULT_LOCKTYPE_POSIX,
                attrset: bitmap(&[attr::MODE]),
                delegation,
            },
        );
    }
    seeds.add(
        "open-downgrade-args",
        &OpenDowngradeArgs {
            stateid: sid,
            seqid: 0,
            share_access: SHARE_READ,
            share_deny: 0,
        },
    );
    seeds.add(
        "close-args",
        &CloseArgs {
            seqid: 0,
            stateid: sid,
        },
    );
    seeds.add(
        "lock-args-new",
        &LockArgs {
            locktype: lock_type::WRITE,
            reclaim: false,
            offset: 0,
            length: u64::MAX,
            locker: Locker4::New(lock_owner.clone()),
        },
    );
    seeds.add(
        "lock-args-existing",
        &LockArgs {
            locktype: lock_type::READW,
            reclaim: true,
            offset: 100,
            length: 10,
            locker: Locker4::Existing(exist.clone()),
        },
    );
    seeds.add(
        "lock-denied",
        &LockDenied4 {
            offset: 0,
            length: 100,
            locktype: lock_type::WRITE,
            owner: owner("holder"),
        },
    );
    seeds.add(
        "lockt-args",
        &LocktArgs {
            locktype: lock_type::READ,
            offset: 0,
            length: 1,
            owner: owner("tester"),
        },
    );
    seeds.add(
        "locku-args",
        &LockuArgs {
            locktype: lock_type::WRITE,
            seqid: 0,
            lock_stateid: sid,
            offset: 0,
            length: u64::MAX,
        },
    );
    seeds.add(
        "read-args",
        &ReadArgs {
            stateid: BYPASS,
            offset: 4096,
            count: 65536,
        },
    );
    seeds.0.push((
        "seed-write-args".to_string(),
        msg::write_input(&WriteArgs {
            stateid: sid,
            offset: 10,
            stable: FILE_SYNC,
            data: b"some data",
        }),
    ));
    seeds.add(
        "write-res",
        &WriteResOk {
            count: 9,
            committed: FILE_SYNC,
            verifier: [8; 8],
        },
    );
    seeds.add(
        "commit-args",
        &CommitArgs {
            offset: 0,
            count: 0,
        },
    );
    seeds.add(
        "test-stateid-args",
        &TestStateidArgs {
            stateids: vec![sid, ANONYMOUS, UNKNOWN_STATEID],
        },
    );
    seeds.add(
        "test-stateid-res",
        &TestStateidResOk {
            codes: vec![status::OK, status::BAD_STATEID],
        },
    );
    seeds.add(
        "seek-args",
        &SeekArgs {
            stateid: sid,
            offset: 0,
            what: 1,
        },
    );
    seeds.add(
        "seek-res",
        &SeekResOk {
            eof: false,
            offset: FILE_HOLE_END,
        },
    );
    seeds.add(
        "allocate-args",
        &AllocateArgs {
            stateid: sid,
            offset: 0,
            length: 1 << 20,
        },
    );
    seeds.add(
        "setattr-args",
        &SetattrArgs {
            stateid: ANONYMOUS,
            attrs: attrs.clone(),
        },
    );
    seeds.add(
        "access-res",
        &AccessResOk {
            supported: 0x3f,
            access: 0x03,
        },
    );
    seeds.add(
        "readdir-args",
        &ReaddirArgs {
            cookie: 3,
            verifier: [1; 8],
            dircount: 4096,
            maxcount: 8192,
            attr_request: bitmap(&[attr::TYPE, attr::FILEID, attr::MODE]),
        },
    );
    let types = [
        ("link", Createtype4::Link(b"target".to_vec())),
        (
            "block",
            Createtype4::Block(Specdata4 { major: 8, minor: 0 }),
        ),
        ("char", Createtype4::Char(Specdata4 { major: 1, minor: 3 })),
        ("socket", Createtype4::Socket),
        ("fifo", Createtype4::Fifo),
        ("dir", Createtype4::Dir),
        ("regular", Createtype4::Other(ftype::REG)),
    ];
    for (variant, objtype) in types {
        seeds.add(
            &format!("create-args-{variant}"),
            &CreateArgs {
                objtype,
                objname: name.clone(),
                attrs: fattr_mode(0o755),
            },
        );
    }
    seeds.add(
        "create-res",
        &CreateResOk {
            cinfo: cinfo.clone(),
            attrset: bitmap(&[attr::MODE]),
        },
    );
    seeds.add(
        "rename-args",
        &RenameArgs {
            oldname: Component4::new("old"),
            newname: Component4::new("new"),
        },
    );
    seeds.add(
        "rename-res",
        &RenameResOk {
            source_cinfo: cinfo.clone(),
            target_cinfo: cinfo.clone(),
        },
    );
    seeds.add("nfs-fh4", &NfsFh4(vec![0xab; 28]));
    seeds.add("component4", &name);
    seeds.add("bitmap4", &bitmap(&[attr::TYPE, attr::OWNER]));
    seeds.add("fattr4", &attrs);
    seeds.add("state-owner4", &owner("owner"));
    seeds.add("change-info4", &cinfo);
    seeds.add("nfsace4", &ace);
    seeds.add("stateid4", &sid);
    seeds.add("nfstime4", &impl_id.date);
    seeds.add("impl-id", &impl_id);
    seeds.add("state-protect-ops", &ops);
    seeds.add("state-protect-none", &StateProtectArgs::None);
    seeds.add(
        "state-protect-mach-cred",
        &StateProtectArgs::MachCred(ops.clone()),
    );
    seeds.add("state-protect-ssv", &StateProtectArgs::Ssv(ops.clone()));
    seeds.add("channel-attrs4", &channel);
    seeds.add("callback-sec-none", &CallbackSec::None);
    seeds.add("callback-sec-sys", &sys);
    seeds.add("callback-sec-gss", &gss);
    seeds.add("specdata4", &Specdata4 { major: 1, minor: 3 });
    seeds.add("createtype4", &Createtype4::Link(b"target".to_vec()));
    seeds.add("createhow4", &Createhow4::Guarded(attrs.clone()));
    seeds.add(
        "openflag4",
        &Openflag4::Create(Createhow4::Exclusive([7; 8])),
    );
    seeds.add("open-claim4", &OpenClaim4::Null(name.clone()));
    seeds.add("space-limit4", &SpaceLimit4::Size(1 << 20));
    seeds.add("open-read-delegation4", &read_deleg);
    seeds.add("open-write-delegation4", &write_deleg);
    seeds.add("open-none-delegation4", &contention);
    seeds.add(
        "open-delegation4",
        &OpenDelegation4::Read(read_deleg.clone()),
    );
    seeds.add("open-to-lock-owner4", &lock_owner);
    seeds.add("exist-lock-owner4", &exist);
    seeds.add("locker4", &Locker4::Existing(exist.clone()));
    seeds.add(
        "backchannel-ctl-args",
        &BackchannelCtlArgs {
            cb_program: 0x4000_0000,
            sec_parms: vec![CallbackSec::None, sys.clone()],
        },
    );
    seeds.add(
        "cb-compound-header",
        &CbCompoundHeader {
            tag: b"cb".to_vec(),
            minorversion: 1,
            callback_ident: 0,
            numops: 2,
        },
    );
    seeds.add(
        "cb-compound-res-header",
        &CbCompoundResHeader {
            status: status::OK,
            tag: b"cb".to_vec(),
            numres: 2,
        },
    );
    seeds.add("referring-call4", &calls.calls[0]);
    seeds.add("referring-call-list4", &calls);
    seeds.add(
        "cb-sequence-args",
        &CbSequenceArgs {
            sessionid: session,
            sequenceid: 1,
            slotid: 0,
            highest_slotid: 0,
            cachethis: false,
            referring_call_lists: vec![calls.clone()],
        },
    );
    seeds.add(
        "cb-sequence-res",
        &CbSequenceResOk {
            sessionid: session,
            sequenceid: 1,
            slotid: 0,
            highest_slotid: 0,
            target_highest_slotid: 0,
        },
    );
    seeds.add(
        "cb-recall-args",
        &CbRecallArgs {
            stateid: sid,
            truncate: false,
            fh: NfsFh4(vec![0xcd; 32]),
        },
    );
    seeds.add(
        "cb-recall-any-args",
        &CbRecallAnyArgs {
            objects_to_keep: 0,
            type_mask: Bitmap4(vec![0b11]),
        },
    );
    seeds.add(
        "cb-getattr-args",
        &CbGetattrArgs {
            fh: NfsFh4(vec![0xcd; 32]),
            attr_request: Bitmap4(vec![(1 << attr::CHANGE) | (1 << attr::SIZE)]),
        },
    );
    seeds.add(
        "getxattr-args",
        &GetxattrArgs {
            name: Component4::new("color"),
        },
    );
    seeds.add("xattr-value", &XattrValue4(b"blue".to_vec()));
    seeds.add(
        "setxattr-args",
        &SetxattrArgs {
            option: setxattr_option::CREATE,
            name: Component4::new("color"),
            value: XattrValue4(b"blue".to_vec()),
        },
    );
    seeds.add(
        "listxattrs-args",
        &ListxattrsArgs {
            cookie: 2,
            maxcount: 4096,
        },
    );
    seeds.add(
        "listxattrs-res",
        &ListxattrsResOk {
            cookie: 2,
            names: vec![Component4::new("a"), Component4::new("color")],
            eof: true,
        },
    );
    seeds.add(
        "removexattr-args",
        &RemovexattrArgs {
            name: Component4::new("color"),
        },
    );
    seeds.add(
        "xattr-change-res",
        &XattrChangeRes {
            cinfo: cinfo.clone(),
        },
    );
    seeds.add(
        "clone-args",
        &CloneArgs {
            src_stateid: sid,
            dst_stateid: sid,
            src_offset: 4096,
            dst_offset: 8192,
            count: 0,
        },
    );
    let response = WriteResponse4 {
        callback_id: Some(sid),
        count: 1 << 30,
        committed: 0,
        verifier: [7; 8],
    };
    seeds.add(
        "copy-args",
        &CopyArgs {
            src_stateid: sid,
            dst_stateid: sid,
            src_offset: 0,
            dst_offset: 4096,
            count: 1 << 30,
            consecutive: true,
            synchronous: false,
            source_server: vec![
                Netloc4::Name(b"server".to_vec()),
                Netloc4::Addr {
                    netid: b"tcp".to_vec(),
                    addr: b"127.0.0.1.8.1".to_vec(),
                },
            ],
        },
    );
    seeds.add(
        "copy-res",
        &CopyResOk {
            response,
            requirements: CopyRequirements4 {
                consecutive: true,
                synchronous: false,
            },
        },
    );
    seeds.add("offload-args", &OffloadArgs { stateid: sid });
    seeds.add(
        "offload-status-res",
        &OffloadStatusResOk {
            count: 4096,
            complete: Some(status::OK),
        },
    );
    seeds.add(
        "cb-offload-args",
        &CbOffloadArgs {
            fh: NfsFh4(vec![1; 28]),
            stateid: sid,
            info: OffloadInfo4::Done(WriteResponse4 {
                callback_id: None,
                ..response
            }),
        },
    );
    seeds.add(
        "cb-offload-failed",
        &CbOffloadArgs {
            fh: NfsFh4(vec![1; 28]),
            stateid: sid,
            info: OffloadInfo4::Failed(status::NOSPC, 8192),
        },
    );
    seeds.add(
        "cb-getattr-res",
        &CbGetattrResOk {
            obj_attributes: fattr(&[attr::CHANGE, attr::SIZE], |v| {
                v.u64(7);
                v.u64(4096);
            }),
        },
    );
    seeds.0
}

/// Named `msg` seeds.
#[derive(Default)]
struct Seeds(Vec<(String, Vec<u8>)>);

impl Seeds {
    /// Adds the seed `seed-NAME` that decodes `v`.
    fn add<T: Xdr>(&mut self, name: &str, v: &T) {
        self.0.push((format!("seed-{name}"), msg::input(v)));
    }
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
    write_dir(&out.join("msg"), &msg_seeds())?;
    write_dir(&out.join("nfs3"), &nfs3_seeds())?;
    Ok(())
}

/// `nfs3` seeds: one or more calls of every NFSv3 and MOUNT procedure,
/// of NLM's and NSM's, and of the portmapper's (see `src/v3.rs` for the
/// layout).
fn nfs3_seeds() -> Vec<(String, Vec<u8>)> {
    use sluice::mount::{IPPROTO_TCP, MOUNT_PROGRAM};
    use sluice_fuzz::v3::input;
    fn sattr(e: &mut Encoder, mode: Option<u32>, size: Option<u64>) {
        match mode {
            Some(m) => {
                e.bool(true);
                e.u32(m);
            }
            None => e.bool(false),
        }
        e.bool(false);
        e.bool(false);
        match size {
            Some(n) => {
                e.bool(true);
                e.u64(n);
            }
            None => e.bool(false),
        }
        e.u32(1);
        e.u32(2);
        e.u32(1_000_000);
        e.u32(0);
    }
    let mut v: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut add = |name, sel: u8, file: bool, f: &dyn Fn(&mut Encoder)| {
        let mut e = Encoder::new();
        f(&mut e);
        v.push((name, input(sel, file, e.as_slice())));
    };
    add("null", 0, false, &|_| {});
    add("getattr", 1, false, &|_| {});
    add("setattr-guarded", 2, true, &|e| {
        sattr(e, Some(0o640), Some(10));
        e.bool(true);
        e.u32(1);
        e.u32(0);
    });
    add("lookup", 3, false, &|e| e.string("file"));
    add("lookup-dotdot", 3, false, &|e| e.string(".."));
    add("access", 4, true, &|e| e.u32(0x3f));
    add("readlink", 5, false, &|_| {});
    add("read", 6, true, &|e| {
        e.u64(0);
        e.u32(65536);
    });
    add("write-file-sync", 7, true, &|e| {
        e.u64(4096);
        e.u32(5);
        e.u32(2);
        e.opaque(b"hello");
    });
    add("create-unchecked", 8, false, &|e| {
        e.string("new");
        e.u32(0);
        sattr(e, Some(0o644), Some(3));
    });
    add("create-exclusive", 8, false, &|e| {
        e.string("excl");
        e.u32(2);
        e.opaque_fixed(b"verifier");
    });
    add("mkdir", 9, false, &|e| {
        e.string("d2");
        sattr(e, Some(0o755), None);
    });
    add("symlink", 10, false, &|e| {
        e.string("s2");
        sattr(e, None, None);
        e.string("file");
    });
    add("mknod-fifo", 11, false, &|e| {
        e.string("p2");
        e.u32(7);
        sattr(e, Some(0o600), None);
    });
    add("remove", 12, false, &|e| e.string("empty"));
    add("rmdir-not-empty", 13, false, &|e| e.string("dir"));
    add("rename", 14, false, &|e| {
        e.string("empty");
        e.opaque(b"not a handle");
        e.string("moved");
    });
    add("link", 15, true, &|e| {
        e.opaque(b"not a handle");
        e.string("hard");
    });
    add("readdir", 16, false, &|e| {
        e.u64(0);
        e.opaque_fixed(&[0; 8]);
        e.u32(4096);
    });
    add("readdirplus", 17, false, &|e| {
        e.u64(0);
        e.opaque_fixed(&[0; 8]);
        e.u32(1024);
        e.u32(8192);
    });
    add("fsstat", 18, false, &|_| {});
    add("fsinfo", 19, false, &|_| {});
    add("pathconf", 20, false, &|_| {});
    add("commit", 21, true, &|e| {
        e.u64(0);
        e.u32(0);
    });
    add("mount-null", 22, false, &|_| {});
    add("mount-mnt", 23, false, &|e| e.string("/"));
    add("mount-dump", 24, false, &|_| {});
    add("mount-umnt", 25, false, &|e| e.string("/"));
    add("mount-umntall", 26, false, &|_| {});
    add("mount-export", 27, false, &|_| {});
    // NLM and NSM: the whole arguments follow the selector. The file
    // handle is not one of the export's, so these reach the handle check.
    fn nlm_lock(e: &mut Encoder) {
        e.string("fuzzhost");
        e.opaque(&[1; 40]);
        e.opaque(b"owner");
        e.i32(1);
        e.u64(0);
        e.u64(100);
    }
    add("nlm-null", 28, false, &|_| {});
    add("nlm-test", 29, false, &|e| {
        e.opaque(b"c");
        e.bool(true);
        nlm_lock(e);
    });
    add("nlm-lock", 30, false, &|e| {
        e.opaque(b"c");
        e.bool(true);
        e.bool(true);
        nlm_lock(e);
        e.bool(false);
        e.i32(1);
    });
    add("nlm-cancel", 31, false, &|e| {
        e.opaque(b"c");
        e.bool(true);
        e.bool(true);
        nlm_lock(e);
    });
    add("nlm-unlock", 32, false, &|e| {
        e.opaque(b"c");
        nlm_lock(e);
    });
    add("nlm-share", 33, false, &|e| {
        e.opaque(b"c");
        e.string("fuzzhost");
        e.opaque(&[1; 40]);
        e.opaque(b"owner");
        e.u32(1);
        e.u32(3);
        e.bool(false);
    });
    add("nlm-free-all", 36, false, &|e| {
        e.string("fuzzhost");
        e.i32(3);
    });
    add("nlm-lock-msg", 45, false, &|e| {
        e.opaque(b"c");
        e.bool(false);
        e.bool(true);
        nlm_lock(e);
        e.bool(false);
        e.i32(1);
    });
    add("nlm-unlock-msg", 47, false, &|e| {
        e.opaque(b"c");
        nlm_lock(e);
    });
    add("nsm-stat", 38, false, &|e| e.string("fuzzhost"));
    add("nsm-notify", 43, false, &|e| {
        e.string("fuzzhost");
        e.i32(5);
    });
    // Portmapper calls on the NFS port (selectors 48 to 57).
    fn rpcb(e: &mut Encoder, netid: &str) {
        e.u32(rpc::NFS_PROGRAM);
        e.u32(3);
        e.string(netid);
        e.string("127.0.0.1.8.1");
        e.string("fuzz");
    }
    add("pmap-null", 48, false, &|_| {});
    add("pmap-set", 49, false, &|e| {
        for x in [MOUNT_PROGRAM, 3, IPPROTO_TCP, 2049] {
            e.u32(x);
        }
    });
    add("pmap-getport", 51, false, &|e| {
        for x in [rpc::NFS_PROGRAM, 3, IPPROTO_TCP, 0] {
            e.u32(x);
        }
    });
    add("pmap-dump", 52, false, &|_| {});
    add("rpcb3-getaddr", 54, false, &|e| rpcb(e, "tcp"));
    add("rpcb4-set", 55, false, &|e| rpcb(e, "udp"));
    add("rpcb4-getaddr-tcp6", 56, false, &|e| rpcb(e, "tcp6"));
    add("rpcb4-dump", 57, false, &|_| {});
    v.into_iter()
        .map(|(n, d)| (format!("seed-{n}"), d))
        .collect()
}
