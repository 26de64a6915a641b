//! Messages of the ops on open files and their state (RFC 8881 sections
//! 18.2 to 18.18, 18.3, 18.48, 18.38; RFC 7862 15.1, 15.4, 15.11): OPEN
//! and its delegations, OPEN_DOWNGRADE, LOCK, LOCKT, LOCKU, COMMIT,
//! TEST_STATEID, SEEK, ALLOCATE and DEALLOCATE.

use super::common::{
    array, put_array, xdr_struct, Bitmap4, ChangeInfo4, Component4, Fattr4, Nfsace4, StateOwner4,
};
use super::{Stateid4, Xdr};
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder, XdrError, XdrResult};

/// OPEN4_SHARE_ACCESS_READ.
pub const SHARE_ACCESS_READ: u32 = 1;
/// OPEN4_SHARE_ACCESS_WRITE.
pub const SHARE_ACCESS_WRITE: u32 = 2;
/// OPEN4_SHARE_ACCESS_BOTH.
pub const SHARE_ACCESS_BOTH: u32 = 3;
/// The bits of share_access that say which delegation is wanted.
pub const SHARE_WANT_MASK: u32 = 0xff00;
/// OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE.
pub const SHARE_WANT_NO_PREFERENCE: u32 = 0x0000;
/// OPEN4_SHARE_ACCESS_WANT_READ_DELEG.
pub const SHARE_WANT_READ_DELEG: u32 = 0x0100;
/// OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG.
pub const SHARE_WANT_WRITE_DELEG: u32 = 0x0200;
/// OPEN4_SHARE_ACCESS_WANT_ANY_DELEG.
pub const SHARE_WANT_ANY_DELEG: u32 = 0x0300;
/// OPEN4_SHARE_ACCESS_WANT_NO_DELEG.
pub const SHARE_WANT_NO_DELEG: u32 = 0x0400;
/// OPEN4_SHARE_ACCESS_WANT_CANCEL.
pub const SHARE_WANT_CANCEL: u32 = 0x0500;
/// OPEN4_RESULT_LOCKTYPE_POSIX.
pub const OPEN_RESULT_LOCKTYPE_POSIX: u32 = 4;
/// OPEN4_RESULT_PRESERVE_UNLINKED.
pub const OPEN_RESULT_PRESERVE_UNLINKED: u32 = 8;

/// createhow4: how OPEN creates a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Createhow4 {
    /// UNCHECKED4: create, or open what is there.
    Unchecked(Fattr4),
    /// GUARDED4: create; EXIST if something is there.
    Guarded(Fattr4),
    /// EXCLUSIVE4: create once, recognised again by the verifier.
    Exclusive([u8; 8]),
    /// EXCLUSIVE4_1: as EXCLUSIVE4, with attributes.
    Exclusive41 {
        /// Identifies the create.
        verifier: [u8; 8],
        /// Attributes to set.
        attrs: Fattr4,
    },
}

impl Xdr for Createhow4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Createhow4::Unchecked(a) => {
                e.u32(0);
                a.encode(e);
            }
            Createhow4::Guarded(a) => {
                e.u32(1);
                a.encode(e);
            }
            Createhow4::Exclusive(v) => {
                e.u32(2);
                v.encode(e);
            }
            Createhow4::Exclusive41 { verifier, attrs } => {
                e.u32(3);
                verifier.encode(e);
                attrs.encode(e);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            0 => Createhow4::Unchecked(Fattr4::decode(d)?),
            1 => Createhow4::Guarded(Fattr4::decode(d)?),
            2 => Createhow4::Exclusive(d.array()?),
            3 => Createhow4::Exclusive41 {
                verifier: d.array()?,
                attrs: Fattr4::decode(d)?,
            },
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

/// openflag4: whether OPEN creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Openflag4 {
    /// OPEN4_NOCREATE.
    NoCreate,
    /// OPEN4_CREATE.
    Create(Createhow4),
}

impl Xdr for Openflag4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Openflag4::NoCreate => e.u32(0),
            Openflag4::Create(h) => {
                e.u32(1);
                h.encode(e);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            0 => Openflag4::NoCreate,
            1 => Openflag4::Create(Createhow4::decode(d)?),
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

/// open_delegation_type4.
pub mod deleg {
    /// OPEN_DELEGATE_NONE.
    pub const NONE: u32 = 0;
    /// OPEN_DELEGATE_READ.
    pub const READ: u32 = 1;
    /// OPEN_DELEGATE_WRITE.
    pub const WRITE: u32 = 2;
    /// OPEN_DELEGATE_NONE_EXT.
    pub const NONE_EXT: u32 = 3;
}

/// open_claim4: what OPEN opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenClaim4 {
    /// CLAIM_NULL: `file` in the current directory.
    Null(Component4),
    /// CLAIM_PREVIOUS: the current file, opened before the server
    /// restarted, with the delegation then held.
    Previous(u32),
    /// CLAIM_DELEGATE_CUR: `file`, under the delegation `stateid`.
    DelegateCur {
        /// The delegation.
        stateid: Stateid4,
        /// The file in the current directory.
        file: Component4,
    },
    /// CLAIM_DELEGATE_PREV: `file`, under a delegation held before a
    /// client restart.
    DelegatePrev(Component4),
    /// CLAIM_FH: the current file.
    Fh,
    /// CLAIM_DELEG_CUR_FH: the current file, under the delegation.
    DelegCurFh(Stateid4),
    /// CLAIM_DELEG_PREV_FH: the current file, under a delegation held
    /// before a client restart.
    DelegPrevFh,
}

impl Xdr for OpenClaim4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            OpenClaim4::Null(f) => {
                e.u32(0);
                f.encode(e);
            }
            OpenClaim4::Previous(t) => {
                e.u32(1);
                e.u32(*t);
            }
            OpenClaim4::DelegateCur { stateid, file } => {
                e.u32(2);
                stateid.encode(e);
                file.encode(e);
            }
            OpenClaim4::DelegatePrev(f) => {
                e.u32(3);
                f.encode(e);
            }
            OpenClaim4::Fh => e.u32(4),
            OpenClaim4::DelegCurFh(s) => {
                e.u32(5);
                s.encode(e);
            }
            OpenClaim4::DelegPrevFh => e.u32(6),
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            0 => OpenClaim4::Null(Component4::decode(d)?),
            1 => OpenClaim4::Previous(d.u32()?),
            2 => OpenClaim4::DelegateCur {
                stateid: Stateid4::decode(d)?,
                file: Component4::decode(d)?,
            },
            3 => OpenClaim4::DelegatePrev(Component4::decode(d)?),
            4 => OpenClaim4::Fh,
            5 => OpenClaim4::DelegCurFh(Stateid4::decode(d)?),
            6 => OpenClaim4::DelegPrevFh,
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

xdr_struct! {
    /// OPEN4args (section 18.16).
    pub struct OpenArgs {
        /// Ignored in NFSv4.1.
        pub seqid: u32,
        /// OPEN4_SHARE_ACCESS_* with the WANT_* bits.
        pub share_access: u32,
        /// OPEN4_SHARE_DENY_*.
        pub share_deny: u32,
        /// The open owner.
        pub owner: StateOwner4,
        /// Whether and how to create.
        pub openhow: Openflag4,
        /// What to open.
        pub claim: OpenClaim4,
    }
}

/// limit_by4 with its limit: how much a write delegation lets the
/// client write before it must flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpaceLimit4 {
    /// NFS_LIMIT_SIZE: bytes.
    Size(u64),
    /// NFS_LIMIT_BLOCKS: blocks of a size.
    Blocks {
        /// How many blocks.
        num_blocks: u32,
        /// Bytes in each.
        bytes_per_block: u32,
    },
}

impl Xdr for SpaceLimit4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            SpaceLimit4::Size(n) => {
                e.u32(1);
                e.u64(*n);
            }
            SpaceLimit4::Blocks {
                num_blocks,
                bytes_per_block,
            } => {
                e.u32(2);
                e.u32(*num_blocks);
                e.u32(*bytes_per_block);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            1 => SpaceLimit4::Size(d.u64()?),
            2 => SpaceLimit4::Blocks {
                num_blocks: d.u32()?,
                bytes_per_block: d.u32()?,
            },
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

xdr_struct! {
    /// open_read_delegation4.
    pub struct OpenReadDelegation4 {
        /// The delegation.
        pub stateid: Stateid4,
        /// Whether the server already wants it back.
        pub recall: bool,
        /// Who may open the file without asking.
        pub permissions: Nfsace4,
    }
}

xdr_struct! {
    /// open_write_delegation4.
    pub struct OpenWriteDelegation4 {
        /// The delegation.
        pub stateid: Stateid4,
        /// Whether the server already wants it back.
        pub recall: bool,
        /// What the client may write before it flushes.
        pub space_limit: SpaceLimit4,
        /// Who may open the file without asking.
        pub permissions: Nfsace4,
    }
}

/// why_no_delegation4.
pub mod why_no_deleg {
    /// WND4_NOT_WANTED.
    pub const NOT_WANTED: u32 = 0;
    /// WND4_CONTENTION.
    pub const CONTENTION: u32 = 1;
    /// WND4_RESOURCE.
    pub const RESOURCE: u32 = 2;
    /// WND4_NOT_SUPP_FTYPE.
    pub const NOT_SUPP_FTYPE: u32 = 3;
    /// WND4_WRITE_DELEG_NOT_SUPP_FTYPE.
    pub const WRITE_DELEG_NOT_SUPP_FTYPE: u32 = 4;
    /// WND4_NOT_SUPP_UPGRADE.
    pub const NOT_SUPP_UPGRADE: u32 = 5;
    /// WND4_NOT_SUPP_DOWNGRADE.
    pub const NOT_SUPP_DOWNGRADE: u32 = 6;
    /// WND4_CANCELLED.
    pub const CANCELLED: u32 = 7;
    /// WND4_IS_DIR.
    pub const IS_DIR: u32 = 8;
}

/// open_none_delegation4: why no delegation was granted. Only
/// CONTENTION and RESOURCE carry a flag; every other reason is alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenNoneDelegation4 {
    /// A why_no_delegation4 value.
    pub why: u32,
    /// For CONTENTION: the server will push one; for RESOURCE: it will
    /// signal when one is available. Ignored for the other reasons.
    pub later: bool,
}

impl Xdr for OpenNoneDelegation4 {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.why);
        if matches!(self.why, why_no_deleg::CONTENTION | why_no_deleg::RESOURCE) {
            e.bool(self.later);
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let why = d.u32()?;
        let later = match why {
            why_no_deleg::CONTENTION | why_no_deleg::RESOURCE => d.bool()?,
            _ => false,
        };
        Ok(OpenNoneDelegation4 { why, later })
    }
}

/// open_delegation4: the delegation OPEN granted, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenDelegation4 {
    /// OPEN_DELEGATE_NONE.
    None,
    /// OPEN_DELEGATE_READ.
    Read(OpenReadDelegation4),
    /// OPEN_DELEGATE_WRITE.
    Write(OpenWriteDelegation4),
    /// OPEN_DELEGATE_NONE_EXT: none, and why.
    NoneExt(OpenNoneDelegation4),
}

impl Xdr for OpenDelegation4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            OpenDelegation4::None => e.u32(deleg::NONE),
            OpenDelegation4::Read(r) => {
                e.u32(deleg::READ);
                r.encode(e);
            }
            OpenDelegation4::Write(w) => {
                e.u32(deleg::WRITE);
                w.encode(e);
            }
            OpenDelegation4::NoneExt(n) => {
                e.u32(deleg::NONE_EXT);
                n.encode(e);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            deleg::NONE => OpenDelegation4::None,
            deleg::READ => OpenDelegation4::Read(OpenReadDelegation4::decode(d)?),
            deleg::WRITE => OpenDelegation4::Write(OpenWriteDelegation4::decode(d)?),
            deleg::NONE_EXT => OpenDelegation4::NoneExt(OpenNoneDelegation4::decode(d)?),
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

xdr_struct! {
    /// OPEN4resok.
    pub struct OpenResOk {
        /// The open.
        pub stateid: Stateid4,
        /// The directory's change, when OPEN created.
        pub cinfo: ChangeInfo4,
        /// OPEN4_RESULT_* flags.
        pub rflags: u32,
        /// The attributes set at creation.
        pub attrset: Bitmap4,
        /// The delegation granted.
        pub delegation: OpenDelegation4,
    }
}

xdr_struct! {
    /// OPEN_DOWNGRADE4args (section 18.18).
    pub struct OpenDowngradeArgs {
        /// The open.
        pub stateid: Stateid4,
        /// Ignored in NFSv4.1.
        pub seqid: u32,
        /// The access to keep.
        pub share_access: u32,
        /// The deny to keep.
        pub share_deny: u32,
    }
}

/// nfs_lock_type4.
pub mod lock_type {
    /// READ_LT.
    pub const READ: u32 = 1;
    /// WRITE_LT.
    pub const WRITE: u32 = 2;
    /// READW_LT: read, the client would wait.
    pub const READW: u32 = 3;
    /// WRITEW_LT: write, the client would wait.
    pub const WRITEW: u32 = 4;
}

xdr_struct! {
    /// open_to_lock_owner4: a lock owner's first lock, under an open.
    pub struct OpenToLockOwner4 {
        /// Ignored in NFSv4.1.
        pub open_seqid: u32,
        /// The open.
        pub open_stateid: Stateid4,
        /// Ignored in NFSv4.1.
        pub lock_seqid: u32,
        /// The new lock owner.
        pub lock_owner: StateOwner4,
    }
}

xdr_struct! {
    /// exist_lock_owner4: a lock owner that already holds a stateid.
    pub struct ExistLockOwner4 {
        /// Its lock stateid.
        pub lock_stateid: Stateid4,
        /// Ignored in NFSv4.1.
        pub lock_seqid: u32,
    }
}

/// locker4: who LOCK locks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locker4 {
    /// A new lock owner.
    New(OpenToLockOwner4),
    /// A lock owner with a stateid.
    Existing(ExistLockOwner4),
}

impl Xdr for Locker4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Locker4::New(n) => {
                e.bool(true);
                n.encode(e);
            }
            Locker4::Existing(x) => {
                e.bool(false);
                x.encode(e);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(if d.bool()? {
            Locker4::New(OpenToLockOwner4::decode(d)?)
        } else {
            Locker4::Existing(ExistLockOwner4::decode(d)?)
        })
    }
}

xdr_struct! {
    /// LOCK4args (section 18.10).
    pub struct LockArgs {
        /// A `lock_type` value.
        pub locktype: u32,
        /// Whether this reclaims a lock held before a server restart.
        pub reclaim: bool,
        /// First byte.
        pub offset: u64,
        /// Bytes; all ones for "to the end".
        pub length: u64,
        /// Who locks.
        pub locker: Locker4,
    }
}

xdr_struct! {
    /// LOCK4denied: the lock in the way.
    pub struct LockDenied4 {
        /// Its first byte.
        pub offset: u64,
        /// Its length.
        pub length: u64,
        /// Its type.
        pub locktype: u32,
        /// Its owner.
        pub owner: StateOwner4,
    }
}

xdr_struct! {
    /// LOCKT4args (section 18.11).
    pub struct LocktArgs {
        /// A `lock_type` value.
        pub locktype: u32,
        /// First byte.
        pub offset: u64,
        /// Bytes.
        pub length: u64,
        /// The owner that would lock.
        pub owner: StateOwner4,
    }
}

xdr_struct! {
    /// LOCKU4args (section 18.12).
    pub struct LockuArgs {
        /// A `lock_type` value.
        pub locktype: u32,
        /// Ignored in NFSv4.1.
        pub seqid: u32,
        /// The lock state.
        pub lock_stateid: Stateid4,
        /// First byte.
        pub offset: u64,
        /// Bytes.
        pub length: u64,
    }
}

xdr_struct! {
    /// COMMIT4args (section 18.3).
    pub struct CommitArgs {
        /// First byte.
        pub offset: u64,
        /// Bytes; 0 for "to the end".
        pub count: u32,
    }
}

/// Most stateids one TEST_STATEID may carry.
pub const MAX_TEST_STATEIDS: usize = 1024;

/// TEST_STATEID4args (section 18.48).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TestStateidArgs {
    /// The stateids to test.
    pub stateids: Vec<Stateid4>,
}

impl Xdr for TestStateidArgs {
    fn encode(&self, e: &mut Encoder) {
        put_array(e, &self.stateids);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(TestStateidArgs {
            stateids: array(d, MAX_TEST_STATEIDS, 16)?,
        })
    }
}

/// TEST_STATEID4resok.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TestStateidResOk {
    /// One status for each stateid asked.
    pub codes: Vec<Nfsstat4>,
}

impl Xdr for TestStateidResOk {
    fn encode(&self, e: &mut Encoder) {
        put_array(e, &self.codes);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(TestStateidResOk {
            codes: array(d, MAX_TEST_STATEIDS, 4)?,
        })
    }
}

xdr_struct! {
    /// SEEK4args (RFC 7862 section 15.11).
    pub struct SeekArgs {
        /// The open, lock or special stateid.
        pub stateid: Stateid4,
        /// Where to start.
        pub offset: u64,
        /// NFS4_CONTENT_DATA (0) or NFS4_CONTENT_HOLE (1).
        pub what: u32,
    }
}

xdr_struct! {
    /// SEEK4resok.
    pub struct SeekResOk {
        /// Whether nothing follows.
        pub eof: bool,
        /// Where the data or hole starts.
        pub offset: u64,
    }
}

xdr_struct! {
    /// ALLOCATE4args and DEALLOCATE4args (RFC 7862 sections 15.1 and 15.4).
    pub struct AllocateArgs {
        /// The open or lock stateid.
        pub stateid: Stateid4,
        /// First byte.
        pub offset: u64,
        /// Bytes.
        pub length: u64,
    }
}

xdr_struct! {
    /// CLONE4args (RFC 7862 section 15.13): the saved filehandle is the
    /// source, the current one the destination.
    pub struct CloneArgs {
        /// A stateid of the source that reads.
        pub src_stateid: Stateid4,
        /// A stateid of the destination that writes.
        pub dst_stateid: Stateid4,
        /// Where the range starts in the source.
        pub src_offset: u64,
        /// Where it goes in the destination.
        pub dst_offset: u64,
        /// Its length; 0 to the end of the source.
        pub count: u64,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bytes, roundtrip, stateid};
    use super::*;
    use proptest::prelude::*;

    fn fattr() -> impl Strategy<Value = Fattr4> {
        (proptest::collection::vec(any::<u32>(), 0..4), bytes(64)).prop_map(|(m, vals)| Fattr4 {
            mask: Bitmap4(m),
            vals,
        })
    }

    fn owner() -> impl Strategy<Value = StateOwner4> {
        (any::<u64>(), bytes(64)).prop_map(|(clientid, owner)| StateOwner4 { clientid, owner })
    }

    fn name() -> impl Strategy<Value = Component4> {
        bytes(300).prop_map(Component4)
    }

    fn openhow() -> impl Strategy<Value = Openflag4> {
        prop_oneof![
            Just(Openflag4::NoCreate),
            fattr().prop_map(|a| Openflag4::Create(Createhow4::Unchecked(a))),
            fattr().prop_map(|a| Openflag4::Create(Createhow4::Guarded(a))),
            any::<[u8; 8]>().prop_map(|v| Openflag4::Create(Createhow4::Exclusive(v))),
            (any::<[u8; 8]>(), fattr()).prop_map(|(verifier, attrs)| Openflag4::Create(
                Createhow4::Exclusive41 { verifier, attrs }
            )),
        ]
    }

    fn claim() -> impl Strategy<Value = OpenClaim4> {
        prop_oneof![
            name().prop_map(OpenClaim4::Null),
            any::<u32>().prop_map(OpenClaim4::Previous),
            (stateid(), name())
                .prop_map(|(stateid, file)| OpenClaim4::DelegateCur { stateid, file }),
            name().prop_map(OpenClaim4::DelegatePrev),
            Just(OpenClaim4::Fh),
            stateid().prop_map(OpenClaim4::DelegCurFh),
            Just(OpenClaim4::DelegPrevFh),
        ]
    }

    fn ace() -> impl Strategy<Value = Nfsace4> {
        (any::<[u32; 3]>(), bytes(32)).prop_map(|(v, who)| Nfsace4 {
            acetype: v[0],
            flag: v[1],
            access_mask: v[2],
            who,
        })
    }

    fn delegation() -> impl Strategy<Value = OpenDelegation4> {
        prop_oneof![
            Just(OpenDelegation4::None),
            (stateid(), any::<bool>(), ace()).prop_map(|(stateid, recall, permissions)| {
                OpenDelegation4::Read(OpenReadDelegation4 {
                    stateid,
                    recall,
                    permissions,
                })
            }),
            (
                stateid(),
                any::<bool>(),
                any::<(bool, u64, u32, u32)>(),
                ace()
            )
                .prop_map(|(stateid, recall, l, permissions)| {
                    let space_limit = if l.0 {
                        SpaceLimit4::Size(l.1)
                    } else {
                        SpaceLimit4::Blocks {
                            num_blocks: l.2,
                            bytes_per_block: l.3,
                        }
                    };
                    OpenDelegation4::Write(OpenWriteDelegation4 {
                        stateid,
                        recall,
                        space_limit,
                        permissions,
                    })
                }),
            (0u32..9, any::<bool>()).prop_map(|(why, later)| {
                // Only CONTENTION and RESOURCE carry the flag.
                let later = later && matches!(why, 1 | 2);
                OpenDelegation4::NoneExt(OpenNoneDelegation4 { why, later })
            }),
        ]
    }

    proptest! {
        #[test]
        fn open_roundtrips(
            v in any::<[u32; 4]>(), owner in owner(), openhow in openhow(), claim in claim(),
            sid in stateid(), cinfo in any::<(bool, u64, u64)>(), attrset in proptest::collection::vec(any::<u32>(), 0..3),
            delegation in delegation(),
        ) {
            roundtrip(&OpenArgs { seqid: v[0], share_access: v[1], share_deny: v[2], owner, openhow, claim });
            roundtrip(&OpenResOk {
                stateid: sid,
                cinfo: ChangeInfo4 { atomic: cinfo.0, before: cinfo.1, after: cinfo.2 },
                rflags: v[3],
                attrset: Bitmap4(attrset),
                delegation,
            });
            roundtrip(&OpenDowngradeArgs { stateid: sid, seqid: v[0], share_access: v[1], share_deny: v[2] });
        }

        #[test]
        fn lock_roundtrips(
            v in any::<(u32, bool, u64, u64, u32)>(), sid in stateid(), open in stateid(), owner in owner(), new in any::<bool>(),
        ) {
            let locker = if new {
                Locker4::New(OpenToLockOwner4 { open_seqid: v.4, open_stateid: open, lock_seqid: v.0, lock_owner: owner.clone() })
            } else {
                Locker4::Existing(ExistLockOwner4 { lock_stateid: sid, lock_seqid: v.4 })
            };
            roundtrip(&LockArgs { locktype: v.0, reclaim: v.1, offset: v.2, length: v.3, locker });
            roundtrip(&LockDenied4 { offset: v.2, length: v.3, locktype: v.0, owner: owner.clone() });
            roundtrip(&LocktArgs { locktype: v.0, offset: v.2, length: v.3, owner });
            roundtrip(&LockuArgs { locktype: v.0, seqid: v.4, lock_stateid: sid, offset: v.2, length: v.3 });
        }

        #[test]
        fn small_file_ops_roundtrip(
            sid in stateid(), offset in any::<u64>(), n in any::<u32>(), eof in any::<bool>(),
            sids in proptest::collection::vec(stateid(), 0..8), codes in proptest::collection::vec(any::<u32>(), 0..8),
        ) {
            roundtrip(&CommitArgs { offset, count: n });
            roundtrip(&TestStateidArgs { stateids: sids });
            roundtrip(&TestStateidResOk { codes: codes.into_iter().map(Nfsstat4).collect() });
            roundtrip(&SeekArgs { stateid: sid, offset, what: n });
            roundtrip(&SeekResOk { eof, offset });
            roundtrip(&AllocateArgs { stateid: sid, offset, length: n as u64 });
        }
    }

    #[test]
    fn none_ext_carries_a_flag_only_for_contention_and_resource() {
        for why in 0..9u32 {
            let mut e = Encoder::new();
            OpenNoneDelegation4 { why, later: true }.encode(&mut e);
            let want = if matches!(why, 1 | 2) { 8 } else { 4 };
            assert_eq!(e.len(), want, "why {why}");
        }
    }
}
