//! COMPOUND-level tests against a real export in a temporary directory.

use super::{Config, Server};
use crate::engine::export::Export;
use crate::engine::handle::HandleKey;
use crate::nfs4::consts::{attr, op, status};
use crate::nfs4::msg::{
    Bitmap4, CallbackSec, ChannelAttrs4, Component4, CompoundHeader, CompoundResHeader, CreateArgs,
    CreateSessionArgs, CreateSessionResOk, Createtype4, ExchangeIdArgs, ExchangeIdResOk, Fattr4,
    NfsFh4, ReadArgs, ReaddirArgs, RenameArgs, SequenceArgs, SequenceResOk, Stateid4, Xdr,
};
use crate::nfs4::Nfsstat4;
use crate::rpc::Cred;
use crate::xdr::{Decoder, Encoder};
use proptest::prelude::*;
use std::path::PathBuf;

/// A new directory under the system's temporary one, named after `tag`.
pub(super) fn tempdir(tag: &str) -> PathBuf {
    let mut r = [0u8; 8];
    getrandom::getrandom(&mut r).expect("randomness");
    let p = std::env::temp_dir().join(format!("sluice-test-{tag}-{}", u64::from_le_bytes(r)));
    std::fs::create_dir_all(&p).expect("temp dir");
    p
}

fn server(tag: &str) -> (Server, PathBuf) {
    let dir = tempdir(tag);
    let export =
        Export::open(&dir, 0, HandleKey::new([3; 32])).expect("export (tests run as root)");
    (
        Server::new(export, HandleKey::new([3; 32]), Config::default()).expect("server"),
        dir,
    )
}

/// [`server`] whose export answers changes before syncing them (`sync =
/// false`, `--async`).
fn async_server(tag: &str) -> (Server, PathBuf) {
    use super::exports::{Exported, Exports, Rules};
    let dir = tempdir(tag);
    let key = HandleKey::new([3; 32]);
    let exports = Exports::new(
        vec![Exported {
            fs: Export::open(&dir, 0, key.clone()).expect("export (tests run as root)"),
            pseudo: "/".into(),
            rules: Rules {
                sync: false,
                ..Default::default()
            },
        }],
        key,
    )
    .expect("exports");
    (
        Server::with_exports(exports, Config::default()).expect("server"),
        dir,
    )
}

fn root() -> Cred {
    Cred {
        uid: 0,
        gid: 0,
        gids: vec![],
        flavor: crate::rpc::AUTH_SYS,
    }
}

/// Encodes the arguments of an op.
fn args(a: &impl Xdr) -> Vec<u8> {
    let mut e = Encoder::new();
    a.encode(&mut e);
    e.into_inner()
}

fn compound(minor: u32, ops: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut e = Encoder::new();
    CompoundHeader {
        tag: b"t".to_vec(),
        minorversion: minor,
        numops: ops.len() as u32,
    }
    .encode(&mut e);
    for (n, a) in ops {
        e.u32(*n);
        e.raw(a);
    }
    e.into_inner()
}

struct Reply {
    status: Nfsstat4,
    results: Vec<(u32, Nfsstat4)>,
    body: Vec<u8>,
}

/// Reads the op number and status that start a result.
fn next_result(d: &mut Decoder<'_>) -> (u32, Nfsstat4) {
    (u32::decode(d).unwrap(), Nfsstat4::decode(d).unwrap())
}

/// Skips the op numbers and statuses of `n` results that have no body.
fn skip_results(d: &mut Decoder<'_>, n: usize) {
    for _ in 0..n {
        next_result(d);
    }
}

/// Decodes a COMPOUND4res header and, if there is a result, the op
/// number and status of the first one, leaving `d` at that result's body.
fn reply_start(d: &mut Decoder<'_>) -> (CompoundResHeader, Option<(u32, Nfsstat4)>) {
    let h = CompoundResHeader::decode(d).unwrap();
    let first = (h.numres > 0).then(|| next_result(d));
    (h, first)
}

/// Parses status and the (op, status) of the first result, keeping the body.
fn parse(body: Vec<u8>) -> Reply {
    let (h, first) = reply_start(&mut Decoder::new(&body));
    Reply {
        status: h.status,
        results: first.into_iter().collect(),
        body,
    }
}

fn session(srv: &Server) -> [u8; 16] {
    session_caching(srv, 4096)
}

/// A session whose replies may be cached up to `cached` bytes.
fn session_caching(srv: &Server, cached: u32) -> [u8; 16] {
    let a = args(&ExchangeIdArgs {
        verifier: [1; 8],
        ownerid: b"test-client".to_vec(),
        ..Default::default()
    });
    let r = process_compound_ok(srv, &compound(1, &[(op::EXCHANGE_ID, a)]));
    let mut d = Decoder::new(&r.body);
    reply_start(&mut d);
    let x = ExchangeIdResOk::decode(&mut d).unwrap();
    let channel = ChannelAttrs4 {
        header_pad: 0,
        max_request: 1 << 20,
        max_response: 1 << 20,
        max_response_cached: cached,
        max_ops: 16,
        max_requests: 8,
        rdma_ird: None,
    };
    let a = args(&CreateSessionArgs {
        clientid: x.clientid,
        sequence: x.sequenceid,
        flags: 0,
        fore: channel,
        back: channel,
        cb_program: 0x4000_0000,
        cb_sec: vec![CallbackSec::None],
    });
    let r = process_compound_ok(srv, &compound(1, &[(op::CREATE_SESSION, a)]));
    let mut d = Decoder::new(&r.body);
    reply_start(&mut d);
    CreateSessionResOk::decode(&mut d).unwrap().sessionid
}

/// Runs a COMPOUND as if its RPC header were empty.
fn pc(srv: &Server, cred: &Cred, args: &[u8]) -> Option<Vec<u8>> {
    super::process_compound(srv, cred, None, args, 0).map(Encoder::into_inner)
}

fn process_compound_ok(srv: &Server, args: &[u8]) -> Reply {
    let r = parse(pc(srv, &root(), args).expect("framed"));
    assert_eq!(r.status, status::OK, "compound failed: {:?}", r.results);
    r
}

fn sequence(sid: &[u8; 16], seq: u32, slot: u32, cache: bool) -> (u32, Vec<u8>) {
    let a = args(&SequenceArgs {
        sessionid: *sid,
        sequenceid: seq,
        slotid: slot,
        highest_slotid: slot,
        cachethis: cache,
    });
    (op::SEQUENCE, a)
}

#[test]
fn an_op_that_changes_things_is_not_run_when_its_result_might_not_fit() {
    let (srv, dir) = server("repbound");
    let sid = session_caching(&srv, 128);
    let create = args(&CreateArgs {
        objtype: Createtype4::Dir,
        objname: Component4::new("made"),
        attrs: Fattr4::default(), // no attributes
    });
    let create = (op::CREATE, create);
    // Cached replies of up to 128 bytes: CREATE's result could make the
    // reply larger, so it is refused before it runs (RFC 8881 section
    // 18.46.3) and nothing is created.
    let args = compound(
        1,
        &[
            sequence(&sid, 1, 0, true),
            (op::PUTROOTFH, vec![]),
            create.clone(),
        ],
    );
    let r = parse(pc(&srv, &root(), &args).unwrap());
    assert_eq!(r.status, status::REP_TOO_BIG_TO_CACHE);
    assert!(!dir.join("made").exists(), "the refused CREATE ran");
    // Not asked to cache: it runs.
    let args = compound(
        1,
        &[sequence(&sid, 2, 0, false), (op::PUTROOTFH, vec![]), create],
    );
    let r = parse(pc(&srv, &root(), &args).unwrap());
    assert_eq!(r.status, status::OK);
    assert!(dir.join("made").is_dir());
}

#[test]
fn session_ops_and_replay_cache() {
    let (srv, _dir) = server("session");
    let sid = session(&srv);
    let getattr = args(&Bitmap4::of(&[attr::TYPE, attr::SIZE]));
    let ops = [
        sequence(&sid, 1, 0, true),
        (op::PUTROOTFH, vec![]),
        (op::GETATTR, getattr),
    ];
    let first = process_compound_ok(&srv, &compound(1, &ops));
    let again = process_compound_ok(&srv, &compound(1, &ops));
    assert_eq!(
        first.body, again.body,
        "a retransmission gets the cached reply"
    );
    let skip = parse(pc(&srv, &root(), &compound(1, &[sequence(&sid, 3, 0, false)])).unwrap());
    assert_eq!(skip.status, status::SEQ_MISORDERED);
    let bad = parse(
        pc(
            &srv,
            &root(),
            &compound(1, &[sequence(&[9; 16], 1, 0, false)]),
        )
        .unwrap(),
    );
    assert_eq!(bad.status, status::BADSESSION);
}

#[test]
fn sessionless_and_unknown_ops() {
    let (srv, _dir) = server("ops");
    let r = parse(pc(&srv, &root(), &compound(0, &[(op::PUTROOTFH, vec![])])).unwrap());
    assert_eq!(
        (r.status, r.results.len()),
        (status::MINOR_VERS_MISMATCH, 0)
    );
    let r = parse(pc(&srv, &root(), &compound(1, &[(op::PUTROOTFH, vec![])])).unwrap());
    assert_eq!(r.status, status::OP_NOT_IN_SESSION);
    let sid = session(&srv);
    let r = parse(
        pc(
            &srv,
            &root(),
            &compound(2, &[sequence(&sid, 1, 0, false), (op::COPY_NOTIFY, vec![])]),
        )
        .unwrap(),
    );
    assert_eq!(r.status, status::NOTSUPP);
    let r = parse(
        pc(
            &srv,
            &root(),
            &compound(2, &[sequence(&sid, 2, 0, false), (9999, vec![])]),
        )
        .unwrap(),
    );
    assert_eq!(r.status, status::OP_ILLEGAL);
    // A LOOKUP whose name length runs past the end of the request.
    let r = parse(
        pc(
            &srv,
            &root(),
            &compound(
                1,
                &[
                    sequence(&sid, 3, 0, false),
                    (op::PUTROOTFH, vec![]),
                    (op::LOOKUP, vec![0, 0, 1, 0, b'a']),
                ],
            ),
        )
        .unwrap(),
    );
    assert_eq!(r.status, status::BADXDR);
}

#[test]
fn lookup_refuses_dot_dot_and_stops_at_root() {
    let (srv, _dir) = server("escape");
    let sid = session(&srv);
    let name = args(&Component4::new(".."));
    let r = parse(
        pc(
            &srv,
            &root(),
            &compound(
                1,
                &[
                    sequence(&sid, 1, 0, false),
                    (op::PUTROOTFH, vec![]),
                    (op::LOOKUP, name),
                ],
            ),
        )
        .unwrap(),
    );
    assert_eq!(r.status, status::BADNAME);
    let r = parse(
        pc(
            &srv,
            &root(),
            &compound(
                1,
                &[
                    sequence(&sid, 2, 0, false),
                    (op::PUTROOTFH, vec![]),
                    (op::LOOKUPP, vec![]),
                ],
            ),
        )
        .unwrap(),
    );
    assert_eq!(r.status, status::NOENT);
}

/// A server with two exports joined by a pseudo file system: "/home"
/// (read-write, everyone) and "/data/archive" (read-only, 10.0.0.0/8).
fn two_exports(tag: &str) -> (Server, PathBuf, PathBuf) {
    use super::exports::{Exported, Exports, Rules};
    let key = HandleKey::new([4; 32]);
    let (a, b) = (tempdir(&format!("{tag}-a")), tempdir(&format!("{tag}-b")));
    std::fs::write(a.join("f"), b"x").unwrap();
    let list = vec![
        Exported {
            fs: Export::open(&a, 0, key.clone()).unwrap(),
            pseudo: "/home".into(),
            rules: Rules::default(),
        },
        Exported {
            fs: Export::open(&b, 1, key.clone()).unwrap(),
            pseudo: "/data/archive".into(),
            rules: Rules {
                read_only: true,
                clients: vec![crate::rules::IpRange::parse("10.0.0.0/8").unwrap()],
                ..Default::default()
            },
        },
    ];
    let exports = Exports::new(list, key).unwrap();
    (
        Server::with_exports(exports, Config::default()).unwrap(),
        a,
        b,
    )
}

fn lookup_op(name: &str) -> (u32, Vec<u8>) {
    (op::LOOKUP, args(&Component4::new(name)))
}

/// Runs SEQUENCE + `ops` from `peer` and returns the decoder positioned
/// after the SEQUENCE result, with the compound status.
fn run_from(
    srv: &Server,
    sid: &[u8; 16],
    seq: u32,
    peer: Option<std::net::IpAddr>,
    ops: &[(u32, Vec<u8>)],
) -> (Nfsstat4, Vec<u8>) {
    let mut all = vec![sequence(sid, seq, 0, false)];
    all.extend_from_slice(ops);
    let body = super::process_compound(srv, &root(), peer, &compound(1, &all), 0)
        .unwrap()
        .into_inner();
    let mut d = Decoder::new(&body);
    let (h, _) = reply_start(&mut d);
    SequenceResOk::decode(&mut d).unwrap();
    (h.status, d.rest().to_vec())
}

/// The names in a READDIR result that asked for no attributes; `d` is
/// positioned at the READDIR op number.
fn readdir_names(d: &mut Decoder<'_>) -> Vec<String> {
    assert_eq!(next_result(d), (op::READDIR, status::OK));
    d.array::<8>().unwrap();
    let mut names = Vec::new();
    while d.bool().unwrap() {
        d.u64().unwrap();
        names.push(String::from_utf8(d.opaque(255).unwrap().to_vec()).unwrap());
        d.bitmap(8).unwrap();
        d.opaque(4096).unwrap();
    }
    names
}

fn readdir_op() -> (u32, Vec<u8>) {
    let a = args(&ReaddirArgs {
        cookie: 0,
        verifier: [0; 8],
        dircount: 4096,
        maxcount: 65536,
        attr_request: Bitmap4::default(),
    });
    (op::READDIR, a)
}

#[test]
fn pseudo_file_system_joins_exports() {
    let (srv, a, _b) = two_exports("pseudo");
    let sid = session(&srv);
    let inside: Option<std::net::IpAddr> = Some("10.1.2.3".parse().unwrap());
    let outside: Option<std::net::IpAddr> = Some("192.0.2.7".parse().unwrap());
    let put_root = (op::PUTROOTFH, vec![]);

    // The root lists both top-level names to an admitted client.
    let (st, rest) = run_from(&srv, &sid, 1, inside, &[put_root.clone(), readdir_op()]);
    assert_eq!(st, status::OK);
    let mut d = Decoder::new(&rest);
    skip_results(&mut d, 1); // PUTROOTFH
    assert_eq!(readdir_names(&mut d), vec!["data", "home"]);
    // Another client sees only the export open to everyone.
    let (st, rest) = run_from(&srv, &sid, 2, outside, &[put_root.clone(), readdir_op()]);
    assert_eq!(st, status::OK);
    let mut d = Decoder::new(&rest);
    skip_results(&mut d, 1); // PUTROOTFH
    assert_eq!(readdir_names(&mut d), vec!["home"]);
    let (st, _) = run_from(
        &srv,
        &sid,
        3,
        outside,
        &[put_root.clone(), lookup_op("data")],
    );
    assert_eq!(st, status::NOENT);

    // Down into an export and back up to the pseudo root.
    let getfh = (op::GETFH, vec![]);
    let (st, rest) = run_from(
        &srv,
        &sid,
        4,
        inside,
        &[
            put_root.clone(),
            lookup_op("data"),
            lookup_op("archive"),
            getfh.clone(),
            (op::LOOKUPP, vec![]),
            (op::LOOKUPP, vec![]),
            getfh.clone(),
            (op::LOOKUPP, vec![]),
        ],
    );
    assert_eq!(st, status::NOENT, "no parent above the pseudo root");
    let mut d = Decoder::new(&rest);
    skip_results(&mut d, 3); // PUTROOTFH, LOOKUP, LOOKUP
    assert_eq!(next_result(&mut d), (op::GETFH, status::OK));
    let archive_fh = NfsFh4::decode(&mut d).unwrap();
    assert_eq!(archive_fh.0, srv.exports.list()[1].fs.root_fh());
    skip_results(&mut d, 2); // LOOKUPP, LOOKUPP
    assert_eq!(next_result(&mut d), (op::GETFH, status::OK));
    assert_eq!(NfsFh4::decode(&mut d).unwrap().0, srv.exports.root().0);

    // The export's handle is refused to a client outside its range.
    let putfh = (op::PUTFH, args(&archive_fh));
    let (st, _) = run_from(&srv, &sid, 5, outside, &[putfh.clone(), getfh.clone()]);
    assert_eq!(st, status::ACCESS);

    // Pseudo directories and the read-only export refuse changes.
    let mkdir = args(&CreateArgs {
        objtype: Createtype4::Dir,
        objname: Component4::new("new"),
        attrs: Fattr4::default(),
    });
    let mkdir = (op::CREATE, mkdir);
    let (st, _) = run_from(&srv, &sid, 6, inside, &[put_root.clone(), mkdir.clone()]);
    assert_eq!(st, status::ROFS);
    let (st, _) = run_from(&srv, &sid, 7, inside, &[putfh.clone(), mkdir.clone()]);
    assert_eq!(st, status::ROFS);
    let (st, _) = run_from(&srv, &sid, 8, inside, &[put_root.clone(), read_op(0, 10)]);
    assert_eq!(st, status::ISDIR);

    // The read-write export takes changes; renames between exports do not.
    let (st, _) = run_from(
        &srv,
        &sid,
        9,
        inside,
        &[put_root.clone(), lookup_op("home"), mkdir.clone()],
    );
    assert_eq!(st, status::OK);
    assert!(a.join("new").is_dir());
    let names = args(&RenameArgs {
        oldname: Component4::new("f"),
        newname: Component4::new("g"),
    });
    let (st, _) = run_from(
        &srv,
        &sid,
        10,
        inside,
        &[
            put_root.clone(),
            lookup_op("home"),
            (op::SAVEFH, vec![]),
            putfh.clone(),
            (op::RENAME, names),
        ],
    );
    assert_eq!(st, status::XDEV);
    assert!(a.join("f").exists());

    // Pseudo directory handles survive a round trip through PUTFH.
    let put = args(&NfsFh4(srv.exports.root().0));
    let (st, rest) = run_from(&srv, &sid, 11, outside, &[(op::PUTFH, put), readdir_op()]);
    assert_eq!(st, status::OK);
    let mut d = Decoder::new(&rest);
    skip_results(&mut d, 1); // PUTFH
    assert_eq!(readdir_names(&mut d), vec!["home"]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn arbitrary_records_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..256)) {
        let (srv, _dir) = SHARED.with(|s| (s.0.clone(), ()));
        let _ = srv.handle_record(&buf);
    }

    #[test]
    fn truncated_compounds_get_errors_not_panics(cut in 0usize..200) {
        let (srv, _dir) = SHARED.with(|s| (s.0.clone(), ()));
        let name = args(&Component4::new("nothing-here"));
        let args = compound(1, &[(op::PUTROOTFH, vec![]), (op::LOOKUP, name), (op::GETFH, vec![])]);
        let cut = cut.min(args.len());
        let _ = pc(&srv, &root(), &args[..cut]);
    }
}

thread_local! {
    static SHARED: (std::sync::Arc<Server>, PathBuf) = {
        let (s, d) = server("prop");
        (s.shared(), d)
    };
}

/// Runs a COMPOUND as the connection task does: as far as it goes without
/// waiting, then (if it stopped) the rest as a worker does. Returns the
/// body and whether it had to stop.
fn run_split(srv: &Server, args: Vec<u8>) -> (Vec<u8>, bool) {
    match super::compound::try_compound(srv, args, 0, root(), None, None) {
        super::compound::Step::Done(body) => (body.expect("framed").into_inner(), false),
        super::compound::Step::Paused(p) => (p.resume(srv).expect("framed").into_inner(), true),
    }
}

/// A COMPOUND4res: status, (op, status) of each result, the READ data and
/// the GETFH handle, if any.
type Results = (
    Nfsstat4,
    Vec<(u32, Nfsstat4)>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
);

/// Parses a COMPOUND4res of SEQUENCE, PUTFH, LOOKUP, GETFH, READ and the
/// like.
fn split_results(body: &[u8]) -> Results {
    let (mut data, mut fh) = (None, None);
    let (status, results) = each_result(body, |o, d| match o {
        op::GETFH => fh = Some(NfsFh4::decode(d).unwrap().0),
        op::READ => {
            d.bool().unwrap();
            data = Some(d.opaque(1 << 20).unwrap().to_vec());
        }
        _ => {}
    });
    (status, results, data, fh)
}

/// Walks a COMPOUND4res: SEQUENCE's result is read here, every other
/// successful result by `f` (given its op), up to the first failure.
/// Returns the status and the (op, status) of each result.
fn each_result(
    body: &[u8],
    mut f: impl FnMut(u32, &mut Decoder<'_>),
) -> (Nfsstat4, Vec<(u32, Nfsstat4)>) {
    let mut d = Decoder::new(body);
    let h = CompoundResHeader::decode(&mut d).unwrap();
    let mut results = Vec::new();
    for _ in 0..h.numres {
        let (o, s) = next_result(&mut d);
        results.push((o, s));
        if s != status::OK {
            break;
        }
        if o == op::SEQUENCE {
            SequenceResOk::decode(&mut d).unwrap();
        } else {
            f(o, &mut d);
        }
    }
    (h.status, results)
}

fn read_op(offset: u64, count: u32) -> (u32, Vec<u8>) {
    let a = args(&ReadArgs {
        stateid: Stateid4::ANONYMOUS,
        offset,
        count,
    });
    (op::READ, a)
}

/// The connection task answers what needs no waiting and hands the rest
/// on: a COMPOUND stops before an op that may wait (LOOKUPP), before a
/// READ of data not in the page cache, and before a READ whose range a
/// writer holds, and finishes from there with each op run once. LOOKUP of
/// a name the kernel has in memory does not stop.
#[test]
fn compounds_stop_before_waiting_and_finish_elsewhere() {
    use std::os::fd::AsRawFd;
    let (srv, dir) = server("nowait");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::create_dir(dir.join("d")).unwrap();
    std::fs::write(dir.join("f"), &data).unwrap();
    let sid = session(&srv);
    let ops = |seq: u32, rest: &[(u32, Vec<u8>)]| {
        let mut all = vec![sequence(&sid, seq, 0, false)];
        all.extend_from_slice(rest);
        compound(1, &all)
    };

    // LOOKUPP may wait: the COMPOUND stops there and finishes elsewhere.
    let walk = [
        (op::PUTROOTFH, vec![]),
        lookup_op("d"),
        (op::LOOKUPP, vec![]),
        lookup_op("f"),
        (op::GETFH, vec![]),
        read_op(1000, 2000),
    ];
    let (body, stopped) = run_split(&srv, ops(1, &walk));
    assert!(stopped);
    let (st, results, got, fh) = split_results(&body);
    assert_eq!(st, status::OK, "{results:?}");
    let names: Vec<u32> = results.iter().map(|r| r.0).collect();
    assert_eq!(
        names,
        [
            op::SEQUENCE,
            op::PUTROOTFH,
            op::LOOKUP,
            op::LOOKUPP,
            op::LOOKUP,
            op::GETFH,
            op::READ
        ]
    );
    assert!(got.unwrap() == data[1000..3000]);
    let fh = fh.unwrap();
    // SEQUENCE ran once: the retransmission gets the same (cached, as it
    // is small) reply, and the next sequence id is accepted below.
    let (again, _) = run_split(&srv, ops(1, &walk));
    assert!(again == body, "the retransmission got another reply");

    // LOOKUP of a name the kernel has in memory, and a READ of cached
    // data: answered without stopping.
    let (body, stopped) = run_split(
        &srv,
        ops(
            2,
            &[
                (op::PUTROOTFH, vec![]),
                lookup_op("f"),
                (op::GETFH, vec![]),
                read_op(1000, 2000),
            ],
        ),
    );
    assert!(!stopped, "a LOOKUP of a cached name went to a worker");
    let (st, _, got, fh2) = split_results(&body);
    assert_eq!(st, status::OK);
    assert!(got.unwrap() == data[1000..3000]);
    assert_eq!(fh2.unwrap(), fh);

    let putfh = (op::PUTFH, args(&NfsFh4(fh)));
    // Cached data: answered without stopping.
    let (body, stopped) = run_split(&srv, ops(3, &[putfh.clone(), read_op(150_000, 100_000)]));
    assert!(!stopped);
    let (st, results, got, _) = split_results(&body);
    assert_eq!((st, results.len()), (status::OK, 3));
    assert!(got.unwrap() == data[150_000..]);

    // READ_PLUS of the cached, fully allocated file: no stop either.
    let read_plus = (op::READ_PLUS, read_op(0, 4096).1);
    let (body, stopped) = run_split(&srv, ops(4, &[putfh.clone(), read_plus.clone()]));
    assert!(!stopped);
    let (st, results, _, _) = split_results(&body);
    assert_eq!(st, status::OK);
    assert_eq!(results.last(), Some(&(op::READ_PLUS, status::OK)));
    assert!(body.windows(4096).any(|w| w == &data[..4096]));

    // Out of the page cache: stops before READ, which runs once. The
    // READs above were sequential enough for server readahead, whose
    // worker must be done before the pages are dropped, or it may read
    // them back in.
    srv.read.readahead.settle();
    let f = std::fs::File::open(dir.join("f")).unwrap();
    f.sync_all().unwrap();
    // SAFETY: advice on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let (body, stopped) = run_split(&srv, ops(5, &[putfh.clone(), read_op(0, 70_000)]));
    assert!(stopped, "a READ of uncached data was done without waiting");
    let (st, results, got, _) = split_results(&body);
    assert_eq!((st, results.len()), (status::OK, 3), "{results:?}");
    assert!(got.unwrap() == data[..70_000]);

    // A writer holds the range: stops, and reads once the writer is done.
    let meta = std::fs::metadata(dir.join("f")).unwrap();
    let key = {
        use std::os::unix::fs::MetadataExt;
        (meta.dev(), meta.ino())
    };
    let held = srv.locks.write(key, 0, 10);
    let paused = match super::compound::try_compound(
        &srv,
        ops(6, &[putfh.clone(), read_op(0, 100)]),
        0,
        root(),
        None,
        None,
    ) {
        super::compound::Step::Paused(p) => p,
        super::compound::Step::Done(_) => panic!("READ went past a held write lock"),
    };
    drop(held);
    let body = paused.resume(&srv).unwrap().into_inner();
    let (st, results, got, _) = split_results(&body);
    assert_eq!((st, results.len()), (status::OK, 3), "{results:?}");
    assert!(got.unwrap() == data[..100]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn handles_of_files_removed_locally_let_go_of_their_blocks() {
    // A cached O_PATH descriptor keeps a removed file's inode, and so its
    // blocks: the sweep drops descriptors of objects with no name left.
    let (srv, dir) = server("sweep");
    std::fs::write(dir.join("gone"), vec![7u8; 1 << 20]).unwrap();
    std::fs::write(dir.join("kept"), b"kept").unwrap();
    let ex = &srv.exports.list()[0].fs;
    let root = ex.root_fd();
    for name in [c"gone", c"kept"] {
        let wire = ex
            .handle_in(std::os::fd::AsFd::as_fd(&*root), name)
            .unwrap();
        ex.resolve(&wire).unwrap();
    }
    let before = ex.cached();
    std::fs::remove_file(dir.join("gone")).unwrap();
    ex.sweep();
    assert_eq!(
        ex.cached(),
        before - 1,
        "the removed file's descriptor stays cached"
    );
}

#[test]
fn a_looked_up_name_is_kept_for_its_handle() {
    // The client that looks a name up sends its handle next: the
    // descriptor LOOKUP opened is the one PUTFH finds, not a new one.
    let (srv, dir) = server("remember");
    std::fs::write(dir.join("f"), b"data").unwrap();
    let sid = session(&srv);
    let ex = &srv.exports.list()[0].fs;
    let root = ex.root_fd();
    let wire = ex
        .handle_in(std::os::fd::AsFd::as_fd(&*root), c"f")
        .unwrap();
    let before = ex.cached();
    let (st, _) = run_from(
        &srv,
        &sid,
        1,
        None,
        &[(op::PUTROOTFH, vec![]), lookup_op("f")],
    );
    assert_eq!(st, status::OK);
    assert_eq!(ex.cached(), before + 1, "LOOKUP kept no descriptor");
    let a = ex.resolve(&wire).unwrap();
    let b = ex.resolve(&wire).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    // Removed through the server, it is forgotten again.
    let (st, _) = run_from(
        &srv,
        &sid,
        2,
        None,
        &[
            (op::PUTROOTFH, vec![]),
            (op::REMOVE, args(&Component4::new("f"))),
        ],
    );
    assert_eq!(st, status::OK);
    assert_eq!(ex.cached(), before);
    assert!(ex.resolve(&wire).is_err());
    let _ = std::fs::remove_dir_all(dir);
}

/// (name, attribute values) of every entry READDIR lists in the export's
/// root when asked for `req`, sorted by name; every entry must answer all
/// of `req`.
fn list_root(srv: &Server, sid: &[u8; 16], seq: u32, req: &[u32]) -> Vec<(String, Vec<u8>)> {
    let a = args(&ReaddirArgs {
        cookie: 0,
        verifier: [0; 8],
        dircount: 1 << 20,
        maxcount: 1 << 20,
        attr_request: Bitmap4::of(req),
    });
    let (st, rest) = run_from(
        srv,
        sid,
        seq,
        None,
        &[(op::PUTROOTFH, vec![]), (op::READDIR, a)],
    );
    assert_eq!(st, status::OK);
    let mut d = Decoder::new(&rest);
    skip_results(&mut d, 1); // PUTROOTFH
    assert_eq!(next_result(&mut d), (op::READDIR, status::OK));
    d.array::<8>().unwrap();
    let mut out = Vec::new();
    while d.bool().unwrap() {
        d.u64().unwrap();
        let name = String::from_utf8(d.opaque(255).unwrap().to_vec()).unwrap();
        let bm = d.bitmap(8).unwrap();
        assert_eq!(bm, Bitmap4::of(req).0, "{name}: the attributes answered");
        out.push((name, d.opaque(4096).unwrap().to_vec()));
    }
    assert!(d.bool().unwrap(), "one READDIR lists the whole directory");
    out.sort();
    out
}

/// (name, file handle, fileid) of every entry READDIR lists in the
/// export's root, asking for FILEHANDLE and FILEID.
fn list_handles(srv: &Server, sid: &[u8; 16], seq: u32) -> Vec<(String, Vec<u8>, u64)> {
    list_root(srv, sid, seq, &[attr::FILEHANDLE, attr::FILEID])
        .into_iter()
        .map(|(name, vals)| {
            let mut v = Decoder::new(&vals);
            let fh = v.opaque(128).unwrap().to_vec();
            (name, fh, v.u64().unwrap())
        })
        .collect()
}

#[test]
fn listed_handles_stay_right_when_local_files_go_and_others_take_their_inode_numbers() {
    // Listings take entries' handles from the memo once they have seen
    // them. A file deleted behind the server's back gives its inode
    // number to the next file made (as ext4 does at once): that file
    // must be listed with its own handle, not the deleted one's.
    let (srv, dir) = server("memo");
    let ex = &srv.exports.list()[0].fs;
    assert!(ex.memo().on(), "no handle memo (tests run as root)");
    for i in 0..40 {
        std::fs::write(dir.join(format!("a{i:02}")), b"a").unwrap();
    }
    let sid = session(&srv);
    let first = list_handles(&srv, &sid, 1);
    assert_eq!(first.len(), 40);
    let hits = ex.memo().counts().1;
    assert_eq!(list_handles(&srv, &sid, 2), first);
    assert_eq!(
        ex.memo().counts().1,
        hits + 40,
        "the second listing asked the kernel again"
    );

    for i in 0..40 {
        std::fs::remove_file(dir.join(format!("a{i:02}"))).unwrap();
    }
    // Tests running meanwhile make files too and may take the numbers
    // freed: files are made until one of them gets one.
    use std::os::unix::fs::MetadataExt;
    let old: std::collections::HashSet<u64> = first.iter().map(|e| e.2).collect();
    let mut made = 0;
    let mut reused = 0;
    while made < 40 || (reused == 0 && made < 2000) {
        let p = dir.join(format!("b{made:04}"));
        std::fs::write(&p, b"b").unwrap();
        reused += usize::from(old.contains(&std::fs::metadata(&p).unwrap().ino()));
        made += 1;
    }
    let again = list_handles(&srv, &sid, 3);
    assert_eq!(again.len(), made);
    assert!(
        again.iter().any(|e| old.contains(&e.2)),
        "no inode number was given again: this file system does not show the case"
    );
    let root = ex.root_fd();
    for (name, fh, fileid) in &again {
        let c = std::ffi::CString::new(name.as_str()).unwrap();
        let now = ex.handle_in(std::os::fd::AsFd::as_fd(&*root), &c).unwrap();
        assert_eq!(
            fh, &now,
            "{name} (inode {fileid}) listed with another file's handle"
        );
        assert!(ex.resolve(fh).is_ok(), "{name}: its listed handle is stale");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_first_listing_after_files_are_made_or_looked_up_has_their_handles() {
    // OPEN (create) and LOOKUP ask the kernel for the handle through the
    // descriptor they opened; the memo keeps it, and the listing of the
    // directory that follows (an `ls -l` after an unpack) asks for none
    // (the build before found none of the 40).
    //
    // The memo does not keep a handle whose number had a delete it read
    // after the handle was asked, and tests running beside this one
    // delete files whose numbers new files take: a round in which that
    // happened finds fewer, and the case is tried again on a new server,
    // until a round finds all 40.
    let mut rounds = Vec::new();
    for round in 0..5 {
        let (srv, dir) = server(&format!("memo-opened-{round}"));
        let ex = &srv.exports.list()[0].fs;
        assert!(ex.memo().on(), "no handle memo (tests run as root)");
        for i in 0..20 {
            std::fs::write(dir.join(format!("l{i:02}")), b"l").unwrap();
        }
        let mut run = quick_session(&srv);
        for i in 0..20 {
            run(vec![
                (op::PUTROOTFH, vec![]),
                open_op(b"memo", &format!("o{i:02}"), true),
            ]);
            run(vec![
                (op::PUTROOTFH, vec![]),
                lookup_op(&format!("l{i:02}")),
            ]);
        }
        let hits = ex.memo().counts().1;
        let listed = list_handles(&srv, &session(&srv), 1);
        assert_eq!(listed.len(), 40);
        rounds.push(ex.memo().counts().1 - hits);
        let root = ex.root_fd();
        for (name, fh, _) in &listed {
            let c = std::ffi::CString::new(name.as_str()).unwrap();
            let now = ex.handle_in(std::os::fd::AsFd::as_fd(&*root), &c).unwrap();
            assert_eq!(fh, &now, "{name} listed with another file's handle");
        }
        let _ = std::fs::remove_dir_all(dir);
        if rounds.last() == Some(&40) {
            return;
        }
    }
    panic!("the listings found {rounds:?} of 40 handles of files just made or looked up");
}

/// What [`list_root`] gives, and how many entries the server answered
/// without a stat meanwhile.
fn list_with(srv: &Server, sid: &[u8; 16], seq: u32, req: &[u32]) -> (Vec<(String, Vec<u8>)>, u64) {
    let unstatted = || {
        srv.metrics
            .entries_listed_without_stat
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = unstatted();
    let out = list_root(srv, sid, seq, req);
    (out, unstatted() - before)
}

#[test]
fn a_listing_of_names_and_file_ids_takes_them_from_the_directory_without_a_stat() {
    // What the Linux client asks for when it lists without attributes:
    // the entries' types and mounted_on_fileid (and rdattr_error). Those
    // of the entries that are not directories come from the directory
    // itself; directories (which may be mount points) are still looked
    // at.
    use std::os::unix::fs::MetadataExt;
    let (srv, dir) = server("names-only");
    for i in 0..30 {
        std::fs::write(dir.join(format!("f{i:02}")), b"x").unwrap();
    }
    std::os::unix::fs::symlink("f00", dir.join("link")).unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let ino = |name: &str| std::fs::symlink_metadata(dir.join(name)).unwrap().ino();
    let sid = session(&srv);

    let (names, unstatted) = list_with(
        &srv,
        &sid,
        1,
        &[attr::RDATTR_ERROR, attr::MOUNTED_ON_FILEID],
    );
    assert_eq!(names.len(), 33);
    for (name, vals) in &names {
        let mut v = Decoder::new(vals);
        assert_eq!(v.u32().unwrap(), status::OK.0, "{name}: rdattr_error");
        assert_eq!(v.u64().unwrap(), ino(name), "{name}: mounted_on_fileid");
    }
    assert_eq!(
        unstatted, 32,
        "all but the directory answered without a stat"
    );

    let (ids, unstatted) = list_with(&srv, &sid, 2, &[attr::FILEID]);
    for (name, vals) in &ids {
        assert_eq!(
            Decoder::new(vals).u64().unwrap(),
            ino(name),
            "{name}: fileid"
        );
    }
    assert_eq!(unstatted, 32);

    // What the Linux client asks for: types too, from the directory.
    let req = [attr::RDATTR_ERROR, attr::TYPE, attr::MOUNTED_ON_FILEID];
    let (typed, unstatted) = list_with(&srv, &sid, 3, &req);
    assert_eq!(typed.len(), 33);
    for (name, vals) in &typed {
        // Values in the order of the attributes' numbers.
        let mut v = Decoder::new(vals);
        let want = match name.as_str() {
            "link" => crate::nfs4::consts::ftype::LNK,
            "sub" => crate::nfs4::consts::ftype::DIR,
            "fifo" => crate::nfs4::consts::ftype::FIFO,
            _ => crate::nfs4::consts::ftype::REG,
        };
        assert_eq!(v.u32().unwrap(), want, "{name}: type");
        assert_eq!(v.u32().unwrap(), status::OK.0, "{name}: rdattr_error");
        assert_eq!(v.u64().unwrap(), ino(name), "{name}: mounted_on_fileid");
    }
    assert_eq!(unstatted, 32);

    // Any other attribute needs the entry itself.
    let (sized, unstatted) = list_with(&srv, &sid, 4, &[attr::SIZE, attr::MOUNTED_ON_FILEID]);
    assert_eq!(sized.len(), 33);
    assert_eq!(unstatted, 0);

    // On a file system whose directory numbers are not those of its
    // inodes, every entry is looked at.
    let ex = &srv.exports.list()[0].fs;
    assert!(
        ex.numbers_in_directory(),
        "the test's file system is not ext4, xfs, btrfs or tmpfs"
    );
    ex.distrust_numbers_in_directory();
    let (again, unstatted) = list_with(&srv, &sid, 5, &req);
    assert_eq!(again, typed);
    assert_eq!(unstatted, 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn entries_counted_as_listed_without_a_stat_are_those_the_reply_holds() {
    // A READDIR that stops at maxcount has read entries it did not send.
    let (srv, dir) = server("names-counted");
    for i in 0..200 {
        std::fs::write(dir.join(format!("entry-{i:03}")), b"").unwrap();
    }
    let sid = session(&srv);
    let req = [attr::RDATTR_ERROR, attr::TYPE, attr::MOUNTED_ON_FILEID];
    let counted = || {
        srv.metrics
            .entries_listed_without_stat
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let (mut cookie, mut seq, mut listed, mut replies) = (0, 1, 0u64, 0);
    loop {
        let before = counted();
        let a = args(&ReaddirArgs {
            cookie,
            verifier: [0; 8],
            dircount: 1 << 20,
            maxcount: 1024,
            attr_request: Bitmap4::of(&req),
        });
        let (st, rest) = run_from(
            &srv,
            &sid,
            seq,
            None,
            &[(op::PUTROOTFH, vec![]), (op::READDIR, a)],
        );
        assert_eq!(st, status::OK);
        let mut d = Decoder::new(&rest);
        skip_results(&mut d, 1);
        assert_eq!(next_result(&mut d), (op::READDIR, status::OK));
        d.array::<8>().unwrap();
        let mut n = 0;
        while d.bool().unwrap() {
            cookie = d.u64().unwrap();
            d.opaque(255).unwrap();
            d.bitmap(8).unwrap();
            d.opaque(4096).unwrap();
            n += 1;
        }
        assert!(n > 0);
        assert_eq!(counted() - before, n, "reply {replies}: entries sent");
        listed += n;
        replies += 1;
        seq += 1;
        if d.bool().unwrap() {
            break;
        }
    }
    assert_eq!(listed, 200);
    assert!(replies > 3, "{replies} replies: the test wants several");
    let _ = std::fs::remove_dir_all(dir);
}

/// The thread's file system ids as the kernel has them (fsuid, fsgid).
fn thread_fs_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let field = |name: &str| -> u32 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(4).unwrap().parse().unwrap()
    };
    (field("Uid:"), field("Gid:"))
}

/// A client that does not work as root pays for a change of identity
/// only where an op acts as the caller: not for SEQUENCE and PUTFH (the
/// export opens a handle as root itself, and only when its cache does
/// not have the descriptor), not for GETATTR, and for READ only to open
/// the file when the stateid is a special one. The caller's permissions
/// still decide that open, and the thread is root again after every
/// COMPOUND.
#[test]
fn a_clients_identity_is_taken_only_where_an_op_acts_as_the_caller() {
    use std::os::unix::fs::PermissionsExt;
    let (srv, dir) = server("identity");
    std::fs::create_dir(dir.join("private")).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("private/f"), &data).unwrap();
    std::fs::write(dir.join("private/secret"), b"root only").unwrap();
    std::fs::set_permissions(
        dir.join("private/secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(dir.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let sid = session(&srv);
    let ex = &srv.exports.list()[0].fs;
    let handle = |p: &std::ffi::CStr| {
        ex.handle_in(std::os::fd::AsFd::as_fd(&*ex.root_fd()), p)
            .unwrap()
    };
    let (f, secret) = (handle(c"private/f"), handle(c"private/secret"));
    let user = Cred {
        uid: 1000,
        gid: 1000,
        gids: vec![],
        flavor: crate::rpc::AUTH_SYS,
    };
    let mut seq = 0;
    // Runs SEQUENCE, PUTFH `fh` and `op`: the results and the credential
    // changes the thread made.
    let mut run = |fh: &[u8], op: (u32, Vec<u8>)| {
        seq += 1;
        let ops = [
            sequence(&sid, seq, 0, false),
            (op::PUTFH, args(&NfsFh4(fh.to_vec()))),
            op,
        ];
        let before = crate::engine::cred::changes();
        let body = pc(&srv, &user, &compound(1, &ops)).expect("framed");
        let changes = crate::engine::cred::changes() - before;
        assert_eq!(thread_fs_ids(), (0, 0), "the thread kept the caller's ids");
        (split_results(&body), changes)
    };
    let getattr = || (op::GETATTR, args(&Bitmap4::of(&[attr::SIZE])));
    // Not cached yet: opened by handle as root (fsuid and fsgid there and
    // back) in a directory only root may search.
    let ((st, results, _, _), changes) = run(&f, getattr());
    assert_eq!(st, status::OK, "{results:?}");
    assert_eq!(changes, 0, "GETATTR ran as the caller");
    let ((st, results, _, _), changes) = run(&f, getattr());
    assert_eq!(st, status::OK, "{results:?}");
    assert_eq!(changes, 0);
    // READ with the anonymous stateid: the open is the caller's, taken
    // (fsgid, fsuid) and given back. The first time the thread also
    // gives up CAP_SYS_RESOURCE, which it then keeps off: the thread has
    // just served root, who has it where the server has it at all.
    drop(crate::engine::cred::assume(
        &crate::engine::cred::Identity {
            uid: 0,
            gid: 0,
            groups: vec![],
        },
    ));
    let had = crate::engine::cred::has_resource_cap();
    let ((st, results, got, _), changes) = run(&f, read_op(0, 8192));
    assert_eq!(st, status::OK, "{results:?}");
    assert_eq!(got.as_deref(), Some(&data[..]));
    assert_eq!(changes, 4 + u64::from(had));
    assert!(!crate::engine::cred::has_resource_cap());
    let ((st, _, got, _), changes) = run(&f, read_op(0, 8192));
    assert_eq!(st, status::OK);
    assert_eq!(got.as_deref(), Some(&data[..]));
    assert_eq!(changes, 4);
    let ((st, _, got, _), _) = run(&secret, read_op(0, 100));
    assert_eq!(st, status::ACCESS, "read a file only root may read");
    assert_eq!(got, None);
    // As root, the same READ works.
    seq += 1;
    let ops = [
        sequence(&sid, seq, 0, false),
        (op::PUTFH, args(&NfsFh4(secret.clone()))),
        read_op(0, 100),
    ];
    let (st, _, got, _) = split_results(&pc(&srv, &root(), &compound(1, &ops)).unwrap());
    assert_eq!(st, status::OK);
    assert_eq!(got.as_deref(), Some(&b"root only"[..]));
    let _ = std::fs::remove_dir_all(dir);
}

/// A server whose export has a directory `d` anyone may write, with
/// `d/a`, uid 1000's, mode 0600, and `d/shared`, mode 0666.
fn two_callers(tag: &str) -> (Server, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let (srv, dir) = server(tag);
    let mode = |p: &str, m: u32| {
        std::fs::set_permissions(dir.join(p), std::fs::Permissions::from_mode(m)).unwrap()
    };
    std::fs::create_dir(dir.join("d")).unwrap();
    mode("d", 0o777);
    std::fs::write(dir.join("d/a"), b"the first caller's").unwrap();
    std::os::unix::fs::chown(dir.join("d/a"), Some(1000), Some(1000)).unwrap();
    mode("d/a", 0o600);
    std::fs::write(dir.join("d/shared"), b"anyone's").unwrap();
    mode("d/shared", 0o666);
    (srv, dir)
}

/// The handle of `path` in the first export.
fn handle_of(srv: &Server, path: &std::ffi::CStr) -> Vec<u8> {
    let ex = &srv.exports.list()[0].fs;
    ex.handle_in(std::os::fd::AsFd::as_fd(&*ex.root_fd()), path)
        .unwrap()
}

/// AUTH_SYS as `uid`, group `uid`, no other groups.
fn user(uid: u32) -> Cred {
    Cred {
        uid,
        gid: uid,
        gids: vec![],
        flavor: crate::rpc::AUTH_SYS,
    }
}

/// WRITE of `data` at offset 0 with the anonymous stateid, `stable` as
/// stable_how4.
fn anonymous_write(stable: u32, data: &[u8]) -> (u32, Vec<u8>) {
    let mut e = Encoder::new();
    crate::nfs4::msg::WriteArgs {
        stateid: Stateid4::ANONYMOUS,
        offset: 0,
        stable,
        data,
    }
    .encode(&mut e);
    (op::WRITE, e.into_inner())
}

/// A request thread keeps its last caller's identity (see
/// `cred::lending`) for that caller's next request only. The same
/// caller's next FILE_SYNC WRITE changes no credentials; another
/// caller's WRITE on the thread is refused what only the first may do,
/// and a file it creates is its own; a READ, which takes the caller's
/// identity only to open the file, starts with it for the same caller
/// and gives it back after the open.
/// Each COMPOUND runs as a connection runs it: its quick ops first, on
/// a thread of their own, then the rest as a request thread does.
#[test]
fn a_request_thread_keeps_a_callers_identity_for_that_caller_only() {
    use super::compound::{try_compound, Step};
    use crate::engine::cred;
    use std::os::unix::fs::MetadataExt;
    let (srv, dir) = two_callers("lending");
    let sid = session(&srv);
    let (d, a, shared) = (
        handle_of(&srv, c"d"),
        handle_of(&srv, c"d/a"),
        handle_of(&srv, c"d/shared"),
    );
    let (first, other) = (user(1000), user(2000));
    // FILE_SYNC: storage work, for a request thread.
    let write = || anonymous_write(2, b"written");
    // On a thread of its own, which the test leaves with a caller's
    // identity.
    std::thread::scope(|s| {
        s.spawn(|| {
            let seq = std::cell::Cell::new(0);
            // SEQUENCE, PUTFH `fh` and `op` as `cred`: the status, where
            // it finished, and the credential changes of the thread.
            let run_ops = |cred: &Cred, rest: Vec<(u32, Vec<u8>)>| {
                seq.set(seq.get() + 1);
                let mut ops = vec![sequence(&sid, seq.get(), 0, false)];
                ops.extend(rest);
                // The connection's part on a thread of its own.
                let quick = std::thread::scope(|s| {
                    s.spawn(|| {
                        match try_compound(&srv, compound(1, &ops), 0, cred.clone(), None, None) {
                            Step::Done(b) => Err((b, RanOn::Task)),
                            Step::Paused(p) => match p.try_quick(&srv) {
                                Step::Done(b) => Err((b, RanOn::Quick)),
                                Step::Paused(p) => Ok(p),
                            },
                        }
                    })
                    .join()
                    .unwrap()
                });
                let before = cred::changes();
                let (body, on) = match quick {
                    Err(done) => done,
                    Ok(p) => (cred::lending(|| p.resume(&srv)), RanOn::Worker),
                };
                let (st, results, _, _) = split_results(&body.expect("framed").into_inner());
                (st, results, on, cred::changes() - before)
            };
            let putfh = |fh: &[u8]| (op::PUTFH, args(&NfsFh4(fh.to_vec())));
            let run =
                |cred: &Cred, fh: &[u8], op: (u32, Vec<u8>)| run_ops(cred, vec![putfh(fh), op]);
            let (st, results, on, _) = run(&first, &a, write());
            assert_eq!((st, on), (status::OK, RanOn::Worker), "{results:?}");
            assert_eq!(
                thread_fs_ids(),
                (1000, 1000),
                "the thread gave the identity back"
            );
            assert!(cred::lent());
            let (st, _, on, changes) = run(&first, &a, write());
            assert_eq!((st, on), (status::OK, RanOn::Worker));
            assert_eq!(
                changes, 0,
                "the same caller's next WRITE changed credentials"
            );
            // Another caller: refused the first one's file.
            let (st, _, on, _) = run(&other, &a, write());
            assert_eq!(
                (st, on),
                (status::ACCESS, RanOn::Worker),
                "WRITE as the caller before"
            );
            assert_eq!(thread_fs_ids(), (2000, 2000));
            // Back to the first, then the other creates a file: its own.
            assert_eq!(run(&first, &a, write()).0, status::OK);
            assert_eq!(thread_fs_ids(), (1000, 1000));
            // (The WRITE takes the COMPOUND to the request thread.)
            let ops = vec![
                putfh(&shared),
                write(),
                putfh(&d),
                open_op(b"other", "made", true),
            ];
            let (st, results, on, _) = run_ops(&other, ops);
            assert_eq!((st, on), (status::OK, RanOn::Worker), "{results:?}");
            let m = std::fs::metadata(dir.join("d/made")).unwrap();
            assert_eq!(
                (m.uid(), m.gid()),
                (2000, 2000),
                "created as the caller before"
            );
            // A READ of data not in memory, with the anonymous stateid,
            // which takes the caller's identity only to open the file:
            // for the same caller it starts with the identity kept.
            assert_eq!(run(&first, &a, write()).0, status::OK);
            let f = std::fs::File::open(dir.join("d/a")).unwrap();
            // SAFETY: plain system call on a descriptor of ours.
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                    0,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
            let (st, results, on, changes) = run(&first, &a, read_op(0, 7));
            assert_eq!((st, on), (status::OK, RanOn::Worker), "{results:?}");
            // The open is one step: its guard gives the server's
            // identity back after it (fsuid and fsgid), whatever the
            // thread kept, as what follows may be the server's work.
            assert_eq!(changes, 2);
            assert_eq!(thread_fs_ids(), (0, 0));
            assert!(!cred::lent());
        });
    });
    assert_eq!(
        std::fs::read(dir.join("d/a")).unwrap(),
        b"writtenst caller's"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A connection's thread keeps its last caller's identity too (see
/// `tasks::spawn_requests`): a COMPOUND of the same caller runs with it
/// from SEQUENCE on and changes no credentials; another caller's gets the
/// server's identity back at SEQUENCE and then takes its own, and is
/// refused the first one's file; an op on clients or stateids runs as the
/// server. Here one thread runs every part of each COMPOUND.
#[test]
fn a_connections_thread_keeps_a_callers_identity_for_that_caller_only() {
    use super::compound::{try_compound, Step};
    use crate::engine::cred;
    let (srv, dir) = two_callers("lending-task");
    let sid = session(&srv);
    let d = handle_of(&srv, c"d");
    let (first, other) = (user(1000), user(2000));
    let write = || anonymous_write(0, b"x");
    std::thread::scope(|s| {
        s.spawn(|| {
            let seq = std::cell::Cell::new(0);
            // SEQUENCE and `rest` as `cred`, every part on this thread,
            // which lends: the status and the thread's credential changes.
            let run = |cred: &Cred, rest: Vec<(u32, Vec<u8>)>| {
                seq.set(seq.get() + 1);
                let mut ops = vec![sequence(&sid, seq.get(), 0, false)];
                ops.extend(rest);
                let before = cred::changes();
                let body = cred::lending(|| {
                    match try_compound(&srv, compound(1, &ops), 0, cred.clone(), None, None) {
                        Step::Done(b) => b,
                        Step::Paused(p) => match p.try_quick(&srv) {
                            Step::Done(b) => b,
                            Step::Paused(p) => p.resume(&srv),
                        },
                    }
                });
                let (st, results, _, _) = split_results(&body.expect("framed").into_inner());
                (st, results, cred::changes() - before)
            };
            let look = |name: &str| vec![(op::PUTFH, args(&NfsFh4(d.clone()))), lookup_op(name)];
            let (st, results, _) = run(&first, look("a"));
            assert_eq!(st, status::OK, "{results:?}");
            assert_eq!(thread_fs_ids(), (1000, 1000));
            let (st, _, changes) = run(&first, look("a"));
            assert_eq!(st, status::OK);
            assert_eq!(
                changes, 0,
                "the same caller's next LOOKUP changed credentials"
            );
            let mut ops = look("a");
            ops.push(write());
            let (st, _, changes) = run(&first, ops.clone());
            assert_eq!((st, changes), (status::OK, 0));
            // Another caller: the server's identity back at SEQUENCE (2),
            // then its own for LOOKUP (2); refused the first one's file.
            let (st, _, changes) = run(&other, look("a"));
            assert_eq!((st, changes), (status::OK, 4));
            assert_eq!(thread_fs_ids(), (2000, 2000));
            let (st, results, _) = run(&first, ops.clone());
            assert_eq!(st, status::OK, "{results:?}");
            let (st, results, _) = run(&other, ops);
            assert_eq!(
                st,
                status::ACCESS,
                "WRITE as the caller before: {results:?}"
            );
            // TEST_STATEID (on stateids, not on a file): as the server.
            let (st, results, _) = run(
                &other,
                vec![(op::TEST_STATEID, 0u32.to_be_bytes().to_vec())],
            );
            assert_eq!(st, status::OK, "{results:?}");
            assert_eq!(
                thread_fs_ids(),
                (0, 0),
                "TEST_STATEID ran as the caller before"
            );
            assert!(!cred::lent());
        });
    });
    assert_eq!(&std::fs::read(dir.join("d/a")).unwrap()[..2], b"xh");
    let _ = std::fs::remove_dir_all(dir);
}

/// Where a COMPOUND was finished: on the connection's task without
/// waiting, on it by its quick ops (`Paused::try_quick`), or on a worker.
#[derive(Debug, PartialEq, Eq)]
enum RanOn {
    Task,
    Quick,
    /// By its quick ops, then answered after a task waited for the
    /// directory syncs they left (see `Paused::sync`).
    QuickSynced,
    Worker,
}

/// OPEN of `name` in the current directory for reading and writing by
/// open owner `owner`, creating it (UNCHECKED4, no attributes) with
/// `create`.
fn open_op(owner: &[u8], name: &str, create: bool) -> (u32, Vec<u8>) {
    use crate::nfs4::msg::{Createhow4, OpenArgs, OpenClaim4, Openflag4, StateOwner4};
    let a = OpenArgs {
        seqid: 0,
        share_access: 3,
        share_deny: 0,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner.to_vec(),
        },
        openhow: if create {
            Openflag4::Create(Createhow4::Unchecked(Fattr4::default()))
        } else {
            Openflag4::NoCreate
        },
        claim: OpenClaim4::Null(Component4::new(name)),
    };
    (op::OPEN, args(&a))
}

/// A new session on `srv`, and a function that runs SEQUENCE and the
/// given ops in it as [`run_quick`] does, checks that they succeeded, and
/// tells where they ran.
fn quick_session(srv: &Server) -> impl FnMut(Vec<(u32, Vec<u8>)>) -> RanOn + '_ {
    let sid = session(srv);
    let mut seq = 0;
    move |rest| {
        seq += 1;
        let mut all = vec![sequence(&sid, seq, 0, false)];
        all.extend(rest);
        let (body, on) = run_quick(srv, compound(1, &all));
        let (st, results, _, _) = split_results(&body);
        assert_eq!(st, status::OK, "{results:?}");
        on
    }
}

/// Runs a COMPOUND as the connection task does when it has a turn at
/// quick ops, and says where it was finished.
fn run_quick(srv: &Server, args: Vec<u8>) -> (Vec<u8>, RanOn) {
    use super::compound::{try_compound, Step};
    match try_compound(srv, args, 0, root(), None, None) {
        Step::Done(body) => (body.expect("framed").into_inner(), RanOn::Task),
        Step::Paused(p) => finish_quick(srv, p.try_quick(srv)),
    }
}

/// Runs `f` while a sync of the directory `dir` runs: one held on
/// another thread from before `f` starts until `f` has returned, as
/// changes of the directory find it when another change's sync is on its
/// way to the disk.
fn while_syncing<T>(srv: &Server, dir: &std::path::Path, f: impl FnOnce() -> T) -> T {
    use std::os::unix::fs::MetadataExt;
    use std::sync::mpsc::channel;
    let m = std::fs::metadata(dir).unwrap();
    let key = (m.dev(), m.ino());
    let (started, running) = channel();
    let (release, released) = channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            srv.dir_syncs.sync(key, || {
                started.send(()).unwrap();
                released.recv().unwrap();
                Ok(())
            })
        });
        running.recv().unwrap();
        assert!(srv.dir_syncs.running(key));
        let out = f();
        release.send(()).unwrap();
        out
    })
}

/// [`run_quick`] while a sync of the directory `dir` runs (see
/// [`while_syncing`]) until the quick ops have run.
fn run_quick_while_syncing(srv: &Server, dir: &std::path::Path, args: Vec<u8>) -> (Vec<u8>, RanOn) {
    use super::compound::{try_compound, Step};
    let step = while_syncing(srv, dir, || {
        match try_compound(srv, args, 0, root(), None, None) {
            Step::Done(body) => Err(body.expect("framed").into_inner()),
            Step::Paused(p) => Ok(p.try_quick(srv)),
        }
    });
    match step {
        Err(body) => (body, RanOn::Task),
        Ok(step) => finish_quick(srv, step),
    }
}

/// Finishes a COMPOUND whose quick ops ran as `step` left it, as the
/// connection does, and says where it was finished.
fn finish_quick(srv: &Server, step: super::compound::Step) -> (Vec<u8>, RanOn) {
    use super::compound::Step;
    match step {
        Step::Done(body) => (body.expect("framed").into_inner(), RanOn::Quick),
        Step::Paused(p) if p.awaits_syncs() => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            match rt.block_on(p.sync(srv)) {
                Step::Done(body) => (body.expect("framed").into_inner(), RanOn::QuickSynced),
                Step::Paused(p) => match p.try_quick(srv) {
                    Step::Done(body) => (body.expect("framed").into_inner(), RanOn::QuickSynced),
                    Step::Paused(p) => (p.resume(srv).expect("framed").into_inner(), RanOn::Worker),
                },
            }
        }
        Step::Paused(p) => (p.resume(srv).expect("framed").into_inner(), RanOn::Worker),
    }
}

/// Name changes, small UNSTABLE WRITEs and attribute changes other than
/// the size are quick: the connection's task runs them when it may. What
/// goes to storage (COMMIT, FILE_SYNC and large WRITEs, a SETATTR of the
/// size, the first OPEN of a client, which writes its stable record) is
/// still handed to a worker. Each op runs once and does its work. (On an
/// export with `sync` false: see the test after this one for the
/// default.)
#[test]
fn quick_ops_run_on_the_connection_task_and_storage_work_does_not() {
    use crate::nfs4::msg::{CommitArgs, SetattrArgs, WriteArgs};
    let (srv, dir) = async_server("quick");
    std::fs::write(dir.join("f"), b"x").unwrap();
    std::fs::write(dir.join("gone"), b"x").unwrap();
    let mut run = quick_session(&srv);
    let file = || vec![(op::PUTROOTFH, vec![]), lookup_op("f")];
    let write = |stable: u32, len: usize| {
        let mut e = Encoder::new();
        WriteArgs {
            stateid: Stateid4::ANONYMOUS,
            offset: 0,
            stable,
            data: &vec![7u8; len],
        }
        .encode(&mut e);
        (op::WRITE, e.into_inner())
    };
    let setattr = |bits: &[u32], vals: Vec<u8>| {
        let a = SetattrArgs {
            stateid: Stateid4::ANONYMOUS,
            attrs: Fattr4 {
                mask: Bitmap4::of(bits),
                vals,
            },
        };
        (op::SETATTR, args(&a))
    };
    let open = |name: &str| open_op(b"quick", name, true);

    // The first OPEN writes the client's stable record: a worker's job.
    let on = run(vec![(op::PUTROOTFH, vec![]), open("o1")]);
    assert_eq!(on, RanOn::Worker, "an OPEN that writes the client's record");
    let on = run(vec![(op::PUTROOTFH, vec![]), open("o2")]);
    assert_eq!(on, RanOn::Quick, "an OPEN of a recorded client");
    assert!(dir.join("o2").exists());

    let on = run(vec![
        (op::PUTROOTFH, vec![]),
        (op::REMOVE, args(&Component4::new("gone"))),
    ]);
    assert_eq!(on, RanOn::Quick, "REMOVE");
    assert!(!dir.join("gone").exists());
    let rename = args(&RenameArgs {
        oldname: Component4::new("o1"),
        newname: Component4::new("o3"),
    });
    let on = run(vec![
        (op::PUTROOTFH, vec![]),
        (op::SAVEFH, vec![]),
        (op::RENAME, rename),
    ]);
    assert_eq!(on, RanOn::Quick, "RENAME");
    assert!(dir.join("o3").exists() && !dir.join("o1").exists());

    let on = run([file(), vec![write(0, 4096)]].concat());
    assert_eq!(on, RanOn::Quick, "a 4 KiB UNSTABLE WRITE");
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), vec![7u8; 4096]);
    for (stable, len, what) in [
        (2, 4096, "a FILE_SYNC WRITE"),
        (1, 4096, "a DATA_SYNC WRITE"),
        (0, super::inline::QUICK_WRITE + 4096, "a large WRITE"),
    ] {
        let on = run([file(), vec![write(stable, len)]].concat());
        assert_eq!(on, RanOn::Worker, "{what}");
    }
    let commit = args(&CommitArgs {
        offset: 0,
        count: 0,
    });
    assert_eq!(
        run([file(), vec![(op::COMMIT, commit)]].concat()),
        RanOn::Worker
    );

    let on = run([
        file(),
        vec![setattr(&[attr::MODE], 0o600u32.to_be_bytes().to_vec())],
    ]
    .concat());
    assert_eq!(on, RanOn::Quick, "a SETATTR of the mode");
    let on = run([
        file(),
        vec![setattr(&[attr::SIZE], 10u64.to_be_bytes().to_vec())],
    ]
    .concat());
    assert_eq!(on, RanOn::Worker, "a SETATTR of the size");
    let meta = std::fs::metadata(dir.join("f")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (10, 0o600));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// On an export with `sync` (the default), the ops that sync what they
/// changed before answering and make a new object or sync a file
/// (CREATE, an OPEN that creates, LINK, SETATTR) go to a worker: a sync
/// on the connection's task would hold up every connection that task
/// serves. REMOVE and RENAME run quick, and their COMPOUND is answered
/// after a task waited for the directory's sync. Each is synced once
/// (counted in `metadata_commits`; an OPEN that sets the size of the
/// file it makes, twice: the directory, then the file), while what
/// changes nothing on disk (an UNSTABLE WRITE, an OPEN without create)
/// stays quick and syncs nothing.
#[test]
fn changes_synced_before_their_answer_wait_for_their_syncs() {
    use crate::nfs4::msg::{CreateArgs, Createtype4, SetattrArgs, WriteArgs};
    use std::sync::atomic::Ordering;
    let (srv, dir) = server("synced");
    std::fs::write(dir.join("f"), b"x").unwrap();
    std::fs::write(dir.join("gone"), b"x").unwrap();
    let mut run = quick_session(&srv);
    let commits = || srv.metrics.metadata_commits.load(Ordering::Relaxed);
    let open = |name: &str, create: bool| open_op(b"synced", name, create);
    let open_with = |name: &str, mask: Bitmap4, vals: Vec<u8>| {
        use crate::nfs4::msg::{Createhow4, OpenArgs, OpenClaim4, Openflag4, StateOwner4};
        args(&OpenArgs {
            seqid: 0,
            share_access: 3,
            share_deny: 0,
            owner: StateOwner4 {
                clientid: 0,
                owner: b"synced".to_vec(),
            },
            openhow: Openflag4::Create(Createhow4::Unchecked(Fattr4 { mask, vals })),
            claim: OpenClaim4::Null(Component4::new(name)),
        })
    };
    let root = || (op::PUTROOTFH, vec![]);
    // The client's first OPEN (its stable record) goes to a worker anyway.
    assert_eq!(run(vec![root(), open("o1", true)]), RanOn::Worker);
    let mkdir = args(&CreateArgs {
        objtype: Createtype4::Dir,
        objname: Component4::new("d"),
        attrs: Fattr4::default(),
    });
    let rename = args(&RenameArgs {
        oldname: Component4::new("o1"),
        newname: Component4::new("o3"),
    });
    let rename_into_d = args(&RenameArgs {
        oldname: Component4::new("o3"),
        newname: Component4::new("o6"),
    });
    let chmod = args(&SetattrArgs {
        stateid: Stateid4::ANONYMOUS,
        attrs: Fattr4 {
            mask: Bitmap4::of(&[attr::MODE]),
            vals: 0o600u32.to_be_bytes().to_vec(),
        },
    });
    let mut e = Encoder::new();
    WriteArgs {
        stateid: Stateid4::ANONYMOUS,
        offset: 0,
        stable: 0,
        data: &[7u8; 4096],
    }
    .encode(&mut e);
    let write = e.into_inner();
    for (ops, on, synced, what) in [
        (
            vec![root(), open("o2", true)],
            RanOn::Worker,
            1,
            "an OPEN that creates",
        ),
        (
            vec![
                root(),
                (
                    op::OPEN,
                    open_with(
                        "o5",
                        Bitmap4::of(&[attr::SIZE]),
                        0u64.to_be_bytes().to_vec(),
                    ),
                ),
            ],
            RanOn::Worker,
            2,
            "an OPEN that creates with a size (the directory, then the file)",
        ),
        (
            vec![root(), open("f", false)],
            RanOn::Quick,
            0,
            "an OPEN without create",
        ),
        (
            vec![root(), (op::CREATE, mkdir)],
            RanOn::Worker,
            1,
            "CREATE of a directory",
        ),
        (
            vec![root(), (op::REMOVE, args(&Component4::new("gone")))],
            RanOn::QuickSynced,
            1,
            "REMOVE",
        ),
        (
            vec![root(), (op::SAVEFH, vec![]), (op::RENAME, rename)],
            RanOn::Worker,
            1,
            "RENAME (no sync of its directory running)",
        ),
        (
            vec![
                root(),
                (op::SAVEFH, vec![]),
                lookup_op("d"),
                (op::RENAME, rename_into_d),
            ],
            RanOn::Worker,
            2,
            "RENAME into another directory (both synced)",
        ),
        (
            vec![root(), lookup_op("f"), (op::SETATTR, chmod)],
            RanOn::Worker,
            1,
            "SETATTR of the mode",
        ),
        (
            vec![root(), lookup_op("f"), (op::WRITE, write)],
            RanOn::Quick,
            0,
            "a 4 KiB UNSTABLE WRITE",
        ),
    ] {
        let before = commits();
        assert_eq!(run(ops), on, "{what}");
        assert_eq!(commits() - before, synced, "syncs for {what}");
    }
    assert!(dir.join("o2").exists() && dir.join("o5").exists() && dir.join("d/o6").exists());
    assert!(!dir.join("o3").exists());
    assert!(!dir.join("gone").exists() && !dir.join("o1").exists());
    // While a sync of their directory runs, RENAME and REMOVE run on the
    // connection's task and share the next sync, waited for by a task.
    let sid = session(&srv);
    let mut seq = 0;
    let d = dir.join("d");
    for (ops, what) in [
        (
            vec![
                root(),
                lookup_op("d"),
                (op::SAVEFH, vec![]),
                (
                    op::RENAME,
                    args(&RenameArgs {
                        oldname: Component4::new("o6"),
                        newname: Component4::new("o7"),
                    }),
                ),
            ],
            "RENAME",
        ),
        (
            vec![
                root(),
                lookup_op("d"),
                (op::REMOVE, args(&Component4::new("o7"))),
            ],
            "REMOVE",
        ),
    ] {
        seq += 1;
        let mut all = vec![sequence(&sid, seq, 0, false)];
        all.extend(ops);
        let before = commits();
        let (body, on) = run_quick_while_syncing(&srv, &d, compound(1, &all));
        let (st, results, _, _) = split_results(&body);
        assert_eq!(st, status::OK, "{what}: {results:?}");
        assert_eq!(on, RanOn::QuickSynced, "{what} while a sync runs");
        // The held sync counts no commit; the one after it does.
        assert_eq!(commits() - before, 1, "syncs for {what}");
    }
    assert!(std::fs::read_dir(&d).unwrap().next().is_none());
    let _ = std::fs::remove_dir_all(dir);
}

/// A COMPOUND whose quick REMOVE left its directory's sync pauses right
/// after it: the op after it (GETFH) runs only once the sync is done, and
/// a sync that failed turns the REMOVE's result into its error and ends
/// the COMPOUND there, as if the REMOVE had synced itself.
#[test]
fn a_deferred_sync_comes_before_the_next_op_and_its_failure_fails_the_op() {
    use super::compound::{try_compound, Step};
    let (srv, dir) = server("deferred");
    for f in ["a", "b"] {
        std::fs::write(dir.join(f), b"x").unwrap();
    }
    let sid = session(&srv);
    let remove = |seq: u32, name: &str| {
        compound(
            1,
            &[
                sequence(&sid, seq, 0, false),
                (op::PUTROOTFH, vec![]),
                (op::REMOVE, args(&Component4::new(name))),
                (op::GETFH, vec![]),
            ],
        )
    };
    let paused = |call: Vec<u8>| {
        let Step::Paused(p) = try_compound(&srv, call, 0, root(), None, None) else {
            panic!("REMOVE answered without running")
        };
        let Step::Paused(p) = p.try_quick(&srv) else {
            panic!("answered before the sync")
        };
        assert!(p.awaits_syncs(), "paused for something else than the sync");
        p
    };
    let ops = |results: &[(u32, Nfsstat4)]| results.iter().map(|r| r.0).collect::<Vec<_>>();
    // Waited for: GETFH follows.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let commits = srv
        .metrics
        .metadata_commits
        .load(std::sync::atomic::Ordering::Relaxed);
    let body = match rt.block_on(paused(remove(1, "a")).sync(&srv)) {
        Step::Paused(p) => match p.try_quick(&srv) {
            Step::Done(body) => body.unwrap().into_inner(),
            Step::Paused(_) => panic!("GETFH did not run quick"),
        },
        Step::Done(_) => panic!("the COMPOUND ended at the REMOVE"),
    };
    let mut fh = None;
    let (st, results) = each_result(&body, |o, d| match o {
        // change_info4
        op::REMOVE => {
            d.bool().unwrap();
            d.u64().unwrap();
            d.u64().unwrap();
        }
        op::GETFH => fh = Some(NfsFh4::decode(d).unwrap().0),
        _ => {}
    });
    assert_eq!(st, status::OK);
    assert_eq!(
        ops(&results),
        [op::SEQUENCE, op::PUTROOTFH, op::REMOVE, op::GETFH]
    );
    assert!(fh.is_some());
    assert_eq!(
        srv.metrics
            .metadata_commits
            .load(std::sync::atomic::Ordering::Relaxed)
            - commits,
        1
    );
    // Failed: the REMOVE fails with the sync's error, GETFH does not run.
    let Step::Done(body) = paused(remove(2, "b")).synced_with(Err(status::IO)) else {
        panic!("the COMPOUND went on after its sync failed")
    };
    let (st, results, _, _) = split_results(&body.unwrap().into_inner());
    assert_eq!(st, status::IO);
    assert_eq!(
        results,
        [
            (op::SEQUENCE, status::OK),
            (op::PUTROOTFH, status::OK),
            (op::REMOVE, status::IO)
        ]
    );
    assert!(!dir.join("a").exists() && !dir.join("b").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// NFSv3's procedures that do what NFSv4's quick ops do are quick too,
/// with the same exceptions for work that goes to storage; on an export
/// with `sync` (the default) those that sync what they changed are not,
/// but REMOVE and RMDIR (and RENAME), which leave their directory's sync
/// to the caller, as NFSv4's REMOVE and RENAME do.
#[test]
fn nfsv3_calls_are_quick_as_their_nfsv4_ops_are() {
    use crate::nfs3::{proc3, stable};
    let (srv, dir) = async_server("quick3");
    let fh = [9u8; 32];
    let write = |how: u32, len: usize| {
        let mut e = Encoder::new();
        e.opaque(&fh);
        e.u64(0);
        e.u32(len as u32);
        e.u32(how);
        e.opaque(&vec![1u8; len]);
        e.into_inner()
    };
    let dirop = {
        let mut e = Encoder::new();
        e.opaque(&fh);
        e.string("name");
        e.into_inner()
    };
    let setattr = |size: bool| {
        let mut e = Encoder::new();
        e.opaque(&fh);
        // sattr3: mode, uid, gid not set; size set or not; times kept.
        e.u32(1);
        e.u32(0o644);
        e.u32(0);
        e.u32(0);
        e.u32(size as u32);
        if size {
            e.u64(0);
        }
        e.u32(0);
        e.u32(0);
        e.u32(0); // no ctime guard
        e.into_inner()
    };
    let quick = |p: u32, a: &[u8]| super::nfs3::quick(&srv, p, a);
    assert!(quick(proc3::REMOVE, &dirop));
    assert!(quick(proc3::RMDIR, &dirop));
    assert!(quick(proc3::WRITE, &write(stable::UNSTABLE, 4096)));
    assert!(!quick(proc3::WRITE, &write(stable::FILE_SYNC, 4096)));
    assert!(!quick(proc3::WRITE, &write(stable::DATA_SYNC, 4096)));
    assert!(!quick(proc3::WRITE, &write(stable::UNSTABLE, 128 * 1024)));
    assert!(quick(proc3::SETATTR, &setattr(false)));
    assert!(!quick(proc3::SETATTR, &setattr(true)));
    let mut commit = Encoder::new();
    commit.opaque(&fh);
    commit.u64(0);
    commit.u32(0);
    assert!(!quick(proc3::COMMIT, &commit.into_inner()));
    // Malformed arguments are not quick: the worker answers GARBAGE_ARGS.
    assert!(!quick(proc3::REMOVE, &[0, 0, 0]));
    let (synced, sdir) = server("quick3-sync");
    let quick = |p: u32, a: &[u8]| super::nfs3::quick(&synced, p, a);
    // REMOVE and RMDIR leave their directory's sync to the caller, and
    // so does a RENAME into a directory being synced; one into a
    // directory that is not goes to a worker, which syncs it. (A handle
    // that names no directory is answered at once.)
    for p in [proc3::REMOVE, proc3::RMDIR] {
        assert!(quick(p, &dirop), "procedure {p} is not quick");
    }
    let root_fh = synced.exports.list()[0].fs.root_fh().to_vec();
    let dirop_root = {
        let mut e = Encoder::new();
        e.opaque(&root_fh);
        e.string("name");
        e.into_inner()
    };
    let rename_root = [&dirop_root[..], &dirop_root[..]].concat();
    assert!(quick(proc3::RENAME, &[&dirop[..], &dirop[..]].concat()));
    assert!(!quick(proc3::RENAME, &rename_root));
    assert!(while_syncing(&synced, &sdir, || quick(
        proc3::RENAME,
        &rename_root
    )));
    let mut mkdir = Encoder::new();
    mkdir.opaque(&fh);
    mkdir.string("name");
    for _ in 0..6 {
        mkdir.u32(0); // sattr3: nothing set
    }
    assert!(
        !quick(proc3::MKDIR, &mkdir.into_inner()),
        "MKDIR makes an object"
    );
    assert!(!quick(proc3::SETATTR, &setattr(false)));
    assert!(quick(proc3::WRITE, &write(stable::UNSTABLE, 4096)));
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(sdir);
}

/// An NFSv3 REMOVE on a `sync` export, run where its sync is left to the
/// caller, comes back done with its directory's sync to wait for; a sync
/// that failed turns its NFS3_OK into the sync's error, and the results
/// keep their form (wcc_data either way).
#[test]
fn an_nfsv3_remove_leaves_its_sync_and_a_failed_one_fails_it() {
    use super::nfs3::{call, Done3};
    use crate::nfs3::proc3;
    let (srv, dir) = server("remove3-sync");
    for f in ["a", "b"] {
        std::fs::write(dir.join(f), b"x").unwrap();
    }
    let root_fh = srv.exports.list()[0].fs.root_fh().to_vec();
    let remove = |name: &str| {
        let mut e = Encoder::new();
        e.opaque(&root_fh);
        e.string(name);
        e.into_inner()
    };
    let done = |name: &str| match call(
        &srv,
        proc3::REMOVE,
        &remove(name),
        &root(),
        None,
        false,
        true,
    ) {
        Done3::Syncing(body, pending) => (body, pending),
        _ => panic!("REMOVE of {name} did not leave its sync"),
    };
    let (body, pending) = done("a");
    assert_eq!(pending.len(), 1);
    let ok = body.to_vec();
    assert_eq!(ok[..4], [0, 0, 0, 0]);
    let Done3::Reply(after) = super::nfs3_synced(body, Ok(())) else {
        panic!()
    };
    assert_eq!(
        after.to_vec(),
        ok,
        "a sync that succeeded changed the results"
    );
    let (body, _) = done("b");
    let ok = body.to_vec();
    let Done3::Reply(failed) = super::nfs3_synced(body, Err(status::IO)) else {
        panic!()
    };
    let failed = failed.to_vec();
    assert_eq!(failed[..4], 5u32.to_be_bytes(), "NFS3ERR_IO");
    assert_eq!(failed[4..], ok[4..]);
    // A worker syncs itself: nothing left.
    std::fs::write(dir.join("c"), b"x").unwrap();
    assert!(matches!(
        call(
            &srv,
            proc3::REMOVE,
            &remove("c"),
            &root(),
            None,
            false,
            false
        ),
        Done3::Reply(_)
    ));
    assert!(!dir.join("a").exists() && !dir.join("b").exists() && !dir.join("c").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// A READ that found it would have to wait is not tried again by the
/// quick path: a cold reader with one large READ at a time stays on the
/// page-cache path, where a second try would have told the readahead
/// engine of two READs in flight and sent the stream past the page cache.
#[test]
fn the_quick_path_does_not_try_a_waiting_read_again() {
    use crate::nfs4::msg::{OpenArgs, OpenClaim4, OpenResOk, Openflag4, StateOwner4};
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    let (srv, dir) = server("quickread");
    const MIB: usize = 1 << 20;
    // Half a MiB per READ: the session's replies are at most 1 MiB.
    const BS: usize = MIB / 2;
    let data: Vec<u8> = (0..16 * MIB).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("cold"), &data).unwrap();
    let f = std::fs::File::open(dir.join("cold")).unwrap();
    f.sync_all().unwrap();
    // SAFETY: advice on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let sid = session(&srv);
    // Read through an open, as clients do: its READs are one stream.
    let open = args(&OpenArgs {
        seqid: 0,
        share_access: 1,
        share_deny: 0,
        owner: StateOwner4 {
            clientid: 0,
            owner: b"reader".to_vec(),
        },
        openhow: Openflag4::NoCreate,
        claim: OpenClaim4::Null(Component4::new("cold")),
    });
    let r = process_compound_ok(
        &srv,
        &compound(
            1,
            &[
                sequence(&sid, 1, 0, false),
                (op::PUTROOTFH, vec![]),
                (op::OPEN, open),
            ],
        ),
    );
    let mut d = Decoder::new(&r.body);
    reply_start(&mut d);
    SequenceResOk::decode(&mut d).unwrap();
    skip_results(&mut d, 1);
    assert_eq!(next_result(&mut d), (op::OPEN, status::OK));
    let stateid = OpenResOk::decode(&mut d).unwrap().stateid;
    let mut went_to_worker = 0;
    for (i, offset) in (0..data.len()).step_by(BS).enumerate() {
        let read = args(&ReadArgs {
            stateid,
            offset: offset as u64,
            count: BS as u32,
        });
        let ops = [
            sequence(&sid, i as u32 + 2, 0, false),
            (op::PUTROOTFH, vec![]),
            lookup_op("cold"),
            (op::READ, read),
        ];
        let (body, on) = run_quick(&srv, compound(1, &ops));
        went_to_worker += (on == RanOn::Worker) as u32;
        let (st, results, got, _) = split_results(&body);
        assert_eq!(st, status::OK, "{results:?}");
        assert!(
            got.unwrap() == data[offset..offset + BS],
            "READ at {offset}"
        );
    }
    assert!(went_to_worker > 0, "no READ of the cold file waited");
    let direct = srv
        .read
        .readahead
        .stats
        .direct_bytes
        .load(Ordering::Relaxed);
    assert_eq!(
        direct, 0,
        "a reader with one READ in flight went past the page cache"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The sizes the GETATTRs (of SIZE alone) of a COMPOUND4res of SEQUENCE,
/// PUTROOTFH, LOOKUP, GETFH, GETATTR and SETATTR answered, and the
/// (op, status) of each result.
fn sizes_in(body: &[u8]) -> (Vec<u64>, Vec<(u32, Nfsstat4)>) {
    let mut sizes = Vec::new();
    let (_, results) = each_result(body, |o, d| match o {
        op::GETFH => {
            NfsFh4::decode(d).unwrap();
        }
        op::GETATTR => {
            let f = Fattr4::decode(d).unwrap();
            assert_eq!(f.mask, Bitmap4::of(&[attr::SIZE]));
            sizes.push(Decoder::new(&f.vals).u64().unwrap());
        }
        op::SETATTR => {
            Bitmap4::decode(d).unwrap();
        }
        op::OPEN => {
            crate::nfs4::msg::OpenResOk::decode(d).unwrap();
        }
        _ => {}
    });
    (sizes, results)
}

/// A server whose export holds file "f" (4 bytes), and a session.
fn server_with_f(tag: &str) -> (Server, PathBuf, [u8; 16]) {
    let (srv, dir) = server(tag);
    std::fs::write(dir.join("f"), b"four").unwrap();
    let sid = session(&srv);
    (srv, dir, sid)
}

/// GETATTR of SIZE alone.
fn getattr_size() -> (u32, Vec<u8>) {
    (op::GETATTR, args(&Bitmap4::of(&[attr::SIZE])))
}

/// SETATTR of the size to `n`, with the anonymous stateid.
fn setattr_size(n: u64) -> (u32, Vec<u8>) {
    let mut vals = Encoder::new();
    vals.u64(n);
    let a = crate::nfs4::msg::SetattrArgs {
        stateid: Stateid4::ANONYMOUS,
        attrs: Fattr4 {
            mask: Bitmap4::of(&[attr::SIZE]),
            vals: vals.into_inner(),
        },
    };
    (op::SETATTR, args(&a))
}

/// GETATTR after an OPEN that truncated an existing file answers the
/// size the OPEN left, not the one it found.
#[test]
fn getattr_after_open_answers_the_file_as_the_open_left_it() {
    use crate::nfs4::msg::{Createhow4, OpenArgs, OpenClaim4, Openflag4, StateOwner4};
    let (srv, dir, sid) = server_with_f("open-stat");
    let mut vals = Encoder::new();
    vals.u64(0);
    let open = args(&OpenArgs {
        seqid: 0,
        share_access: 3,
        share_deny: 0,
        owner: StateOwner4 {
            clientid: 0,
            owner: b"truncates".to_vec(),
        },
        openhow: Openflag4::Create(Createhow4::Unchecked(Fattr4 {
            mask: Bitmap4::of(&[attr::SIZE]),
            vals: vals.into_inner(),
        })),
        claim: OpenClaim4::Null(Component4::new("f")),
    });
    let ops = [
        sequence(&sid, 1, 0, false),
        (op::PUTROOTFH, vec![]),
        (op::OPEN, open),
        (op::GETFH, vec![]),
        getattr_size(),
    ];
    let (sizes, results) = sizes_in(&pc(&srv, &root(), &compound(1, &ops)).unwrap());
    assert!(results.iter().all(|r| r.1 == status::OK), "{results:?}");
    assert_eq!(sizes, [0]);
    assert_eq!(std::fs::metadata(dir.join("f")).unwrap().len(), 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// GETATTR right after LOOKUP answers from the status LOOKUP read, but
/// an op that may change the file in between (SETATTR here) makes it
/// read the file again: the size set is the size answered.
#[test]
fn getattr_after_lookup_answers_what_the_file_is_after_the_ops_between() {
    let (srv, dir, sid) = server_with_f("lookup-stat");
    let size = getattr_size;
    let setattr = setattr_size(100).1;
    let ops = [
        sequence(&sid, 1, 0, false),
        (op::PUTROOTFH, vec![]),
        lookup_op("f"),
        (op::GETFH, vec![]),
        size(),
        (op::SETATTR, setattr),
        size(),
        size(),
    ];
    let body = pc(&srv, &root(), &compound(1, &ops)).unwrap();
    let (sizes, results) = sizes_in(&body);
    assert!(results.iter().all(|r| r.1 == status::OK), "{results:?}");
    assert_eq!(sizes, [4, 100, 100]);
    // A file changed behind the server between two COMPOUNDs: the
    // second one's LOOKUP reads it again.
    std::fs::write(dir.join("f"), b"seven b").unwrap();
    let ops = [
        sequence(&sid, 2, 0, false),
        (op::PUTROOTFH, vec![]),
        lookup_op("f"),
        size(),
    ];
    let (sizes, _) = sizes_in(&pc(&srv, &root(), &compound(1, &ops)).unwrap());
    assert_eq!(sizes, [7]);
    let _ = std::fs::remove_dir_all(dir);
}

/// LOOKUP below a file is NFS4ERR_NOTDIR, below a symbolic link
/// NFS4ERR_SYMLINK (RFC 8881 section 18.13.3), though LOOKUP no longer
/// looks at the directory before the name.
#[test]
fn lookup_below_a_file_or_a_symlink_says_which() {
    let (srv, dir) = server("lookup-notdir");
    std::fs::write(dir.join("f"), b"x").unwrap();
    std::os::unix::fs::symlink("f", dir.join("l")).unwrap();
    let sid = session(&srv);
    for (seq, (first, want)) in [("f", status::NOTDIR), ("l", status::SYMLINK)]
        .into_iter()
        .enumerate()
    {
        let (st, _) = run_from(
            &srv,
            &sid,
            seq as u32 + 1,
            None,
            &[(op::PUTROOTFH, vec![]), lookup_op(first), lookup_op("x")],
        );
        assert_eq!(st, want, "LOOKUP below {first}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A name looked up again gives the handle the kernel would give, from
/// the handle cache; a name a local process has put another file under
/// gives the new file's handle, not the cached one's.
#[test]
fn a_name_looked_up_again_gives_the_handle_of_what_it_names_now() {
    let (srv, dir) = server("lookup-again");
    std::fs::write(dir.join("f"), b"old").unwrap();
    std::fs::write(dir.join("g"), b"new").unwrap();
    let sid = session(&srv);
    let ex = &srv.exports.list()[0].fs;
    let kernel = |name: &std::ffi::CStr| {
        ex.handle_in(std::os::fd::AsFd::as_fd(&*ex.root_fd()), name)
            .unwrap()
    };
    let mut seq = 0;
    let mut looked_up = |name: &str| {
        seq += 1;
        let ops = [
            sequence(&sid, seq, 0, false),
            (op::PUTROOTFH, vec![]),
            lookup_op(name),
            (op::GETFH, vec![]),
        ];
        let (st, results, _, fh) = split_results(&pc(&srv, &root(), &compound(1, &ops)).unwrap());
        assert_eq!(st, status::OK, "{results:?}");
        fh.unwrap()
    };
    let old = kernel(c"f");
    assert_eq!(looked_up("f"), old);
    let cached = ex.cached();
    assert_eq!(looked_up("f"), old);
    assert_eq!(
        ex.cached(),
        cached,
        "the second LOOKUP cached a descriptor again"
    );
    // The cached descriptor holds the old inode: the renamed-over file's
    // number cannot be the new file's.
    let new = kernel(c"g");
    std::fs::rename(dir.join("g"), dir.join("f")).unwrap();
    assert_ne!(new, old);
    assert_eq!(looked_up("f"), new);
    assert_eq!(looked_up("f"), new);
    let _ = std::fs::remove_dir_all(dir);
}

/// The handle of `name` in the root of the server's first export.
fn handle_in_root(srv: &Server, name: &std::ffi::CStr) -> Vec<u8> {
    let ex = &srv.exports.list()[0].fs;
    ex.handle_in(std::os::fd::AsFd::as_fd(&*ex.root_fd()), name)
        .unwrap()
}

/// Runs each list of ops given as a COMPOUND after SEQUENCE (session
/// `sid`, slot 0, the next sequence id each time) and gives its reply.
fn in_session<'a>(
    srv: &'a Server,
    sid: &'a [u8; 16],
) -> impl FnMut(Vec<(u32, Vec<u8>)>) -> Vec<u8> + 'a {
    let mut seq = 0;
    move |ops| {
        seq += 1;
        let mut all = vec![sequence(sid, seq, 0, false)];
        all.extend(ops);
        pc(srv, &root(), &compound(1, &all)).unwrap()
    }
}

/// PUTFH followed by GETATTR reads the file's whole status once, when it
/// checks the handle, and GETATTR answers from it: what the file is now,
/// after any op between, and NFS4ERR_STALE once a local process has
/// removed it.
#[test]
fn putfh_then_getattr_answers_the_file_as_it_is() {
    let (srv, dir, sid) = server_with_f("putfh-stat");
    let wire = handle_in_root(&srv, c"f");
    let size = getattr_size;
    let putfh = || (op::PUTFH, args(&NfsFh4(wire.clone())));
    let setattr = setattr_size(9).1;
    let mut call = in_session(&srv, &sid);
    let mut run = |ops| sizes_in(&call(ops));
    // Twice: the first opens the handle, the second finds it cached.
    for _ in 0..2 {
        let (sizes, results) = run(vec![putfh(), size()]);
        assert!(results.iter().all(|r| r.1 == status::OK), "{results:?}");
        assert_eq!(sizes, [4]);
    }
    std::fs::write(dir.join("f"), b"seven b").unwrap();
    assert_eq!(run(vec![putfh(), size()]).0, [7]);
    let (sizes, results) = run(vec![
        putfh(),
        size(),
        (op::SETATTR, setattr),
        putfh(),
        size(),
    ]);
    assert!(results.iter().all(|r| r.1 == status::OK), "{results:?}");
    assert_eq!(sizes, [7, 9]);
    std::fs::remove_file(dir.join("f")).unwrap();
    let (_, results) = run(vec![putfh(), size()]);
    assert_eq!(results.last(), Some(&(op::PUTFH, status::STALE)));
    let _ = std::fs::remove_dir_all(dir);
}

/// READ right after PUTFH (which then reads the file's whole status for
/// it) answers the data and eof of the file as it is: after local
/// changes between COMPOUNDs, and after a SETATTR that cut it short in
/// the same COMPOUND. eof is true exactly when the READ reaches the end.
#[test]
fn read_after_putfh_answers_data_and_eof_of_the_file_as_it_is() {
    let (srv, dir, sid) = server_with_f("read-eof");
    let wire = handle_in_root(&srv, c"f");
    let putfh = || (op::PUTFH, args(&NfsFh4(wire.clone())));
    let mut call = in_session(&srv, &sid);
    let mut run = |ops| {
        let body = call(ops);
        let mut reads = Vec::new();
        let (_, results) = each_result(&body, |o, d| match o {
            op::READ => {
                let eof = d.bool().unwrap();
                reads.push((d.opaque(1 << 20).unwrap().to_vec(), eof));
            }
            op::SETATTR => {
                Bitmap4::decode(d).unwrap();
            }
            _ => {}
        });
        assert!(results.iter().all(|r| r.1 == status::OK), "{results:?}");
        reads
    };
    let content: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("f"), &content).unwrap();
    let read = |offset: u64, count: u32| vec![putfh(), read_op(offset, count)];
    // Twice: the first opens the handle, the second finds it cached.
    for _ in 0..2 {
        assert_eq!(run(read(0, 4096)), [(content[..4096].to_vec(), false)]);
    }
    assert_eq!(run(read(4096, 4096)), [(content[4096..].to_vec(), true)]);
    assert_eq!(run(read(0, 8192)), [(content.clone(), true)]);
    assert_eq!(run(read(4096, 8192)), [(content[4096..].to_vec(), true)]);
    assert_eq!(run(read(8192, 10)), [(Vec::new(), true)]);
    // Grown locally: the same READ is no longer at the end.
    let mut longer = content.clone();
    longer.extend_from_slice(&content[..4096]);
    std::fs::write(dir.join("f"), &longer).unwrap();
    assert_eq!(
        run(read(4096, 4096)),
        [(longer[4096..8192].to_vec(), false)]
    );
    // Cut short locally: a READ that asked past the new end.
    std::fs::write(dir.join("f"), &content[..6000]).unwrap();
    assert_eq!(
        run(read(4096, 4096)),
        [(content[4096..6000].to_vec(), true)]
    );
    // Cut short by SETATTR after PUTFH read the status, in one COMPOUND.
    std::fs::write(dir.join("f"), &content).unwrap();
    let mut ops = vec![putfh(), setattr_size(5000)];
    ops.extend(read(4096, 4096));
    assert_eq!(run(ops), [(content[4096..5000].to_vec(), true)]);
    let _ = std::fs::remove_dir_all(dir);
}

/// WRITE right after PUTFH takes the file's type and number from PUTFH's
/// check of the handle: it writes a file, refuses a directory and a
/// symbolic link, and a handle of a file removed since is stale.
#[test]
fn write_after_putfh_writes_files_only_and_stale_handles_fail() {
    use crate::nfs4::msg::WriteArgs;
    let (srv, dir, sid) = server_with_f("write-putfh");
    std::fs::create_dir(dir.join("d")).unwrap();
    std::os::unix::fs::symlink("f", dir.join("l")).unwrap();
    let handle = |name: &std::ffi::CStr| handle_in_root(&srv, name);
    let write = |wire: &[u8], offset: u64| {
        let mut e = Encoder::new();
        WriteArgs {
            stateid: Stateid4::ANONYMOUS,
            offset,
            stable: 0,
            data: b"new",
        }
        .encode(&mut e);
        vec![
            (op::PUTFH, args(&NfsFh4(wire.to_vec()))),
            (op::WRITE, e.into_inner()),
        ]
    };
    let mut call = in_session(&srv, &sid);
    let mut run = |ops| {
        each_result(&call(ops), |_, _| {})
            .1
            .last()
            .copied()
            .unwrap()
    };
    let f = handle(c"f");
    // Twice: the first opens the handle, the second finds it cached.
    assert_eq!(run(write(&f, 4)), (op::WRITE, status::OK));
    assert_eq!(run(write(&f, 7)), (op::WRITE, status::OK));
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"fournewnew");
    assert_eq!(run(write(&handle(c"d"), 0)), (op::WRITE, status::ISDIR));
    assert_eq!(run(write(&handle(c"l"), 0)), (op::WRITE, status::SYMLINK));
    std::fs::remove_file(dir.join("f")).unwrap();
    assert_eq!(run(write(&f, 0)), (op::PUTFH, status::STALE));
    let _ = std::fs::remove_dir_all(dir);
}

/// Large WRITEs of one file through the page cache copy one at a time,
/// asleep while another holds the file's turn; small WRITEs of the file
/// do not wait for it (other files' turns: `engine::turns`'s tests).
#[test]
fn large_writes_of_a_file_take_turns_and_small_ones_do_not_wait() {
    use crate::nfs4::msg::WriteArgs;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::Ordering::SeqCst;
    let (srv, dir, sid) = server_with_f("write-turns");
    let other_sid = session(&srv);
    let meta = std::fs::metadata(dir.join("f")).unwrap();
    let key = (meta.dev(), meta.ino());
    let f = handle_in_root(&srv, c"f");
    let write = |offset: u64, data: &[u8]| {
        let mut e = Encoder::new();
        WriteArgs {
            stateid: Stateid4::ANONYMOUS,
            offset,
            stable: 0,
            data,
        }
        .encode(&mut e);
        vec![
            (op::PUTFH, args(&NfsFh4(f.clone()))),
            (op::WRITE, e.into_inner()),
        ]
    };
    let last = |reply: &[u8]| *each_result(reply, |_, _| {}).1.last().unwrap();
    let large = vec![0x4c_u8; super::ops_file::WRITE_TURN_MIN];
    let done = std::sync::atomic::AtomicBool::new(false);
    let (held, waited) = srv.write_turns.take(key);
    assert!(!waited);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let r = last(&in_session(&srv, &sid)(write(4096, &large)));
            done.store(true, SeqCst);
            r
        });
        // Until the large WRITE sleeps on the file's turn, unless it got
        // past it.
        while srv.write_turns.waiting(key) < 1 && !done.load(SeqCst) {
            std::thread::yield_now();
        }
        assert!(!done.load(SeqCst), "a large WRITE went past a held turn");
        // A small WRITE of the same file does not take turns.
        let small = last(&in_session(&srv, &other_sid)(write(0, b"tiny")));
        assert_eq!(small, (op::WRITE, status::OK));
        assert!(!done.load(SeqCst));
        drop(held);
        assert_eq!(writer.join().unwrap(), (op::WRITE, status::OK));
    });
    assert_eq!(srv.metrics.write_turns_waited.load(SeqCst), 1);
    assert_eq!(srv.write_turns.files(), 0);
    let data = std::fs::read(dir.join("f")).unwrap();
    assert_eq!(&data[..4], b"tiny");
    assert_eq!(data.len(), 4096 + large.len());
    assert!(data[4096..].iter().all(|&b| b == 0x4c));
    let _ = std::fs::remove_dir_all(dir);
}

/// READDIR of the export's root with `maxcount` and a cookie, asking for
/// the handle and fileid: the status, and (name, cookie) of each entry
/// with eof when OK. Nothing may follow the result.
fn readdir_sized(
    srv: &Server,
    sid: &[u8; 16],
    seq: u32,
    cookie: u64,
    maxcount: u32,
) -> (Nfsstat4, Vec<(String, u64)>, bool) {
    let a = args(&ReaddirArgs {
        cookie,
        verifier: [0; 8],
        dircount: 0,
        maxcount,
        attr_request: Bitmap4::of(&[attr::FILEHANDLE, attr::FILEID]),
    });
    let ops = [(op::PUTROOTFH, vec![]), (op::READDIR, a)];
    let (_, rest) = run_from(srv, sid, seq, None, &ops);
    let mut d = Decoder::new(&rest);
    skip_results(&mut d, 1); // PUTROOTFH
    let (opnum, st) = next_result(&mut d);
    assert_eq!(opnum, op::READDIR);
    let mut names = Vec::new();
    let mut eof = false;
    if st == status::OK {
        d.array::<8>().unwrap();
        while d.bool().unwrap() {
            let next = d.u64().unwrap();
            names.push((
                String::from_utf8(d.opaque(255).unwrap().to_vec()).unwrap(),
                next,
            ));
            d.bitmap(8).unwrap();
            let mut v = Decoder::new(d.opaque(4096).unwrap());
            v.opaque(128).unwrap();
            v.u64().unwrap();
            assert_eq!(v.remaining(), 0);
        }
        eof = d.bool().unwrap();
    }
    assert_eq!(d.remaining(), 0, "bytes after READDIR's result ({st})");
    (st, names, eof)
}

#[test]
fn readdir_fills_the_reply_up_to_maxcount_and_too_small_leaves_nothing_behind() {
    // A listing cut short by maxcount keeps the entries that fit, and
    // one with room for none is NFS4ERR_TOOSMALL with nothing of it left
    // in the reply.
    let (srv, dir) = server("readdir-sizes");
    for i in 0..30 {
        std::fs::write(dir.join(format!("entry-{i:02}")), b"x").unwrap();
    }
    let sid = session(&srv);
    let (st, names, _) = readdir_sized(&srv, &sid, 1, 0, 40);
    assert_eq!((st, names.len()), (status::TOOSMALL, 0));
    // Pages of about 4 entries each, each continuing at the last cookie,
    // list every name once.
    let (mut cookie, mut seen, mut seq, mut pages) = (0, Vec::new(), 2, 0);
    loop {
        let (st, names, eof) = readdir_sized(&srv, &sid, seq, cookie, 400);
        assert_eq!(st, status::OK);
        assert!(
            !names.is_empty() && names.len() < 30,
            "{} entries",
            names.len()
        );
        cookie = names.last().unwrap().1;
        seen.extend(names.into_iter().map(|(n, _)| n));
        seq += 1;
        pages += 1;
        if eof {
            break;
        }
    }
    seen.sort();
    let want: Vec<String> = (0..30).map(|i| format!("entry-{i:02}")).collect();
    assert_eq!(seen, want);
    assert!(pages >= 5, "{pages} pages");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_failed_flush_changes_the_write_verifier_and_a_refused_write_does_not() {
    use super::Storing::{Flush, Write};
    use std::io::Error;
    let (srv, dir) = server("verifier");
    let changes = || {
        srv.metrics
            .write_verifier_changes
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let file = (1, 2);
    let mut seen = vec![srv.write_verifier()];
    // Data that was to be written back may be lost: a new verifier.
    for (what, errno) in [
        (Flush, libc::EIO),
        (Flush, libc::ENOSPC),
        (Flush, libc::EDQUOT),
        (Flush, libc::EROFS),
        (Write, libc::EIO),
        (Write, libc::EROFS),
    ] {
        srv.storage_failed(file, what, &Error::from_raw_os_error(errno));
        let now = srv.write_verifier();
        assert!(
            !seen.contains(&now),
            "{what:?} failing with errno {errno}: the verifier did not change"
        );
        seen.push(now);
    }
    assert_eq!(changes(), 6);
    // Nothing written before is lost: the same verifier.
    for (what, errno) in [
        (Flush, libc::EINTR),
        (Flush, libc::EAGAIN),
        (Flush, libc::ESTALE),
        (Flush, libc::EINVAL),
        (Write, libc::ENOSPC),
        (Write, libc::EDQUOT),
        (Write, libc::EFBIG),
        (Write, libc::EAGAIN),
    ] {
        srv.storage_failed(file, what, &Error::from_raw_os_error(errno));
        assert_eq!(
            srv.write_verifier(),
            *seen.last().unwrap(),
            "{what:?} failing with errno {errno} changed the verifier"
        );
    }
    assert_eq!(changes(), 6);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_commit_beside_a_failing_flush_answers_the_verifier_the_failure_made() {
    // The kernel tells of a failed writeback only the first flush of a
    // description to ask; another flush of it succeeds meanwhile. That
    // one (a COMMIT) must answer the verifier only once the failing flush
    // has changed it.
    let (srv, dir) = server("flush-beside");
    let file = (7, 8);
    let before = srv.write_verifier();
    let (started, flush_started) = std::sync::mpsc::channel::<()>();
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let flushed = std::sync::atomic::AtomicBool::new(false);
    let answered = std::thread::scope(|s| {
        let srv_r = &srv;
        let failing = s.spawn(move || {
            srv_r.flush_with(file, || {
                started.send(()).unwrap();
                hold.recv().unwrap();
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            })
        });
        flush_started.recv().unwrap();
        let commit = s.spawn(|| {
            srv.flush_then_verifier_with(file, || {
                flushed.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
        });
        // Once the COMMIT's own flush has ended, it waits for the failing
        // one.
        let t = std::time::Instant::now();
        while !flushed.load(std::sync::atomic::Ordering::SeqCst)
            || srv.flushes().get(&file).is_some_and(|ids| ids.len() > 1)
        {
            assert!(t.elapsed().as_secs() < 30, "the COMMIT's flush did not end");
            std::thread::yield_now();
        }
        assert!(
            !commit.is_finished(),
            "the COMMIT answered beside a flush still running"
        );
        release.send(()).unwrap();
        assert!(failing.join().unwrap().is_err());
        commit.join().unwrap().unwrap()
    });
    assert_ne!(
        answered, before,
        "the COMMIT answered the verifier from before the failure"
    );
    assert_eq!(answered, srv.write_verifier());
    assert!(srv.flushes().is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

/// The change attribute of the directory at `p`, as sluice answers it.
fn change_of(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.ctime() as u64) * 1_000_000_000 + m.ctime_nsec() as u64
}

/// REMOVE and RENAME after PUTFH (whose check reads the directory's
/// whole status for them) answer the directory's change before and
/// after; a RENAME within one directory answers the same for source and
/// target, one across two answers each its own. A file that loses its
/// last name has its cached descriptor let go at once (found by its
/// inode), so its blocks are freed; a renamed file keeps its, also when
/// renamed onto another of its names (which changes nothing).
#[test]
fn remove_and_rename_answer_each_directorys_change_and_let_go_of_what_they_drop() {
    use crate::nfs4::msg::{ChangeInfo4, RenameResOk};
    let (srv, dir, sid) = server_with_f("rm-mv-cinfo");
    let d = dir.join("d");
    std::fs::create_dir(&d).unwrap();
    for n in ["a", "b", "c"] {
        std::fs::write(d.join(n), n).unwrap();
    }
    let ex = &srv.exports.list()[0].fs;
    let dwire = handle_in_root(&srv, c"d");
    let putfh = |w: &[u8]| (op::PUTFH, args(&NfsFh4(w.to_vec())));
    let mut call = in_session(&srv, &sid);
    // Each file's handle, opened (and cached) by PUTFH; its status.
    let mut cache = |name: &str| {
        let path = format!("d/{name}");
        let w = handle_in_root(&srv, &std::ffi::CString::new(path).unwrap());
        let (_, results) = sizes_in(&call(vec![putfh(&w), getattr_size()]));
        assert!(results.iter().all(|r| r.1 == status::OK), "{results:?}");
        let st = crate::engine::fs::stat_at(
            std::os::fd::AsFd::as_fd(&*ex.root_fd()),
            &std::ffi::CString::new(format!("d/{name}")).unwrap(),
        )
        .unwrap();
        assert!(ex.cached_handle(&st).is_some(), "{name} cached");
        st
    };
    let (sa, sb, sc) = (cache("a"), cache("b"), cache("c"));
    // A mapping that a stream of each made and let go of, kept idle for
    // the file's next stream: it must go with the file's last name,
    // which it would keep from freeing its blocks.
    let ra = &srv.read.readahead;
    let idle = |name: &str, st: &crate::engine::fs::Stat| {
        let fd = std::sync::Arc::new(std::os::fd::OwnedFd::from(
            std::fs::File::open(d.join(name)).unwrap(),
        ));
        let file = (st.dev, st.ino);
        ra.access(file, 1, &fd, 0, 1, 1);
        let m = ra
            .mapping(file, 1, std::os::fd::AsFd::as_fd(&*fd), 1, 1)
            .unwrap();
        ra.forget_stream(file, 1);
        assert_eq!(std::sync::Arc::strong_count(&m), 2, "{name}'s kept idle");
        m
    };
    let (ma, mb, mc) = (idle("a", &sa), idle("b", &sb), idle("c", &sc));
    let mut run = |ops| {
        let mut cinfos = Vec::new();
        let (_, results) = each_result(&call(ops), |o, dec| match o {
            op::REMOVE => cinfos.push(ChangeInfo4::decode(dec).unwrap()),
            op::RENAME => {
                let r = RenameResOk::decode(dec).unwrap();
                cinfos.push(r.source_cinfo);
                cinfos.push(r.target_cinfo);
            }
            _ => {}
        });
        assert!(results.iter().all(|r| r.1 == status::OK), "{results:?}");
        cinfos
    };
    let rename = |from: &str, to: &str| {
        args(&RenameArgs {
            oldname: Component4::new(from),
            newname: Component4::new(to),
        })
    };
    let changed = |before: u64, after: u64, c: &ChangeInfo4| {
        assert_eq!((c.before, c.after), (before, after));
        assert_ne!(c.before, c.after);
    };

    let before = change_of(&d);
    let c = run(vec![
        putfh(&dwire),
        (op::REMOVE, args(&Component4::new("a"))),
    ]);
    changed(before, change_of(&d), &c[0]);
    assert!(!d.join("a").exists());
    assert!(
        ex.cached_handle(&sa).is_none(),
        "a removed file's descriptor"
    );
    assert_eq!(
        std::sync::Arc::strong_count(&ma),
        1,
        "a removed file's mapping"
    );

    let before = change_of(&d);
    let c = run(vec![
        putfh(&dwire),
        (op::SAVEFH, vec![]),
        putfh(&dwire),
        (op::RENAME, rename("b", "c")),
    ]);
    changed(before, change_of(&d), &c[0]);
    assert_eq!(c[0], c[1], "one directory: source and target alike");
    assert_eq!(std::fs::read(d.join("c")).unwrap(), b"b");
    assert!(
        ex.cached_handle(&sc).is_none(),
        "a renamed-over file's descriptor"
    );
    assert_eq!(
        std::sync::Arc::strong_count(&mc),
        1,
        "a renamed-over file's mapping"
    );
    assert_eq!(
        std::sync::Arc::strong_count(&mb),
        2,
        "the renamed file's mapping"
    );
    assert!(
        ex.cached_handle(&sb).is_some(),
        "the renamed file's descriptor"
    );

    let (dbefore, rbefore) = (change_of(&d), change_of(&dir));
    let c = run(vec![
        putfh(&dwire),
        (op::SAVEFH, vec![]),
        (op::PUTROOTFH, vec![]),
        (op::RENAME, rename("c", "moved")),
    ]);
    changed(dbefore, change_of(&d), &c[0]);
    changed(rbefore, change_of(&dir), &c[1]);
    assert_eq!(std::fs::read(dir.join("moved")).unwrap(), b"b");
    assert!(
        ex.cached_handle(&sb).is_some(),
        "the moved file's descriptor"
    );

    // A rename onto another link of the same inode changes nothing, and
    // keeps its descriptor.
    std::fs::hard_link(dir.join("moved"), dir.join("twin")).unwrap();
    run(vec![
        (op::PUTROOTFH, vec![]),
        (op::SAVEFH, vec![]),
        (op::RENAME, rename("twin", "moved")),
    ]);
    assert!(dir.join("twin").exists() && dir.join("moved").exists());
    assert!(
        ex.cached_handle(&sb).is_some(),
        "a file renamed onto itself"
    );
    let _ = std::fs::remove_dir_all(dir);
}
