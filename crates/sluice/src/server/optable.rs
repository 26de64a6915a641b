//! The op table: one row per NFSv4.1/4.2 operation with its handler, name,
//! properties and a bound on its result's size. The COMPOUND loop reads
//! the row instead of keeping lists of op numbers; adding an op is one row
//! and one handler.

use super::context::{Ctx, OpStatus, Outcome};
use super::{ops_copy, ops_file, ops_fs, ops_pseudo, ops_session, ops_sparse, ops_xattr};
use crate::nfs4::consts::{op, status};
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder};

/// An op handler: decodes its arguments from the decoder, works, writes
/// its result body (after the status the loop writes) and returns the
/// status; or, for ops that may run where waiting is not allowed and
/// find they would have to, says so.
#[derive(Clone, Copy)]
pub(super) enum Handler {
    /// An op that never has to stop for waiting.
    Plain(fn(&mut Ctx<'_>, &mut Decoder<'_>, &mut Encoder) -> OpStatus),
    /// An op that may answer [`Outcome::WouldBlock`].
    MayBlock(fn(&mut Ctx<'_>, &mut Decoder<'_>, &mut Encoder) -> Outcome),
}

/// An op handler for a pseudo directory (its index in the pseudo file
/// system is the second argument).
pub(super) type PseudoHandler = fn(&mut Ctx<'_>, usize, &mut Decoder<'_>, &mut Encoder) -> OpStatus;

/// What an op does on a pseudo directory of the namespace joining the
/// exports.
#[derive(Clone, Copy)]
pub(super) enum OnPseudo {
    /// The ordinary handler, which reads pseudo directories' attributes.
    Same,
    /// A handler of its own.
    Run(PseudoHandler),
    /// Always this status (a pseudo directory is read-only, and not a
    /// file).
    Fail(Nfsstat4),
}

/// Properties of an op (bits of [`OpDesc::flags`]).
pub(super) mod flags {
    /// Changes the file system: refused on read-only exports.
    pub(crate) const CHANGES_FS: u16 = 1 << 0;
    /// Sets, saves, restores or returns the current filehandle without
    /// touching the object behind it.
    pub(crate) const MOVES_FH: u16 = 1 << 1;
    /// Does not act on the current object at all (client, session and
    /// stateid ops).
    pub(crate) const NO_OBJECT: u16 = 1 << 2;
    /// May be the only op of a COMPOUND without SEQUENCE.
    pub(crate) const SESSIONLESS: u16 = 1 << 3;
    /// May run on the connection's task: touches only memory, or only
    /// tries (see `compound::try_compound`).
    pub(crate) const NO_WAIT: u16 = 1 << 4;
    /// Sets a new current filehandle and no stateid: resets the current
    /// stateid (RFC 8881 section 16.2.3.1.2).
    pub(crate) const CLEARS_STATEID: u16 = 1 << 5;
    /// Changes server or file system state: its result must fit the
    /// session's reply limits before it runs, or it is not run.
    pub(crate) const MODIFIES: u16 = 1 << 6;
    /// An NFSv4.0 op that NFSv4.1 does not allow (RFC 8881 section 18).
    pub(crate) const V40_ONLY: u16 = 1 << 7;
    /// Renames or links between the saved and the current filehandle:
    /// both must be in one export.
    pub(crate) const TWO_OBJECTS: u16 = 1 << 8;
    /// An NFSv4.2 op that an NFSv4.1 COMPOUND may not carry
    /// (NFS4ERR_OP_ILLEGAL, as from the Linux server): the extended
    /// attribute ops (RFC 8276) and the copy ops. The NFSv4.2 ops sluice
    /// had before those (SEEK, READ_PLUS, ALLOCATE, DEALLOCATE, CLONE)
    /// stay allowed in 4.1 for the clients that use them there.
    pub(crate) const V42_ONLY: u16 = 1 << 9;
    /// Works alike whatever the thread's file system identity: touches
    /// no object as the caller, or takes the caller's identity itself
    /// for the one step that does (READ with a special stateid opens the
    /// file as the caller). The COMPOUND loop does not switch to the
    /// caller for it; ops that move filehandles and ops on no object need
    /// no switch either. Each switch costs the kernel a new credential.
    pub(crate) const ANY_IDENTITY: u16 = 1 << 10;
    /// Changes or reads directories and inodes, which the kernel does from
    /// its caches in microseconds when the file system is well: may run on
    /// the connection's task when the server lets it (see
    /// `compound::quick_args` for the arguments that keep an op off it,
    /// and `server::inline` for when). Never an op that writes data to
    /// storage, waits for a client, or holds locks for long.
    pub(crate) const QUICK: u16 = 1 << 11;
}

/// One row of the op table.
#[derive(Clone, Copy)]
pub(super) struct OpDesc {
    /// The op's name in RFC 8881 and RFC 7862.
    pub name: &'static str,
    /// The handler; None for ops that are defined but not implemented
    /// (NFS4ERR_NOTSUPP).
    pub run: Option<Handler>,
    /// What it does on a pseudo directory.
    pub pseudo: OnPseudo,
    /// Bits of [`flags`].
    pub flags: u16,
    /// Most bytes its result can take after the opnum and status.
    pub reply_bound: u32,
}

impl OpDesc {
    /// True when the op has property `flag`.
    pub(super) fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// True when the op acts on the object behind the current filehandle.
    pub(super) fn uses_cur_object(&self) -> bool {
        !self.has(flags::MOVES_FH | flags::NO_OBJECT)
    }

    /// True when the op must run with the caller's file system identity
    /// (see [`flags::ANY_IDENTITY`]).
    pub(super) fn runs_as_caller(&self) -> bool {
        !self.has(flags::MOVES_FH | flags::NO_OBJECT | flags::ANY_IDENTITY)
    }

    /// True when the op may run with the identity a thread kept from its
    /// last caller, when that is this COMPOUND's caller (see
    /// `cred::lending`): ops that run as the caller, and those that run
    /// as they are and touch no stored state (they only move file
    /// handles, read attributes or data through a descriptor, or close).
    /// Not the ops on clients, sessions and stateids, which may write
    /// the state directory: those run as the server.
    pub(super) fn may_run_lent(&self) -> bool {
        self.runs_as_caller()
            || (self.has(flags::MOVES_FH | flags::ANY_IDENTITY) && !self.has(flags::NO_OBJECT))
    }
}

use flags::*;

/// Largest owner or opaque a result can echo (NFS4_OPAQUE_LIMIT).
const OPAQUE: u32 = 1024;
/// A stateid.
const SID: u32 = 16;
/// change_info4.
const CINFO: u32 = 20;
/// A bitmap of up to three words.
const BITMAP: u32 = 16;

const fn row(
    name: &'static str,
    run: fn(&mut Ctx<'_>, &mut Decoder<'_>, &mut Encoder) -> OpStatus,
    pseudo: OnPseudo,
    flags: u16,
    reply_bound: u32,
) -> OpDesc {
    OpDesc {
        name,
        run: Some(Handler::Plain(run)),
        pseudo,
        flags,
        reply_bound,
    }
}

const fn unsupported(name: &'static str, flags: u16) -> OpDesc {
    OpDesc {
        name,
        run: None,
        pseudo: OnPseudo::Fail(status::NOTSUPP),
        flags,
        reply_bound: 0,
    }
}

const UNDEFINED: OpDesc = OpDesc {
    name: "ILLEGAL",
    run: None,
    pseudo: OnPseudo::Fail(status::OP_ILLEGAL),
    flags: NO_OBJECT,
    reply_bound: 0,
};

/// For ops whose result on a pseudo directory is fixed.
const ISDIR: OnPseudo = OnPseudo::Fail(status::ISDIR);
const ROFS: OnPseudo = OnPseudo::Fail(status::ROFS);
const BAD_SID: OnPseudo = OnPseudo::Fail(status::BAD_STATEID);
const SAME: OnPseudo = OnPseudo::Same;

/// The table, indexed by op number (0 to 2 are not ops).
static OPS: [OpDesc; op::LAST_KNOWN as usize + 1] = [
    UNDEFINED,
    UNDEFINED,
    UNDEFINED,
    row("ACCESS", ops_fs::access, SAME, NO_WAIT, 8),
    // Only the state table and the readahead engine: on the connection's
    // task. (The kernel's release of the last descriptor of a file does
    // not wait for its data.)
    row(
        "CLOSE",
        ops_file::close,
        BAD_SID,
        MODIFIES | NO_WAIT | ANY_IDENTITY,
        SID,
    ),
    row("COMMIT", ops_file::commit, ISDIR, MODIFIES, 8),
    row(
        "CREATE",
        ops_fs::create,
        ROFS,
        CHANGES_FS | MODIFIES | CLEARS_STATEID | QUICK,
        CINFO + BITMAP,
    ),
    unsupported("DELEGPURGE", NO_OBJECT),
    row("DELEGRETURN", ops_file::delegreturn, BAD_SID, MODIFIES, 0),
    OpDesc {
        name: "GETATTR",
        run: Some(Handler::MayBlock(ops_fs::getattr)),
        pseudo: SAME,
        flags: NO_WAIT | ANY_IDENTITY,
        reply_bound: 0,
    },
    row("GETFH", ops_fs::getfh, SAME, MOVES_FH | NO_WAIT, 4 + 128),
    row(
        "LINK",
        ops_fs::link,
        ROFS,
        CHANGES_FS | MODIFIES | TWO_OBJECTS | QUICK,
        CINFO,
    ),
    row(
        "LOCK",
        ops_file::lock,
        ISDIR,
        MODIFIES,
        8 + 8 + 4 + 8 + 4 + OPAQUE,
    ),
    row(
        "LOCKT",
        ops_file::lockt,
        ISDIR,
        0,
        8 + 8 + 4 + 8 + 4 + OPAQUE,
    ),
    row("LOCKU", ops_file::locku, BAD_SID, MODIFIES, SID),
    OpDesc {
        name: "LOOKUP",
        run: Some(Handler::MayBlock(ops_fs::lookup)),
        pseudo: OnPseudo::Run(ops_pseudo::lookup),
        flags: CLEARS_STATEID | NO_WAIT,
        reply_bound: 0,
    },
    row(
        "LOOKUPP",
        ops_fs::lookupp,
        OnPseudo::Run(ops_pseudo::lookupp),
        CLEARS_STATEID | QUICK,
        0,
    ),
    row("NVERIFY", ops_fs::nverify, SAME, 0, 0),
    row(
        "OPEN",
        ops_file::open,
        ROFS,
        MODIFIES | QUICK,
        SID + CINFO + 4 + BITMAP + 4,
    ),
    unsupported("OPENATTR", 0),
    unsupported("OPEN_CONFIRM", V40_ONLY),
    row(
        "OPEN_DOWNGRADE",
        ops_file::open_downgrade,
        BAD_SID,
        MODIFIES,
        SID,
    ),
    row(
        "PUTFH",
        ops_fs::putfh,
        SAME,
        MOVES_FH | NO_WAIT | CLEARS_STATEID,
        0,
    ),
    row(
        "PUTPUBFH",
        ops_fs::putrootfh,
        SAME,
        MOVES_FH | NO_WAIT | CLEARS_STATEID,
        0,
    ),
    row(
        "PUTROOTFH",
        ops_fs::putrootfh,
        SAME,
        MOVES_FH | NO_WAIT | CLEARS_STATEID,
        0,
    ),
    OpDesc {
        name: "READ",
        run: Some(Handler::MayBlock(ops_file::read)),
        pseudo: ISDIR,
        flags: NO_WAIT | ANY_IDENTITY,
        reply_bound: 0,
    },
    row(
        "READDIR",
        ops_fs::readdir,
        OnPseudo::Run(ops_pseudo::readdir),
        QUICK,
        0,
    ),
    row(
        "READLINK",
        ops_fs::readlink,
        OnPseudo::Fail(status::INVAL),
        QUICK,
        0,
    ),
    row(
        "REMOVE",
        ops_fs::remove,
        ROFS,
        CHANGES_FS | MODIFIES | QUICK,
        CINFO,
    ),
    row(
        "RENAME",
        ops_fs::rename,
        ROFS,
        CHANGES_FS | MODIFIES | TWO_OBJECTS | QUICK,
        2 * CINFO,
    ),
    unsupported("RENEW", V40_ONLY),
    row("RESTOREFH", ops_fs::restorefh, SAME, MOVES_FH | NO_WAIT, 0),
    row("SAVEFH", ops_fs::savefh, SAME, MOVES_FH | NO_WAIT, 0),
    row(
        "SECINFO",
        ops_fs::secinfo,
        OnPseudo::Run(ops_pseudo::secinfo),
        0,
        0,
    ),
    row(
        "SETATTR",
        ops_fs::setattr,
        ROFS,
        CHANGES_FS | MODIFIES | QUICK,
        BITMAP,
    ),
    unsupported("SETCLIENTID", V40_ONLY),
    unsupported("SETCLIENTID_CONFIRM", V40_ONLY),
    row("VERIFY", ops_fs::verify, SAME, 0, 0),
    row(
        "WRITE",
        ops_file::write,
        ROFS,
        CHANGES_FS | MODIFIES | QUICK,
        4 + 4 + 8,
    ),
    unsupported("RELEASE_LOCKOWNER", V40_ONLY),
    row(
        "BACKCHANNEL_CTL",
        ops_session::backchannel_ctl,
        SAME,
        NO_OBJECT | MODIFIES,
        0,
    ),
    row(
        "BIND_CONN_TO_SESSION",
        ops_session::bind_conn_to_session,
        SAME,
        NO_OBJECT | SESSIONLESS | MODIFIES,
        16 + 4 + 4,
    ),
    row(
        "EXCHANGE_ID",
        ops_session::exchange_id,
        SAME,
        NO_OBJECT | SESSIONLESS | MODIFIES,
        8 + 4 + 4 + 4 + 8 + 3 * (4 + OPAQUE) + 4 + 12,
    ),
    row(
        "CREATE_SESSION",
        ops_session::create_session,
        SAME,
        NO_OBJECT | SESSIONLESS | MODIFIES,
        16 + 4 + 4 + 2 * 32,
    ),
    row(
        "DESTROY_SESSION",
        ops_session::destroy_session,
        SAME,
        NO_OBJECT | SESSIONLESS | MODIFIES,
        0,
    ),
    row(
        "FREE_STATEID",
        ops_file::free_stateid,
        SAME,
        NO_OBJECT | MODIFIES,
        0,
    ),
    unsupported("GET_DIR_DELEGATION", 0),
    unsupported("GETDEVICEINFO", NO_OBJECT),
    unsupported("GETDEVICELIST", 0),
    unsupported("LAYOUTCOMMIT", 0),
    unsupported("LAYOUTGET", 0),
    unsupported("LAYOUTRETURN", 0),
    row(
        "SECINFO_NO_NAME",
        ops_fs::secinfo_no_name,
        OnPseudo::Run(ops_pseudo::secinfo_no_name),
        0,
        0,
    ),
    row("SEQUENCE", sequence_not_first, SAME, NO_OBJECT, 0),
    unsupported("SET_SSV", NO_OBJECT),
    row("TEST_STATEID", ops_file::test_stateid, SAME, NO_OBJECT, 0),
    unsupported("WANT_DELEGATION", 0),
    row(
        "DESTROY_CLIENTID",
        ops_session::destroy_clientid,
        SAME,
        NO_OBJECT | SESSIONLESS | MODIFIES,
        0,
    ),
    row(
        "RECLAIM_COMPLETE",
        ops_session::reclaim_complete,
        SAME,
        NO_OBJECT | MODIFIES,
        0,
    ),
    row(
        "ALLOCATE",
        ops_sparse::allocate,
        ROFS,
        CHANGES_FS | MODIFIES,
        0,
    ),
    row(
        "COPY",
        ops_copy::copy,
        ISDIR,
        CHANGES_FS | MODIFIES | TWO_OBJECTS | V42_ONLY,
        4 + SID + 8 + 4 + 8 + 8,
    ),
    unsupported("COPY_NOTIFY", 0),
    row(
        "DEALLOCATE",
        ops_sparse::deallocate,
        ROFS,
        CHANGES_FS | MODIFIES,
        0,
    ),
    unsupported("IO_ADVISE", 0),
    unsupported("LAYOUTERROR", 0),
    unsupported("LAYOUTSTATS", 0),
    row(
        "OFFLOAD_CANCEL",
        ops_copy::offload_cancel,
        SAME,
        MODIFIES | V42_ONLY,
        0,
    ),
    row(
        "OFFLOAD_STATUS",
        ops_copy::offload_status,
        SAME,
        V42_ONLY,
        8 + 4 + 4,
    ),
    OpDesc {
        name: "READ_PLUS",
        run: Some(Handler::MayBlock(ops_sparse::read_plus)),
        pseudo: ISDIR,
        flags: NO_WAIT | ANY_IDENTITY,
        reply_bound: 0,
    },
    row("SEEK", ops_sparse::seek, ISDIR, 0, 0),
    unsupported("WRITE_SAME", 0),
    row(
        "CLONE",
        ops_copy::clone,
        ISDIR,
        CHANGES_FS | MODIFIES | TWO_OBJECTS,
        0,
    ),
    row(
        "GETXATTR",
        ops_xattr::getxattr,
        OnPseudo::Fail(status::NOXATTR),
        V42_ONLY,
        4 + ops_xattr::MAX_VALUE as u32,
    ),
    row(
        "SETXATTR",
        ops_xattr::setxattr,
        ROFS,
        CHANGES_FS | MODIFIES | V42_ONLY,
        CINFO,
    ),
    row(
        "LISTXATTRS",
        ops_xattr::listxattrs,
        OnPseudo::Fail(status::NOXATTR),
        V42_ONLY,
        0,
    ),
    row(
        "REMOVEXATTR",
        ops_xattr::removexattr,
        ROFS,
        CHANGES_FS | MODIFIES | V42_ONLY,
        CINFO,
    ),
];

/// SEQUENCE anywhere but first (RFC 8881 section 18.46.3).
fn sequence_not_first(_: &mut Ctx<'_>, _: &mut Decoder<'_>, _: &mut Encoder) -> OpStatus {
    status::SEQUENCE_POS
}

/// The row of op `opnum`, or None for numbers that are not NFSv4.1/4.2
/// ops (NFS4ERR_OP_ILLEGAL).
pub(super) fn desc(opnum: u32, minor: u32) -> Option<&'static OpDesc> {
    if opnum < op::ACCESS {
        return None;
    }
    // An op a later minor version added does not exist in an earlier one
    // (RFC 8178 section 4.4.3): NFS4ERR_OP_ILLEGAL.
    OPS.get(opnum as usize)
        .filter(|d| minor >= 2 || !d.has(V42_ONLY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sit_at_their_op_numbers() {
        for (n, name) in [
            (op::ACCESS, "ACCESS"),
            (op::OPEN, "OPEN"),
            (op::PUTROOTFH, "PUTROOTFH"),
            (op::WRITE, "WRITE"),
            (op::EXCHANGE_ID, "EXCHANGE_ID"),
            (op::SEQUENCE, "SEQUENCE"),
            (op::RECLAIM_COMPLETE, "RECLAIM_COMPLETE"),
            (op::READ_PLUS, "READ_PLUS"),
            (op::SEEK, "SEEK"),
            (op::REMOVEXATTR, "REMOVEXATTR"),
        ] {
            assert_eq!(Some(name), desc(n, 2).map(|d| d.name), "op {n}");
        }
        assert!(
            desc(0, 2).is_none() && desc(2, 2).is_none() && desc(op::LAST_KNOWN + 1, 2).is_none()
        );
        assert!(desc(op::GETXATTR, 1).is_none() && desc(op::SEEK, 1).is_some());
    }

    #[test]
    fn every_op_that_changes_things_has_a_reply_bound_check() {
        for (n, d) in OPS.iter().enumerate() {
            if d.has(CHANGES_FS) {
                assert!(d.has(MODIFIES), "{} ({n}) changes the file system", d.name);
            }
            if d.has(SESSIONLESS) {
                assert!(d.has(NO_OBJECT), "{} ({n})", d.name);
            }
        }
    }
}
