//! NFSv4.1/4.2 protocol numbers (RFC 8881, RFC 7862).

#![allow(missing_docs)]

/// nfsstat4 values (RFC 8881 section 15, RFC 7862 section 11).
pub mod status {
    use super::Nfsstat4;

    pub const OK: Nfsstat4 = Nfsstat4(0);
    pub const PERM: Nfsstat4 = Nfsstat4(1);
    pub const NOENT: Nfsstat4 = Nfsstat4(2);
    pub const IO: Nfsstat4 = Nfsstat4(5);
    pub const NXIO: Nfsstat4 = Nfsstat4(6);
    pub const ACCESS: Nfsstat4 = Nfsstat4(13);
    pub const EXIST: Nfsstat4 = Nfsstat4(17);
    pub const XDEV: Nfsstat4 = Nfsstat4(18);
    pub const NOTDIR: Nfsstat4 = Nfsstat4(20);
    pub const ISDIR: Nfsstat4 = Nfsstat4(21);
    pub const INVAL: Nfsstat4 = Nfsstat4(22);
    pub const FBIG: Nfsstat4 = Nfsstat4(27);
    pub const NOSPC: Nfsstat4 = Nfsstat4(28);
    pub const ROFS: Nfsstat4 = Nfsstat4(30);
    pub const MLINK: Nfsstat4 = Nfsstat4(31);
    pub const NAMETOOLONG: Nfsstat4 = Nfsstat4(63);
    pub const NOTEMPTY: Nfsstat4 = Nfsstat4(66);
    pub const DQUOT: Nfsstat4 = Nfsstat4(69);
    pub const STALE: Nfsstat4 = Nfsstat4(70);
    pub const BADHANDLE: Nfsstat4 = Nfsstat4(10001);
    pub const BAD_COOKIE: Nfsstat4 = Nfsstat4(10003);
    pub const NOTSUPP: Nfsstat4 = Nfsstat4(10004);
    pub const TOOSMALL: Nfsstat4 = Nfsstat4(10005);
    pub const SERVERFAULT: Nfsstat4 = Nfsstat4(10006);
    pub const BADTYPE: Nfsstat4 = Nfsstat4(10007);
    pub const DELAY: Nfsstat4 = Nfsstat4(10008);
    pub const SAME: Nfsstat4 = Nfsstat4(10009);
    pub const DENIED: Nfsstat4 = Nfsstat4(10010);
    pub const EXPIRED: Nfsstat4 = Nfsstat4(10011);
    pub const LOCKED: Nfsstat4 = Nfsstat4(10012);
    pub const GRACE: Nfsstat4 = Nfsstat4(10013);
    pub const SHARE_DENIED: Nfsstat4 = Nfsstat4(10015);
    pub const WRONGSEC: Nfsstat4 = Nfsstat4(10016);
    pub const CLID_INUSE: Nfsstat4 = Nfsstat4(10017);
    pub const RESOURCE: Nfsstat4 = Nfsstat4(10018);
    pub const NOFILEHANDLE: Nfsstat4 = Nfsstat4(10020);
    pub const MINOR_VERS_MISMATCH: Nfsstat4 = Nfsstat4(10021);
    pub const STALE_CLIENTID: Nfsstat4 = Nfsstat4(10022);
    pub const STALE_STATEID: Nfsstat4 = Nfsstat4(10023);
    pub const OLD_STATEID: Nfsstat4 = Nfsstat4(10024);
    pub const BAD_STATEID: Nfsstat4 = Nfsstat4(10025);
    pub const BAD_SEQID: Nfsstat4 = Nfsstat4(10026);
    pub const NOT_SAME: Nfsstat4 = Nfsstat4(10027);
    pub const LOCK_RANGE: Nfsstat4 = Nfsstat4(10028);
    pub const SYMLINK: Nfsstat4 = Nfsstat4(10029);
    pub const RESTOREFH: Nfsstat4 = Nfsstat4(10030);
    pub const ATTRNOTSUPP: Nfsstat4 = Nfsstat4(10032);
    pub const NO_GRACE: Nfsstat4 = Nfsstat4(10033);
    pub const RECLAIM_BAD: Nfsstat4 = Nfsstat4(10034);
    pub const BADXDR: Nfsstat4 = Nfsstat4(10036);
    pub const LOCKS_HELD: Nfsstat4 = Nfsstat4(10037);
    pub const OPENMODE: Nfsstat4 = Nfsstat4(10038);
    pub const BADOWNER: Nfsstat4 = Nfsstat4(10039);
    pub const BADCHAR: Nfsstat4 = Nfsstat4(10040);
    pub const BADNAME: Nfsstat4 = Nfsstat4(10041);
    pub const BAD_RANGE: Nfsstat4 = Nfsstat4(10042);
    pub const LOCK_NOTSUPP: Nfsstat4 = Nfsstat4(10043);
    pub const OP_ILLEGAL: Nfsstat4 = Nfsstat4(10044);
    pub const DEADLOCK: Nfsstat4 = Nfsstat4(10045);
    pub const FILE_OPEN: Nfsstat4 = Nfsstat4(10046);
    pub const DELEG_REVOKED: Nfsstat4 = Nfsstat4(10087);
    pub const BADSESSION: Nfsstat4 = Nfsstat4(10052);
    pub const BADSLOT: Nfsstat4 = Nfsstat4(10053);
    pub const COMPLETE_ALREADY: Nfsstat4 = Nfsstat4(10054);
    pub const CONN_NOT_BOUND_TO_SESSION: Nfsstat4 = Nfsstat4(10055);
    pub const SEQ_MISORDERED: Nfsstat4 = Nfsstat4(10063);
    pub const SEQUENCE_POS: Nfsstat4 = Nfsstat4(10064);
    pub const REQ_TOO_BIG: Nfsstat4 = Nfsstat4(10065);
    pub const REP_TOO_BIG: Nfsstat4 = Nfsstat4(10066);
    pub const REP_TOO_BIG_TO_CACHE: Nfsstat4 = Nfsstat4(10067);
    pub const RETRY_UNCACHED_REP: Nfsstat4 = Nfsstat4(10068);
    pub const TOO_MANY_OPS: Nfsstat4 = Nfsstat4(10070);
    pub const OP_NOT_IN_SESSION: Nfsstat4 = Nfsstat4(10071);
    pub const CLIENTID_BUSY: Nfsstat4 = Nfsstat4(10074);
    pub const SEQ_FALSE_RETRY: Nfsstat4 = Nfsstat4(10076);
    pub const BAD_HIGH_SLOT: Nfsstat4 = Nfsstat4(10077);
    pub const DEADSESSION: Nfsstat4 = Nfsstat4(10078);
    pub const ENCR_ALG_UNSUPP: Nfsstat4 = Nfsstat4(10079);
    pub const NOT_ONLY_OP: Nfsstat4 = Nfsstat4(10081);
    pub const WRONG_CRED: Nfsstat4 = Nfsstat4(10082);
    pub const WRONG_TYPE: Nfsstat4 = Nfsstat4(10083);
    pub const PARTNER_NOTSUPP: Nfsstat4 = Nfsstat4(10088);
    pub const UNION_NOTSUPP: Nfsstat4 = Nfsstat4(10090);
    /// The server will not do this copy asynchronously, or at all now
    /// (RFC 7862).
    pub const OFFLOAD_DENIED: Nfsstat4 = Nfsstat4(10091);
    /// The server cannot meet the copy's requirements (RFC 7862).
    pub const OFFLOAD_NO_REQS: Nfsstat4 = Nfsstat4(10094);
    /// No such extended attribute (RFC 8276).
    pub const NOXATTR: Nfsstat4 = Nfsstat4(10095);
    /// An extended attribute value too large (RFC 8276).
    pub const XATTR2BIG: Nfsstat4 = Nfsstat4(10096);

    /// The name of status `st` as RFC 8881 and RFC 7862 spell it.
    pub fn name(st: Nfsstat4) -> &'static str {
        match st {
            OK => "NFS4_OK",
            PERM => "NFS4ERR_PERM",
            NOENT => "NFS4ERR_NOENT",
            IO => "NFS4ERR_IO",
            NXIO => "NFS4ERR_NXIO",
            ACCESS => "NFS4ERR_ACCESS",
            EXIST => "NFS4ERR_EXIST",
            XDEV => "NFS4ERR_XDEV",
            NOTDIR => "NFS4ERR_NOTDIR",
            ISDIR => "NFS4ERR_ISDIR",
            INVAL => "NFS4ERR_INVAL",
            FBIG => "NFS4ERR_FBIG",
            NOSPC => "NFS4ERR_NOSPC",
            ROFS => "NFS4ERR_ROFS",
            MLINK => "NFS4ERR_MLINK",
            NAMETOOLONG => "NFS4ERR_NAMETOOLONG",
            NOTEMPTY => "NFS4ERR_NOTEMPTY",
            DQUOT => "NFS4ERR_DQUOT",
            STALE => "NFS4ERR_STALE",
            BADHANDLE => "NFS4ERR_BADHANDLE",
            BAD_COOKIE => "NFS4ERR_BAD_COOKIE",
            NOTSUPP => "NFS4ERR_NOTSUPP",
            TOOSMALL => "NFS4ERR_TOOSMALL",
            NOXATTR => "NFS4ERR_NOXATTR",
            XATTR2BIG => "NFS4ERR_XATTR2BIG",
            PARTNER_NOTSUPP => "NFS4ERR_PARTNER_NOTSUPP",
            OFFLOAD_DENIED => "NFS4ERR_OFFLOAD_DENIED",
            OFFLOAD_NO_REQS => "NFS4ERR_OFFLOAD_NO_REQS",
            SERVERFAULT => "NFS4ERR_SERVERFAULT",
            BADTYPE => "NFS4ERR_BADTYPE",
            DELAY => "NFS4ERR_DELAY",
            SAME => "NFS4ERR_SAME",
            DENIED => "NFS4ERR_DENIED",
            EXPIRED => "NFS4ERR_EXPIRED",
            LOCKED => "NFS4ERR_LOCKED",
            GRACE => "NFS4ERR_GRACE",
            SHARE_DENIED => "NFS4ERR_SHARE_DENIED",
            WRONGSEC => "NFS4ERR_WRONGSEC",
            CLID_INUSE => "NFS4ERR_CLID_INUSE",
            RESOURCE => "NFS4ERR_RESOURCE",
            NOFILEHANDLE => "NFS4ERR_NOFILEHANDLE",
            MINOR_VERS_MISMATCH => "NFS4ERR_MINOR_VERS_MISMATCH",
            STALE_CLIENTID => "NFS4ERR_STALE_CLIENTID",
            STALE_STATEID => "NFS4ERR_STALE_STATEID",
            OLD_STATEID => "NFS4ERR_OLD_STATEID",
            BAD_STATEID => "NFS4ERR_BAD_STATEID",
            BAD_SEQID => "NFS4ERR_BAD_SEQID",
            NOT_SAME => "NFS4ERR_NOT_SAME",
            LOCK_RANGE => "NFS4ERR_LOCK_RANGE",
            SYMLINK => "NFS4ERR_SYMLINK",
            RESTOREFH => "NFS4ERR_RESTOREFH",
            ATTRNOTSUPP => "NFS4ERR_ATTRNOTSUPP",
            NO_GRACE => "NFS4ERR_NO_GRACE",
            RECLAIM_BAD => "NFS4ERR_RECLAIM_BAD",
            BADXDR => "NFS4ERR_BADXDR",
            LOCKS_HELD => "NFS4ERR_LOCKS_HELD",
            OPENMODE => "NFS4ERR_OPENMODE",
            BADOWNER => "NFS4ERR_BADOWNER",
            BADCHAR => "NFS4ERR_BADCHAR",
            BADNAME => "NFS4ERR_BADNAME",
            BAD_RANGE => "NFS4ERR_BAD_RANGE",
            LOCK_NOTSUPP => "NFS4ERR_LOCK_NOTSUPP",
            OP_ILLEGAL => "NFS4ERR_OP_ILLEGAL",
            DEADLOCK => "NFS4ERR_DEADLOCK",
            FILE_OPEN => "NFS4ERR_FILE_OPEN",
            BADSESSION => "NFS4ERR_BADSESSION",
            BADSLOT => "NFS4ERR_BADSLOT",
            COMPLETE_ALREADY => "NFS4ERR_COMPLETE_ALREADY",
            CONN_NOT_BOUND_TO_SESSION => "NFS4ERR_CONN_NOT_BOUND_TO_SESSION",
            SEQ_MISORDERED => "NFS4ERR_SEQ_MISORDERED",
            SEQUENCE_POS => "NFS4ERR_SEQUENCE_POS",
            REQ_TOO_BIG => "NFS4ERR_REQ_TOO_BIG",
            REP_TOO_BIG => "NFS4ERR_REP_TOO_BIG",
            REP_TOO_BIG_TO_CACHE => "NFS4ERR_REP_TOO_BIG_TO_CACHE",
            RETRY_UNCACHED_REP => "NFS4ERR_RETRY_UNCACHED_REP",
            TOO_MANY_OPS => "NFS4ERR_TOO_MANY_OPS",
            OP_NOT_IN_SESSION => "NFS4ERR_OP_NOT_IN_SESSION",
            CLIENTID_BUSY => "NFS4ERR_CLIENTID_BUSY",
            SEQ_FALSE_RETRY => "NFS4ERR_SEQ_FALSE_RETRY",
            BAD_HIGH_SLOT => "NFS4ERR_BAD_HIGH_SLOT",
            DEADSESSION => "NFS4ERR_DEADSESSION",
            DELEG_REVOKED => "NFS4ERR_DELEG_REVOKED",
            ENCR_ALG_UNSUPP => "NFS4ERR_ENCR_ALG_UNSUPP",
            NOT_ONLY_OP => "NFS4ERR_NOT_ONLY_OP",
            WRONG_CRED => "NFS4ERR_WRONG_CRED",
            WRONG_TYPE => "NFS4ERR_WRONG_TYPE",
            UNION_NOTSUPP => "NFS4ERR_UNION_NOTSUPP",
            _ => "unknown status",
        }
    }
}

/// An NFSv4 status (nfsstat4): [`status::OK`] or an error. It prints by
/// name (`NFS4ERR_STALE`), so logs read as the RFC does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Nfsstat4(pub u32);

impl Nfsstat4 {
    /// The number on the wire.
    pub fn code(self) -> u32 {
        self.0
    }

    /// The RFC's name for it.
    pub fn name(self) -> &'static str {
        status::name(self)
    }

    /// True for NFS4_OK.
    pub fn is_ok(self) -> bool {
        self == status::OK
    }
}

impl std::fmt::Debug for Nfsstat4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl std::fmt::Display for Nfsstat4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<&std::io::Error> for Nfsstat4 {
    /// The status for a failed system call: the one engine errors map to.
    fn from(e: &std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc_errno::EPERM) => status::PERM,
            Some(libc_errno::ENOENT) => status::NOENT,
            Some(libc_errno::ENXIO) => status::NXIO,
            Some(libc_errno::EACCES) => status::ACCESS,
            Some(libc_errno::EEXIST) => status::EXIST,
            Some(libc_errno::EXDEV) => status::XDEV,
            Some(libc_errno::ENOTDIR) => status::NOTDIR,
            Some(libc_errno::EISDIR) => status::ISDIR,
            // The engine's word for "not a regular file".
            Some(libc_errno::EMEDIUMTYPE) => status::WRONG_TYPE,
            Some(libc_errno::EINVAL) => status::INVAL,
            Some(libc_errno::EFBIG) => status::FBIG,
            Some(libc_errno::ENOSPC) => status::NOSPC,
            Some(libc_errno::EROFS) => status::ROFS,
            Some(libc_errno::EMLINK) => status::MLINK,
            Some(libc_errno::ENAMETOOLONG) => status::NAMETOOLONG,
            Some(libc_errno::ENOTEMPTY) => status::NOTEMPTY,
            Some(libc_errno::EDQUOT) => status::DQUOT,
            Some(libc_errno::ESTALE) => status::STALE,
            Some(libc_errno::ELOOP) => status::SYMLINK,
            Some(libc_errno::EOPNOTSUPP) => status::NOTSUPP,
            Some(libc_errno::EAGAIN) => status::DELAY,
            _ => status::IO,
        }
    }
}

/// Linux errno values (the protocol crate does no I/O and has no libc).
mod libc_errno {
    pub(super) const EPERM: i32 = 1;
    pub(super) const ENOENT: i32 = 2;
    pub(super) const ENXIO: i32 = 6;
    pub(super) const EAGAIN: i32 = 11;
    pub(super) const EACCES: i32 = 13;
    pub(super) const EEXIST: i32 = 17;
    pub(super) const EXDEV: i32 = 18;
    pub(super) const ENOTDIR: i32 = 20;
    pub(super) const EISDIR: i32 = 21;
    pub(super) const EINVAL: i32 = 22;
    pub(super) const EFBIG: i32 = 27;
    pub(super) const ENOSPC: i32 = 28;
    pub(super) const EROFS: i32 = 30;
    pub(super) const EMLINK: i32 = 31;
    pub(super) const ENAMETOOLONG: i32 = 36;
    pub(super) const ENOTEMPTY: i32 = 39;
    pub(super) const ELOOP: i32 = 40;
    pub(super) const EOPNOTSUPP: i32 = 95;
    pub(super) const EDQUOT: i32 = 122;
    pub(super) const ESTALE: i32 = 116;
    pub(super) const EMEDIUMTYPE: i32 = 124;
}

/// nfs_opnum4 values.
pub mod op {
    pub const ACCESS: u32 = 3;
    pub const CLOSE: u32 = 4;
    pub const COMMIT: u32 = 5;
    pub const CREATE: u32 = 6;
    pub const DELEGPURGE: u32 = 7;
    pub const DELEGRETURN: u32 = 8;
    pub const GETATTR: u32 = 9;
    pub const GETFH: u32 = 10;
    pub const LINK: u32 = 11;
    pub const LOCK: u32 = 12;
    pub const LOCKT: u32 = 13;
    pub const LOCKU: u32 = 14;
    pub const LOOKUP: u32 = 15;
    pub const LOOKUPP: u32 = 16;
    pub const NVERIFY: u32 = 17;
    pub const OPEN: u32 = 18;
    pub const OPENATTR: u32 = 19;
    pub const OPEN_CONFIRM: u32 = 20;
    pub const OPEN_DOWNGRADE: u32 = 21;
    pub const PUTFH: u32 = 22;
    pub const PUTPUBFH: u32 = 23;
    pub const PUTROOTFH: u32 = 24;
    pub const READ: u32 = 25;
    pub const READDIR: u32 = 26;
    pub const READLINK: u32 = 27;
    pub const REMOVE: u32 = 28;
    pub const RENAME: u32 = 29;
    pub const RENEW: u32 = 30;
    pub const RESTOREFH: u32 = 31;
    pub const SAVEFH: u32 = 32;
    pub const SECINFO: u32 = 33;
    pub const SETATTR: u32 = 34;
    pub const SETCLIENTID: u32 = 35;
    pub const SETCLIENTID_CONFIRM: u32 = 36;
    pub const VERIFY: u32 = 37;
    pub const WRITE: u32 = 38;
    pub const RELEASE_LOCKOWNER: u32 = 39;
    pub const BACKCHANNEL_CTL: u32 = 40;
    pub const BIND_CONN_TO_SESSION: u32 = 41;
    pub const EXCHANGE_ID: u32 = 42;
    pub const CREATE_SESSION: u32 = 43;
    pub const DESTROY_SESSION: u32 = 44;
    pub const FREE_STATEID: u32 = 45;
    pub const GET_DIR_DELEGATION: u32 = 46;
    pub const GETDEVICEINFO: u32 = 47;
    pub const GETDEVICELIST: u32 = 48;
    pub const LAYOUTCOMMIT: u32 = 49;
    pub const LAYOUTGET: u32 = 50;
    pub const LAYOUTRETURN: u32 = 51;
    pub const SECINFO_NO_NAME: u32 = 52;
    pub const SEQUENCE: u32 = 53;
    pub const SET_SSV: u32 = 54;
    pub const TEST_STATEID: u32 = 55;
    pub const WANT_DELEGATION: u32 = 56;
    pub const DESTROY_CLIENTID: u32 = 57;
    pub const RECLAIM_COMPLETE: u32 = 58;
    pub const ALLOCATE: u32 = 59;
    pub const COPY: u32 = 60;
    pub const COPY_NOTIFY: u32 = 61;
    pub const DEALLOCATE: u32 = 62;
    pub const IO_ADVISE: u32 = 63;
    pub const LAYOUTERROR: u32 = 64;
    pub const LAYOUTSTATS: u32 = 65;
    pub const OFFLOAD_CANCEL: u32 = 66;
    pub const OFFLOAD_STATUS: u32 = 67;
    pub const READ_PLUS: u32 = 68;
    pub const SEEK: u32 = 69;
    pub const WRITE_SAME: u32 = 70;
    pub const CLONE: u32 = 71;
    pub const GETXATTR: u32 = 72;
    pub const SETXATTR: u32 = 73;
    pub const LISTXATTRS: u32 = 74;
    pub const REMOVEXATTR: u32 = 75;
    pub const ILLEGAL: u32 = 10044;

    /// Highest op number this server knows (NFSv4.2 with RFC 8276 xattrs).
    pub const LAST_KNOWN: u32 = REMOVEXATTR;
}

/// nfs_ftype4 values.
pub mod ftype {
    pub const REG: u32 = 1;
    pub const DIR: u32 = 2;
    pub const BLK: u32 = 3;
    pub const CHR: u32 = 4;
    pub const LNK: u32 = 5;
    pub const SOCK: u32 = 6;
    pub const FIFO: u32 = 7;
}

/// Attribute numbers (fattr4 bits).
pub mod attr {
    pub const SUPPORTED_ATTRS: u32 = 0;
    pub const TYPE: u32 = 1;
    pub const FH_EXPIRE_TYPE: u32 = 2;
    pub const CHANGE: u32 = 3;
    pub const SIZE: u32 = 4;
    pub const LINK_SUPPORT: u32 = 5;
    pub const SYMLINK_SUPPORT: u32 = 6;
    pub const NAMED_ATTR: u32 = 7;
    pub const FSID: u32 = 8;
    pub const UNIQUE_HANDLES: u32 = 9;
    pub const LEASE_TIME: u32 = 10;
    pub const RDATTR_ERROR: u32 = 11;
    pub const ACLSUPPORT: u32 = 13;
    pub const CANSETTIME: u32 = 15;
    pub const CASE_INSENSITIVE: u32 = 16;
    pub const CASE_PRESERVING: u32 = 17;
    pub const CHOWN_RESTRICTED: u32 = 18;
    pub const FILEHANDLE: u32 = 19;
    pub const FILEID: u32 = 20;
    pub const FILES_AVAIL: u32 = 21;
    pub const FILES_FREE: u32 = 22;
    pub const FILES_TOTAL: u32 = 23;
    pub const HOMOGENEOUS: u32 = 26;
    pub const MAXFILESIZE: u32 = 27;
    pub const MAXLINK: u32 = 28;
    pub const MAXNAME: u32 = 29;
    pub const MAXREAD: u32 = 30;
    pub const MAXWRITE: u32 = 31;
    pub const MODE: u32 = 33;
    pub const NO_TRUNC: u32 = 34;
    pub const NUMLINKS: u32 = 35;
    pub const OWNER: u32 = 36;
    pub const OWNER_GROUP: u32 = 37;
    pub const RAWDEV: u32 = 41;
    pub const SPACE_AVAIL: u32 = 42;
    pub const SPACE_FREE: u32 = 43;
    pub const SPACE_TOTAL: u32 = 44;
    pub const SPACE_USED: u32 = 45;
    pub const TIME_ACCESS: u32 = 47;
    pub const TIME_ACCESS_SET: u32 = 48;
    pub const TIME_DELTA: u32 = 51;
    pub const TIME_METADATA: u32 = 52;
    pub const TIME_MODIFY: u32 = 53;
    pub const TIME_MODIFY_SET: u32 = 54;
    pub const MOUNTED_ON_FILEID: u32 = 55;
    pub const SUPPATTR_EXCLCREAT: u32 = 75;
    /// clone_blksize (RFC 7862): the granularity of CLONE ranges.
    pub const CLONE_BLKSIZE: u32 = 77;
    /// xattr_support (RFC 8276): whether the object has extended
    /// attributes.
    pub const XATTR_SUPPORT: u32 = 82;
}

/// ACCESS4 bits.
pub mod access {
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
    /// ACCESS4_XAREAD (RFC 8276): read extended attributes.
    pub const XAREAD: u32 = 0x40;
    /// ACCESS4_XAWRITE: set and remove extended attributes.
    pub const XAWRITE: u32 = 0x80;
    /// ACCESS4_XALIST: list extended attributes.
    pub const XALIST: u32 = 0x100;
}

/// Length of a session id.
pub const SESSIONID_SIZE: usize = 16;
/// Longest file handle.
pub const FHSIZE: usize = 128;
/// Limit on opaque owner strings.
pub const OPAQUE_LIMIT: usize = 1024;
/// Length of verifiers.
pub const VERIFIER_SIZE: usize = 8;
/// "Length to end of file" in byte ranges.
pub const LENGTH_TO_EOF: u64 = u64::MAX;
