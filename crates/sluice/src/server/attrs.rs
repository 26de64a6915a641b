//! File attributes (fattr4): which ones are supported, how each is encoded,
//! and decoding of the settable ones.

use crate::engine::fs::{FsStat, SetTime, Stat, Time};
use crate::nfs4::consts::{attr, ftype, status};
use crate::nfs4::msg::Fattr4;
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder};

/// Largest READ and WRITE payload.
pub const MAX_IO: u32 = 1024 * 1024;

/// The bitmap of the attributes in `list` (made at compile time: an
/// encoder that built it per call spent most of its time here).
const fn bits(list: &[u32]) -> [u32; 3] {
    let mut w = [0u32; 3];
    let mut i = 0;
    while i < list.len() {
        let b = list[i];
        w[(b / 32) as usize] |= 1 << (b % 32);
        i += 1;
    }
    w
}

/// The attributes this server supports.
pub fn supported() -> [u32; 3] {
    SUPPORTED
}

const SUPPORTED: [u32; 3] = {
    use attr::*;
    bits(&[
        SUPPORTED_ATTRS,
        TYPE,
        FH_EXPIRE_TYPE,
        CHANGE,
        SIZE,
        LINK_SUPPORT,
        SYMLINK_SUPPORT,
        NAMED_ATTR,
        FSID,
        UNIQUE_HANDLES,
        LEASE_TIME,
        RDATTR_ERROR,
        CANSETTIME,
        CASE_INSENSITIVE,
        CASE_PRESERVING,
        CHOWN_RESTRICTED,
        FILEHANDLE,
        FILEID,
        FILES_AVAIL,
        FILES_FREE,
        FILES_TOTAL,
        HOMOGENEOUS,
        MAXFILESIZE,
        MAXLINK,
        MAXNAME,
        MAXREAD,
        MAXWRITE,
        MODE,
        NO_TRUNC,
        NUMLINKS,
        OWNER,
        OWNER_GROUP,
        RAWDEV,
        SPACE_AVAIL,
        SPACE_FREE,
        SPACE_TOTAL,
        SPACE_USED,
        TIME_ACCESS,
        TIME_ACCESS_SET,
        TIME_DELTA,
        TIME_METADATA,
        TIME_MODIFY,
        TIME_MODIFY_SET,
        MOUNTED_ON_FILEID,
        SUPPATTR_EXCLCREAT,
        CLONE_BLKSIZE,
        XATTR_SUPPORT,
    ])
};

/// The attributes this server supports in minor version `minor`:
/// xattr_support is an NFSv4.2 extension (RFC 8276), not in 4.1.
pub fn supported_in(minor: u32) -> [u32; 3] {
    let mut sup = supported();
    if minor < 2 {
        sup[(attr::XATTR_SUPPORT / 32) as usize] &= !(1 << (attr::XATTR_SUPPORT % 32));
    }
    sup
}

/// Attributes that can be set with SETATTR.
pub fn writable() -> [u32; 3] {
    use attr::*;
    const W: [u32; 3] = bits(&[
        SIZE,
        MODE,
        OWNER,
        OWNER_GROUP,
        TIME_ACCESS_SET,
        TIME_MODIFY_SET,
    ]);
    W
}

/// Attributes that EXCLUSIVE4_1 create sets along with the verifier.
pub fn exclcreat() -> [u32; 3] {
    use attr::*;
    const E: [u32; 3] = bits(&[SIZE, MODE, OWNER, OWNER_GROUP]);
    E
}

/// True when bit `n` is set in `bm`.
pub fn has(bm: &[u32], n: u32) -> bool {
    bm.get((n / 32) as usize)
        .is_some_and(|w| w & (1 << (n % 32)) != 0)
}

/// Whether `bm` asks for nothing but attributes among `allowed`.
pub fn only(bm: &[u32], allowed: &[u32]) -> bool {
    bm.iter()
        .enumerate()
        .all(|(i, &w)| (0..32).all(|b| w & (1 << b) == 0 || allowed.contains(&(i as u32 * 32 + b))))
}

fn set_bit(bm: &mut [u32; 3], n: u32) {
    bm[(n / 32) as usize] |= 1 << (n % 32);
}

/// True when any of the file-system-wide space counters is requested.
pub fn wants_fs_stat(bm: &[u32]) -> bool {
    use attr::*;
    [
        FILES_AVAIL,
        FILES_FREE,
        FILES_TOTAL,
        SPACE_AVAIL,
        SPACE_FREE,
        SPACE_TOTAL,
        CLONE_BLKSIZE,
    ]
    .iter()
    .any(|&b| has(bm, b))
}

/// Everything needed to encode the attributes of one object.
#[derive(Debug)]
pub struct AttrSource<'a> {
    /// The object's status.
    pub st: &'a Stat,
    /// Its wire handle, when FILEHANDLE is wanted.
    pub fh: Option<&'a [u8]>,
    /// Space counters, when wanted.
    pub fs: Option<FsStat>,
    /// File system id (major, minor) of the export.
    pub fsid: (u64, u64),
    /// The fileid of the directory this file system root is mounted on
    /// in the pseudo file system, for export roots listed there.
    pub mounted_on: Option<u64>,
    /// Lease time in seconds.
    pub lease_secs: u32,
    /// Largest READ payload of the export.
    pub max_read: u32,
    /// Largest WRITE payload of the export.
    pub max_write: u32,
    /// The COMPOUND's minor version: NFSv4.2 attributes only in 2.
    pub minor: u32,
}

/// NFS file type of a mode.
pub fn nfs_type(mode: u32) -> u32 {
    match mode & libc::S_IFMT {
        libc::S_IFREG => ftype::REG,
        libc::S_IFDIR => ftype::DIR,
        libc::S_IFBLK => ftype::BLK,
        libc::S_IFCHR => ftype::CHR,
        libc::S_IFLNK => ftype::LNK,
        libc::S_IFSOCK => ftype::SOCK,
        libc::S_IFIFO => ftype::FIFO,
        _ => ftype::REG,
    }
}

fn time(e: &mut Encoder, t: Time) {
    e.i64(t.sec);
    e.u32(t.nsec);
}

/// Encodes the requested and supported attributes as a fattr4.
pub fn encode_fattr(e: &mut Encoder, req: &[u32], src: &AttrSource<'_>) {
    let sup = supported_in(src.minor);
    let mut out = [0u32; 3];
    let mut v = Encoder::with_capacity(256);
    let st = src.st;
    let fs = src.fs.unwrap_or_default();
    // Only the bits asked for and supported, in order (a READDIR encodes
    // this for every entry).
    let wanted = (0..3).flat_map(|i| {
        let mut w = req.get(i).copied().unwrap_or(0) & sup[i];
        std::iter::from_fn(move || {
            (w != 0).then(|| {
                let b = w.trailing_zeros();
                w &= w - 1;
                i as u32 * 32 + b
            })
        })
    });
    for n in wanted {
        match n {
            attr::SUPPORTED_ATTRS => v.bitmap(&sup),
            attr::TYPE => v.u32(nfs_type(st.mode)),
            attr::FH_EXPIRE_TYPE => v.u32(0), // FH4_PERSISTENT
            attr::CHANGE => v.u64(st.change()),
            attr::SIZE => v.u64(st.size),
            attr::LINK_SUPPORT
            | attr::SYMLINK_SUPPORT
            | attr::UNIQUE_HANDLES
            | attr::CANSETTIME => v.bool(true),
            attr::NAMED_ATTR | attr::CASE_INSENSITIVE => v.bool(false),
            attr::CASE_PRESERVING | attr::CHOWN_RESTRICTED | attr::HOMOGENEOUS | attr::NO_TRUNC => {
                v.bool(true)
            }
            attr::FSID => {
                v.u64(src.fsid.0);
                v.u64(src.fsid.1);
            }
            attr::LEASE_TIME => v.u32(src.lease_secs),
            attr::RDATTR_ERROR => v.status(status::OK),
            attr::FILEHANDLE => match src.fh {
                Some(fh) => v.opaque(fh),
                None => continue,
            },
            attr::FILEID => v.u64(st.ino),
            attr::MOUNTED_ON_FILEID => v.u64(src.mounted_on.unwrap_or(st.ino)),
            attr::FILES_AVAIL => v.u64(fs.files_avail),
            attr::FILES_FREE => v.u64(fs.files_free),
            attr::FILES_TOTAL => v.u64(fs.files_total),
            attr::MAXFILESIZE => v.u64(i64::MAX as u64),
            attr::MAXLINK => v.u32(65000),
            attr::MAXNAME => v.u32(255),
            attr::MAXREAD => v.u64(src.max_read as u64),
            attr::MAXWRITE => v.u64(src.max_write as u64),
            attr::MODE => v.u32(st.mode & 0o7777),
            attr::NUMLINKS => v.u32(st.nlink.min(u32::MAX as u64) as u32),
            attr::OWNER => v.opaque(decimal(st.uid, &mut [0; 10])),
            attr::OWNER_GROUP => v.opaque(decimal(st.gid, &mut [0; 10])),
            attr::RAWDEV => {
                v.u32(libc::major(st.rdev));
                v.u32(libc::minor(st.rdev));
            }
            attr::SPACE_AVAIL => v.u64(fs.bytes_avail),
            attr::SPACE_FREE => v.u64(fs.bytes_free),
            attr::SPACE_TOTAL => v.u64(fs.bytes_total),
            attr::CLONE_BLKSIZE => v.u32(fs.block_size),
            attr::SPACE_USED => v.u64(st.blocks.saturating_mul(512)),
            attr::TIME_ACCESS => time(&mut v, st.atime),
            attr::TIME_DELTA => time(&mut v, Time { sec: 0, nsec: 1 }),
            attr::TIME_METADATA => time(&mut v, st.ctime),
            attr::TIME_MODIFY => time(&mut v, st.mtime),
            attr::SUPPATTR_EXCLCREAT => v.bitmap(&exclcreat()),
            // User extended attributes on regular files and directories.
            attr::XATTR_SUPPORT => v.bool(st.is_file() || st.is_dir()),
            // Write-only attributes are never returned.
            attr::TIME_ACCESS_SET | attr::TIME_MODIFY_SET => continue,
            _ => continue,
        }
        set_bit(&mut out, n);
    }
    e.bitmap(&out);
    e.opaque(v.as_slice());
}

/// `n` in decimal, written into the end of `buf`.
fn decimal(n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let (mut n, mut at) = (n, buf.len());
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Encodes a fattr4 holding only rdattr_error (for READDIR entries whose
/// attributes cannot be read).
pub fn encode_rdattr_error(e: &mut Encoder, err: u32) {
    let mut bm = [0u32; 3];
    set_bit(&mut bm, attr::RDATTR_ERROR);
    e.bitmap(&bm);
    e.u32(4);
    e.u32(err);
}

/// Attributes a client asked to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAttrs {
    /// New size.
    pub size: Option<u64>,
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: SetTime,
    /// New modification time.
    pub mtime: SetTime,
    /// The bitmap as sent.
    pub mask: [u32; 3],
}

impl Default for SetAttrs {
    fn default() -> Self {
        SetAttrs {
            size: None,
            mode: None,
            uid: None,
            gid: None,
            atime: SetTime::Keep,
            mtime: SetTime::Keep,
            mask: [0; 3],
        }
    }
}

fn parse_id(s: &[u8]) -> Result<u32, Nfsstat4> {
    let s = std::str::from_utf8(s).map_err(|_| status::BADOWNER)?;
    // Numeric ids, optionally written as "id@domain".
    let s = s.split('@').next().unwrap_or(s);
    s.parse::<u32>().map_err(|_| status::BADOWNER)
}

fn settime(d: &mut Decoder<'_>) -> Result<SetTime, Nfsstat4> {
    match d.u32().map_err(|_| status::BADXDR)? {
        0 => Ok(SetTime::Now), // SET_TO_SERVER_TIME4
        1 => {
            let sec = d.i64().map_err(|_| status::BADXDR)?;
            let nsec = d.u32().map_err(|_| status::BADXDR)?;
            if nsec >= 1_000_000_000 {
                return Err(status::INVAL);
            }
            Ok(SetTime::At(Time { sec, nsec }))
        }
        _ => Err(status::BADXDR),
    }
}

/// The attributes to set that a fattr4 carries (SETATTR, OPEN, CREATE).
pub fn settable(f: &Fattr4) -> Result<SetAttrs, Nfsstat4> {
    let bm = &f.mask.0;
    let sup = supported();
    let wr = writable();
    let mut out = SetAttrs::default();
    let mut v = Decoder::new(&f.vals);
    for n in 0..(bm.len() as u32 * 32) {
        if !has(bm, n) {
            continue;
        }
        if !has(&wr, n) {
            return Err(if has(&sup, n) {
                status::INVAL
            } else {
                status::ATTRNOTSUPP
            });
        }
        set_bit(&mut out.mask, n);
        let bad = |_| status::BADXDR;
        match n {
            attr::SIZE => out.size = Some(v.u64().map_err(bad)?),
            attr::MODE => out.mode = Some(v.u32().map_err(bad)? & 0o7777),
            attr::OWNER => out.uid = Some(parse_id(v.opaque(1024).map_err(bad)?)?),
            attr::OWNER_GROUP => out.gid = Some(parse_id(v.opaque(1024).map_err(bad)?)?),
            attr::TIME_ACCESS_SET => out.atime = settime(&mut v)?,
            attr::TIME_MODIFY_SET => out.mtime = settime(&mut v)?,
            _ => return Err(status::ATTRNOTSUPP),
        }
    }
    if v.remaining() != 0 {
        return Err(status::BADXDR);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs4::msg::Bitmap4;

    /// A 77-byte regular file, mode 0640, inode 12.
    fn regular_file() -> Stat {
        Stat {
            mode: libc::S_IFREG | 0o640,
            size: 77,
            ino: 12,
            nlink: 1,
            ..Default::default()
        }
    }

    /// Attributes of `st` as a test export answers them.
    fn source<'a>(st: &'a Stat, fh: Option<&'a [u8]>, minor: u32) -> AttrSource<'a> {
        AttrSource {
            st,
            fh,
            fs: None,
            fsid: (3, 0),
            mounted_on: None,
            lease_secs: 90,
            max_read: MAX_IO,
            max_write: MAX_IO,
            minor,
        }
    }

    fn fattr(bm: &[u32], vals: &[u8]) -> Fattr4 {
        Fattr4 {
            mask: Bitmap4::trimmed(bm),
            vals: vals.to_vec(),
        }
    }

    #[test]
    fn decodes_settable_attributes() {
        let mut v = Encoder::new();
        v.u64(4096); // size
        v.u32(0o100644); // mode
        v.string("1000"); // owner
        v.string("100@example.org"); // group
        v.u32(0); // atime: server time
        v.u32(1); // mtime: client time
        v.i64(1_000_000);
        v.u32(5);
        let mut bm = [0u32; 3];
        for b in [
            attr::SIZE,
            attr::MODE,
            attr::OWNER,
            attr::OWNER_GROUP,
            attr::TIME_ACCESS_SET,
            attr::TIME_MODIFY_SET,
        ] {
            set_bit(&mut bm, b);
        }
        let buf = fattr(&bm, v.as_slice());
        let s = settable(&buf).unwrap();
        assert_eq!(s.size, Some(4096));
        assert_eq!(s.mode, Some(0o644));
        assert_eq!((s.uid, s.gid), (Some(1000), Some(100)));
        assert_eq!(s.atime, SetTime::Now);
        assert_eq!(
            s.mtime,
            SetTime::At(Time {
                sec: 1_000_000,
                nsec: 5
            })
        );
    }

    #[test]
    fn rejects_bad_settable_attributes() {
        let mut bm = [0u32; 3];
        set_bit(&mut bm, attr::TYPE);
        assert_eq!(settable(&fattr(&bm, &[0, 0, 0, 1])), Err(status::INVAL));
        let mut bm = [0u32; 3];
        set_bit(&mut bm, 12); // acl: not supported
        assert_eq!(settable(&fattr(&bm, &[])), Err(status::ATTRNOTSUPP));
        let mut bm = [0u32; 3];
        set_bit(&mut bm, attr::SIZE);
        assert_eq!(settable(&fattr(&bm, &[0, 0, 0, 1])), Err(status::BADXDR));
        let mut bm = [0u32; 3];
        set_bit(&mut bm, attr::OWNER);
        let mut v = Encoder::new();
        v.string("alice");
        assert_eq!(settable(&fattr(&bm, v.as_slice())), Err(status::BADOWNER));
    }

    #[test]
    fn encodes_requested_attributes_in_order() {
        let st = regular_file();
        let src = source(&st, None, 2);
        let mut req = [0u32; 3];
        for b in [attr::SIZE, attr::TYPE, attr::MODE, attr::FILEHANDLE] {
            set_bit(&mut req, b);
        }
        let mut e = Encoder::new();
        encode_fattr(&mut e, &req, &src);
        let mut d = Decoder::new(e.as_slice());
        let bm = d.bitmap(3).unwrap();
        assert!(has(&bm, attr::TYPE) && has(&bm, attr::SIZE) && has(&bm, attr::MODE));
        assert!(!has(&bm, attr::FILEHANDLE), "no handle was given");
        let vals = d.opaque(1000).unwrap();
        let mut v = Decoder::new(vals);
        assert_eq!(v.u32().unwrap(), ftype::REG);
        assert_eq!(v.u64().unwrap(), 77);
        assert_eq!(v.u32().unwrap(), 0o640);
        assert_eq!(v.remaining(), 0);
    }

    /// Owners go out as decimal strings; attributes of all three bitmap
    /// words come in order, and only the supported ones.
    #[test]
    fn encodes_owners_and_later_words() {
        for n in [0u32, 7, 10, 99, 1000, 65534, u32::MAX] {
            assert_eq!(decimal(n, &mut [0; 10]), n.to_string().as_bytes());
        }
        let st = Stat {
            mode: libc::S_IFDIR | 0o755,
            uid: 1000,
            gid: 4_000_000_000,
            ..Default::default()
        };
        let src = source(&st, None, 2);
        let mut req = [0u32; 3];
        for b in [
            attr::XATTR_SUPPORT,
            attr::OWNER_GROUP,
            attr::OWNER,
            attr::TYPE,
        ] {
            set_bit(&mut req, b);
        }
        // Not supported: asked for, never answered.
        req[2] |= 1 << 31;
        let mut e = Encoder::new();
        encode_fattr(&mut e, &req, &src);
        let mut d = Decoder::new(e.as_slice());
        let mut want = req;
        want[2] &= !(1 << 31);
        assert_eq!(d.bitmap(3).unwrap(), want.to_vec());
        let vals = d.opaque(1000).unwrap();
        let mut v = Decoder::new(vals);
        assert_eq!(v.u32().unwrap(), ftype::DIR);
        assert_eq!(v.opaque(10).unwrap(), b"1000");
        assert_eq!(v.opaque(10).unwrap(), b"4000000000");
        assert!(v.bool().unwrap(), "xattr_support");
        assert_eq!(v.remaining(), 0);
    }

    /// Every supported attribute is answered on its own and with all the
    /// others: the bitmap says exactly what the values hold, and
    /// write-only times and a missing handle are left out of both.
    #[test]
    fn every_supported_attribute_is_encoded_and_the_bitmap_matches_the_values() {
        let st = regular_file();
        let fh = [7u8; 30];
        for minor in 0..=2 {
            for handle in [None, Some(&fh[..])] {
                let src = source(&st, handle, minor);
                let sup = supported_in(minor);
                let returned = |n: u32| {
                    n != attr::TIME_ACCESS_SET
                        && n != attr::TIME_MODIFY_SET
                        && (n != attr::FILEHANDLE || handle.is_some())
                };
                let mut total = 0;
                let mut all = [0u32; 3];
                for n in (0..96).filter(|&n| has(&sup, n)) {
                    let mut req = [0u32; 3];
                    set_bit(&mut req, n);
                    let mut e = Encoder::new();
                    encode_fattr(&mut e, &req, &src);
                    let mut d = Decoder::new(e.as_slice());
                    let bm = d.bitmap(3).unwrap();
                    let vals = d.opaque(1000).unwrap();
                    assert_eq!(d.remaining(), 0);
                    if returned(n) {
                        assert_eq!(Bitmap4::trimmed(&req).0, bm, "minor {minor} attribute {n}");
                        assert!(
                            !vals.is_empty() && vals.len().is_multiple_of(4),
                            "attribute {n}: {vals:?}"
                        );
                        set_bit(&mut all, n);
                    } else {
                        assert!(
                            bm.iter().all(|&w| w == 0) && vals.is_empty(),
                            "attribute {n}"
                        );
                    }
                    total += vals.len();
                }
                let mut e = Encoder::new();
                encode_fattr(&mut e, &sup, &src);
                let mut d = Decoder::new(e.as_slice());
                assert_eq!(d.bitmap(3).unwrap(), Bitmap4::trimmed(&all).0);
                assert_eq!(d.opaque(100_000).unwrap().len(), total);
            }
        }
    }
}
