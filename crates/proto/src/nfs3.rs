//! NFSv3 (RFC 1813): procedure numbers, statuses, the arguments of every
//! procedure as decoded from a call, and the pieces of results (fattr3,
//! wcc_data, post_op_fh3) that several procedures share.

use crate::xdr::{Decoder, Encoder, XdrError, XdrResult};

/// The NFS program's version 3.
pub const VERSION: u32 = 3;
/// Longest NFSv3 file handle (NFS3_FHSIZE).
pub const FHSIZE: usize = 64;
/// Longest file name or path accepted in arguments. Names longer than
/// the file system's limit (255) decode, and get NFS3ERR_NAMETOOLONG.
pub const MAX_NAME: usize = 1024;
/// Longest symbolic link target (as Linux's PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// Procedure numbers.
pub mod proc3 {
    #![allow(missing_docs)]
    pub const NULL: u32 = 0;
    pub const GETATTR: u32 = 1;
    pub const SETATTR: u32 = 2;
    pub const LOOKUP: u32 = 3;
    pub const ACCESS: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 7;
    pub const CREATE: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const SYMLINK: u32 = 10;
    pub const MKNOD: u32 = 11;
    pub const REMOVE: u32 = 12;
    pub const RMDIR: u32 = 13;
    pub const RENAME: u32 = 14;
    pub const LINK: u32 = 15;
    pub const READDIR: u32 = 16;
    pub const READDIRPLUS: u32 = 17;
    pub const FSSTAT: u32 = 18;
    pub const FSINFO: u32 = 19;
    pub const PATHCONF: u32 = 20;
    pub const COMMIT: u32 = 21;
}

/// The name of procedure `p`, for logs and metrics.
pub fn proc_name(p: u32) -> &'static str {
    const NAMES: [&str; 22] = [
        "NULL",
        "GETATTR",
        "SETATTR",
        "LOOKUP",
        "ACCESS",
        "READLINK",
        "READ",
        "WRITE",
        "CREATE",
        "MKDIR",
        "SYMLINK",
        "MKNOD",
        "REMOVE",
        "RMDIR",
        "RENAME",
        "LINK",
        "READDIR",
        "READDIRPLUS",
        "FSSTAT",
        "FSINFO",
        "PATHCONF",
        "COMMIT",
    ];
    NAMES.get(p as usize).copied().unwrap_or("?")
}

/// An nfsstat3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nfsstat3(pub u32);

/// The nfsstat3 values.
pub mod status {
    #![allow(missing_docs)]
    use super::Nfsstat3;
    pub const OK: Nfsstat3 = Nfsstat3(0);
    pub const PERM: Nfsstat3 = Nfsstat3(1);
    pub const NOENT: Nfsstat3 = Nfsstat3(2);
    pub const IO: Nfsstat3 = Nfsstat3(5);
    pub const NXIO: Nfsstat3 = Nfsstat3(6);
    pub const ACCES: Nfsstat3 = Nfsstat3(13);
    pub const EXIST: Nfsstat3 = Nfsstat3(17);
    pub const XDEV: Nfsstat3 = Nfsstat3(18);
    pub const NODEV: Nfsstat3 = Nfsstat3(19);
    pub const NOTDIR: Nfsstat3 = Nfsstat3(20);
    pub const ISDIR: Nfsstat3 = Nfsstat3(21);
    pub const INVAL: Nfsstat3 = Nfsstat3(22);
    pub const FBIG: Nfsstat3 = Nfsstat3(27);
    pub const NOSPC: Nfsstat3 = Nfsstat3(28);
    pub const ROFS: Nfsstat3 = Nfsstat3(30);
    pub const MLINK: Nfsstat3 = Nfsstat3(31);
    pub const NAMETOOLONG: Nfsstat3 = Nfsstat3(63);
    pub const NOTEMPTY: Nfsstat3 = Nfsstat3(66);
    pub const DQUOT: Nfsstat3 = Nfsstat3(69);
    pub const STALE: Nfsstat3 = Nfsstat3(70);
    pub const REMOTE: Nfsstat3 = Nfsstat3(71);
    pub const BADHANDLE: Nfsstat3 = Nfsstat3(10001);
    pub const NOT_SYNC: Nfsstat3 = Nfsstat3(10002);
    pub const BAD_COOKIE: Nfsstat3 = Nfsstat3(10003);
    pub const NOTSUPP: Nfsstat3 = Nfsstat3(10004);
    pub const TOOSMALL: Nfsstat3 = Nfsstat3(10005);
    pub const SERVERFAULT: Nfsstat3 = Nfsstat3(10006);
    pub const BADTYPE: Nfsstat3 = Nfsstat3(10007);
    pub const JUKEBOX: Nfsstat3 = Nfsstat3(10008);
}

impl From<crate::nfs4::Nfsstat4> for Nfsstat3 {
    /// The NFSv3 status for an NFSv4 one. NFSv4 kept NFSv3's numbers for
    /// what both have; the NFSv4-only ones map to their nearest NFSv3
    /// meaning.
    fn from(st: crate::nfs4::Nfsstat4) -> Self {
        use crate::nfs4::consts::status as v4;
        match st {
            v4::SYMLINK => status::NOTDIR,
            v4::WRONG_TYPE | v4::BADXDR | v4::BADNAME => status::INVAL,
            v4::OPENMODE | v4::WRONGSEC => status::ACCES,
            v4::GRACE | v4::DELAY => status::JUKEBOX,
            v4::NOFILEHANDLE => status::BADHANDLE,
            crate::nfs4::Nfsstat4(n) if n <= 71 || (10001..=10008).contains(&n) => Nfsstat3(n),
            _ => status::SERVERFAULT,
        }
    }
}

/// File types (ftype3).
pub mod ftype3 {
    #![allow(missing_docs)]
    pub const REG: u32 = 1;
    pub const DIR: u32 = 2;
    pub const BLK: u32 = 3;
    pub const CHR: u32 = 4;
    pub const LNK: u32 = 5;
    pub const SOCK: u32 = 6;
    pub const FIFO: u32 = 7;
}

/// ACCESS3 bits.
pub mod access3 {
    #![allow(missing_docs)]
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
}

/// stable_how values.
pub mod stable {
    #![allow(missing_docs)]
    pub const UNSTABLE: u32 = 0;
    pub const DATA_SYNC: u32 = 1;
    pub const FILE_SYNC: u32 = 2;
}

/// FSINFO properties.
pub mod fsf {
    #![allow(missing_docs)]
    pub const LINK: u32 = 0x0001;
    pub const SYMLINK: u32 = 0x0002;
    pub const HOMOGENEOUS: u32 = 0x0008;
    pub const CANSETTIME: u32 = 0x0010;
}

/// An nfstime3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Time3 {
    /// Seconds since the epoch.
    pub sec: u32,
    /// Nanoseconds.
    pub nsec: u32,
}

impl Time3 {
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Time3 {
            sec: d.u32()?,
            nsec: d.u32()?,
        })
    }

    /// Writes the nfstime3.
    pub fn encode(&self, e: &mut Encoder) {
        e.u32(self.sec);
        e.u32(self.nsec);
    }
}

/// How SETATTR changes a time (time_how).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetTime3 {
    /// DONT_CHANGE.
    #[default]
    Keep,
    /// SET_TO_SERVER_TIME.
    Server,
    /// SET_TO_CLIENT_TIME.
    Client(Time3),
}

/// A sattr3: the attributes a call sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sattr3 {
    /// Permission bits.
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size.
    pub size: Option<u64>,
    /// Access time.
    pub atime: SetTime3,
    /// Modify time.
    pub mtime: SetTime3,
}

fn set_opt_u32(d: &mut Decoder<'_>) -> XdrResult<Option<u32>> {
    Ok(if d.bool()? { Some(d.u32()?) } else { None })
}

fn set_time(d: &mut Decoder<'_>) -> XdrResult<SetTime3> {
    match d.u32()? {
        0 => Ok(SetTime3::Keep),
        1 => Ok(SetTime3::Server),
        2 => Ok(SetTime3::Client(Time3::decode(d)?)),
        v => Err(XdrError::BadValue(v)),
    }
}

impl Sattr3 {
    /// Reads a sattr3.
    pub fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Sattr3 {
            mode: set_opt_u32(d)?,
            uid: set_opt_u32(d)?,
            gid: set_opt_u32(d)?,
            size: if d.bool()? { Some(d.u64()?) } else { None },
            atime: set_time(d)?,
            mtime: set_time(d)?,
        })
    }
}

/// A file handle (nfs_fh3).
pub fn fh3<'a>(d: &mut Decoder<'a>) -> XdrResult<&'a [u8]> {
    d.opaque(FHSIZE)
}

/// A file name (filename3).
pub fn name3<'a>(d: &mut Decoder<'a>) -> XdrResult<&'a [u8]> {
    d.opaque(MAX_NAME)
}

/// A diropargs3: a directory and a name in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirOp<'a> {
    /// The directory's handle.
    pub dir: &'a [u8],
    /// The name.
    pub name: &'a [u8],
}

impl<'a> DirOp<'a> {
    fn decode(d: &mut Decoder<'a>) -> XdrResult<Self> {
        Ok(DirOp {
            dir: fh3(d)?,
            name: name3(d)?,
        })
    }
}

/// CREATE's createhow3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateHow3 {
    /// UNCHECKED: create or truncate.
    Unchecked(Sattr3),
    /// GUARDED: fail if the name exists.
    Guarded(Sattr3),
    /// EXCLUSIVE, with the client's verifier.
    Exclusive([u8; 8]),
}

/// MKNOD's mknoddata3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MknodData3 {
    /// A character or block device: type, attributes, major and minor.
    Device(u32, Sattr3, u32, u32),
    /// A socket or FIFO: type and attributes.
    Pipe(u32, Sattr3),
    /// Any other type (NFS3ERR_BADTYPE).
    Other(u32),
}

/// The arguments of one NFSv3 call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Args3<'a> {
    /// NULL.
    Null,
    /// GETATTR.
    Getattr(&'a [u8]),
    /// SETATTR: object, attributes, and the ctime guard.
    Setattr(&'a [u8], Sattr3, Option<Time3>),
    /// LOOKUP.
    Lookup(DirOp<'a>),
    /// ACCESS: object and the bits asked about.
    Access(&'a [u8], u32),
    /// READLINK.
    Readlink(&'a [u8]),
    /// READ: file, offset, count.
    Read(&'a [u8], u64, u32),
    /// WRITE: file, offset, stable_how, data.
    Write(&'a [u8], u64, u32, &'a [u8]),
    /// CREATE.
    Create(DirOp<'a>, CreateHow3),
    /// MKDIR.
    Mkdir(DirOp<'a>, Sattr3),
    /// SYMLINK: where, attributes, target.
    Symlink(DirOp<'a>, Sattr3, &'a [u8]),
    /// MKNOD.
    Mknod(DirOp<'a>, MknodData3),
    /// REMOVE.
    Remove(DirOp<'a>),
    /// RMDIR.
    Rmdir(DirOp<'a>),
    /// RENAME: from, to.
    Rename(DirOp<'a>, DirOp<'a>),
    /// LINK: file, new name.
    Link(&'a [u8], DirOp<'a>),
    /// READDIR: directory, cookie, cookie verifier, count.
    Readdir(&'a [u8], u64, [u8; 8], u32),
    /// READDIRPLUS: directory, cookie, cookie verifier, dircount, maxcount.
    Readdirplus(&'a [u8], u64, [u8; 8], u32, u32),
    /// FSSTAT.
    Fsstat(&'a [u8]),
    /// FSINFO.
    Fsinfo(&'a [u8]),
    /// PATHCONF.
    Pathconf(&'a [u8]),
    /// COMMIT: file, offset, count.
    Commit(&'a [u8], u64, u32),
}

impl<'a> Args3<'a> {
    /// Decodes the arguments of procedure `proc_`; None for a procedure
    /// that does not exist (PROC_UNAVAIL). Bytes left over after the
    /// arguments are refused (GARBAGE_ARGS).
    pub fn decode(proc_: u32, d: &mut Decoder<'a>) -> Option<XdrResult<Self>> {
        use proc3::*;
        let r = (|| -> XdrResult<Self> {
            Ok(match proc_ {
                NULL => Args3::Null,
                GETATTR => Args3::Getattr(fh3(d)?),
                SETATTR => {
                    let fh = fh3(d)?;
                    let a = Sattr3::decode(d)?;
                    let guard = if d.bool()? {
                        Some(Time3::decode(d)?)
                    } else {
                        None
                    };
                    Args3::Setattr(fh, a, guard)
                }
                LOOKUP => Args3::Lookup(DirOp::decode(d)?),
                ACCESS => Args3::Access(fh3(d)?, d.u32()?),
                READLINK => Args3::Readlink(fh3(d)?),
                READ => Args3::Read(fh3(d)?, d.u64()?, d.u32()?),
                WRITE => {
                    let fh = fh3(d)?;
                    let offset = d.u64()?;
                    let count = d.u32()?;
                    let how = d.u32()?;
                    if how > stable::FILE_SYNC {
                        return Err(XdrError::BadValue(how));
                    }
                    let data = d.opaque(u32::MAX as usize)?;
                    if data.len() != count as usize {
                        // RFC 1813: count is the data's length.
                        return Err(XdrError::BadValue(count));
                    }
                    Args3::Write(fh, offset, how, data)
                }
                CREATE => {
                    let w = DirOp::decode(d)?;
                    let how = match d.u32()? {
                        0 => CreateHow3::Unchecked(Sattr3::decode(d)?),
                        1 => CreateHow3::Guarded(Sattr3::decode(d)?),
                        2 => CreateHow3::Exclusive(d.array::<8>()?),
                        v => return Err(XdrError::BadValue(v)),
                    };
                    Args3::Create(w, how)
                }
                MKDIR => Args3::Mkdir(DirOp::decode(d)?, Sattr3::decode(d)?),
                SYMLINK => {
                    let w = DirOp::decode(d)?;
                    let a = Sattr3::decode(d)?;
                    Args3::Symlink(w, a, d.opaque(MAX_PATH)?)
                }
                MKNOD => {
                    let w = DirOp::decode(d)?;
                    let t = d.u32()?;
                    let what = match t {
                        ftype3::CHR | ftype3::BLK => {
                            MknodData3::Device(t, Sattr3::decode(d)?, d.u32()?, d.u32()?)
                        }
                        ftype3::SOCK | ftype3::FIFO => MknodData3::Pipe(t, Sattr3::decode(d)?),
                        ftype3::REG | ftype3::DIR | ftype3::LNK => MknodData3::Other(t),
                        v => return Err(XdrError::BadValue(v)),
                    };
                    Args3::Mknod(w, what)
                }
                REMOVE => Args3::Remove(DirOp::decode(d)?),
                RMDIR => Args3::Rmdir(DirOp::decode(d)?),
                RENAME => Args3::Rename(DirOp::decode(d)?, DirOp::decode(d)?),
                LINK => Args3::Link(fh3(d)?, DirOp::decode(d)?),
                READDIR => Args3::Readdir(fh3(d)?, d.u64()?, d.array::<8>()?, d.u32()?),
                READDIRPLUS => {
                    Args3::Readdirplus(fh3(d)?, d.u64()?, d.array::<8>()?, d.u32()?, d.u32()?)
                }
                FSSTAT => Args3::Fsstat(fh3(d)?),
                FSINFO => Args3::Fsinfo(fh3(d)?),
                PATHCONF => Args3::Pathconf(fh3(d)?),
                COMMIT => Args3::Commit(fh3(d)?, d.u64()?, d.u32()?),
                _ => return Err(XdrError::BadValue(u32::MAX)),
            })
        })();
        if proc_ > proc3::COMMIT {
            return None;
        }
        Some(d.whole(r))
    }
}

/// A fattr3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fattr3 {
    /// ftype3.
    pub ftype: u32,
    /// Permission bits (and setuid, setgid, sticky).
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Bytes of disk used.
    pub used: u64,
    /// Device numbers of a device file.
    pub rdev: (u32, u32),
    /// File system id.
    pub fsid: u64,
    /// File id (inode number).
    pub fileid: u64,
    /// Access time.
    pub atime: Time3,
    /// Modify time.
    pub mtime: Time3,
    /// Change time.
    pub ctime: Time3,
}

impl Fattr3 {
    /// Writes the fattr3.
    pub fn encode(&self, e: &mut Encoder) {
        e.u32(self.ftype);
        e.u32(self.mode);
        e.u32(self.nlink);
        e.u32(self.uid);
        e.u32(self.gid);
        e.u64(self.size);
        e.u64(self.used);
        e.u32(self.rdev.0);
        e.u32(self.rdev.1);
        e.u64(self.fsid);
        e.u64(self.fileid);
        self.atime.encode(e);
        self.mtime.encode(e);
        self.ctime.encode(e);
    }

    /// The wcc_attr (size, mtime, ctime) of these attributes.
    pub fn wcc(&self) -> WccAttr {
        WccAttr {
            size: self.size,
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }
}

/// A wcc_attr: what a client compares before a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WccAttr {
    /// Size.
    pub size: u64,
    /// Modify time.
    pub mtime: Time3,
    /// Change time.
    pub ctime: Time3,
}

/// Writes a post_op_attr.
pub fn post_op_attr(e: &mut Encoder, a: Option<&Fattr3>) {
    match a {
        Some(a) => {
            e.bool(true);
            a.encode(e);
        }
        None => e.bool(false),
    }
}

/// Writes a wcc_data: the attributes before and after a change.
pub fn wcc_data(e: &mut Encoder, before: Option<&WccAttr>, after: Option<&Fattr3>) {
    match before {
        Some(b) => {
            e.bool(true);
            e.u64(b.size);
            b.mtime.encode(e);
            b.ctime.encode(e);
        }
        None => e.bool(false),
    }
    post_op_attr(e, after);
}

/// Writes a post_op_fh3.
pub fn post_op_fh(e: &mut Encoder, fh: Option<&[u8]>) {
    match fh {
        Some(fh) => {
            e.bool(true);
            e.opaque(fh);
        }
        None => e.bool(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sattr_none(e: &mut Encoder) {
        for _ in 0..4 {
            e.bool(false);
        }
        e.u32(0);
        e.u32(0);
    }

    #[test]
    fn decodes_write_and_refuses_a_wrong_count() {
        let mut e = Encoder::new();
        e.opaque(&[7; 20]);
        e.u64(4096);
        e.u32(3);
        e.u32(stable::FILE_SYNC);
        e.opaque(b"abc");
        let buf = e.into_inner();
        let a = Args3::decode(proc3::WRITE, &mut Decoder::new(&buf)).unwrap();
        assert_eq!(
            a.unwrap(),
            Args3::Write(&[7; 20], 4096, stable::FILE_SYNC, b"abc")
        );
        let mut bad = buf.clone();
        bad[24 + 8 + 3] = 4; // count 4, data 3
        assert!(Args3::decode(proc3::WRITE, &mut Decoder::new(&bad))
            .unwrap()
            .is_err());
    }

    #[test]
    fn decodes_create_modes_and_sattr() {
        let mut e = Encoder::new();
        e.opaque(&[1; 8]);
        e.opaque(b"f");
        e.u32(1);
        e.bool(true);
        e.u32(0o600);
        e.bool(false);
        e.bool(false);
        e.bool(true);
        e.u64(0);
        e.u32(2);
        e.u32(5);
        e.u32(6);
        e.u32(1);
        let buf = e.into_inner();
        let a = Args3::decode(proc3::CREATE, &mut Decoder::new(&buf))
            .unwrap()
            .unwrap();
        let Args3::Create(w, CreateHow3::Guarded(s)) = a else {
            panic!("{a:?}")
        };
        assert_eq!(w.name, b"f");
        assert_eq!(s.mode, Some(0o600));
        assert_eq!(s.size, Some(0));
        assert_eq!(s.atime, SetTime3::Client(Time3 { sec: 5, nsec: 6 }));
        assert_eq!(s.mtime, SetTime3::Server);
    }

    #[test]
    fn refuses_long_handles_trailing_bytes_and_unknown_procs() {
        let mut e = Encoder::new();
        e.opaque(&[0; 65]);
        let buf = e.into_inner();
        assert!(Args3::decode(proc3::GETATTR, &mut Decoder::new(&buf))
            .unwrap()
            .is_err());
        let mut e = Encoder::new();
        e.opaque(&[0; 8]);
        e.u32(0);
        let buf = e.into_inner();
        assert!(Args3::decode(proc3::GETATTR, &mut Decoder::new(&buf))
            .unwrap()
            .is_err());
        assert!(Args3::decode(22, &mut Decoder::new(&buf)).is_none());
        let mut e = Encoder::new();
        e.opaque(&[0; 8]);
        e.opaque(b"n");
        e.u32(ftype3::FIFO);
        sattr_none(&mut e);
        let buf = e.into_inner();
        assert!(matches!(
            Args3::decode(proc3::MKNOD, &mut Decoder::new(&buf)),
            Some(Ok(Args3::Mknod(_, MknodData3::Pipe(7, _))))
        ));
    }

    #[test]
    fn maps_v4_statuses() {
        use crate::nfs4::consts::status as v4;
        assert_eq!(Nfsstat3::from(v4::NOENT), status::NOENT);
        assert_eq!(Nfsstat3::from(v4::DELAY), status::JUKEBOX);
        assert_eq!(Nfsstat3::from(v4::SYMLINK), status::NOTDIR);
        assert_eq!(Nfsstat3::from(v4::STALE), status::STALE);
        assert_eq!(Nfsstat3::from(v4::BADHANDLE), status::BADHANDLE);
        assert_eq!(Nfsstat3::from(v4::OPENMODE), status::ACCES);
        assert_eq!(Nfsstat3::from(v4::EXPIRED), status::SERVERFAULT);
    }
}
