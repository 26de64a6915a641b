//! A small NFSv3 client (RFC 1813) on the project's own XDR code, for the
//! load generators: MOUNT v3 MNT for the root handle, then LOOKUP, CREATE,
//! GETATTR, FSINFO, READ, WRITE, COMMIT, READDIR, READDIRPLUS, RENAME and
//! REMOVE
//! over one TCP connection with
//! AUTH_SYS as root, many requests in flight. NFSv3 keeps no state: a
//! file is its handle, which any connection to the server can use.
//!
//! The arguments and results are written and read here field by field;
//! `sluice_proto::nfs3` only gives the numbers (procedures, statuses,
//! stable_how), since its messages are decoded the server's way.

use crate::client::{ClientError, Conn, Result};
use bytes::Bytes;
use sluice_proto::mount::{mntproc, mntstat, MNTPATHLEN, MOUNT_PROGRAM};
use sluice_proto::nfs3::{proc3, stable, FHSIZE, VERSION};
use sluice_proto::rpc;
use sluice_proto::xdr::{Decoder, Encoder};
use std::sync::Arc;

/// The MOUNT protocol's version 3.
const MOUNT_V3: u32 = 3;
/// Bytes of an fattr3 on the wire.
const FATTR3_BYTES: usize = 84;
/// Where the size is inside an fattr3 (after type, mode, nlink, uid, gid).
const FATTR3_SIZE_AT: usize = 20;
/// Bytes of a wcc_attr (size, mtime, ctime).
const WCC_ATTR_BYTES: usize = 24;

fn bad<T>(_: T) -> ClientError {
    ClientError::Malformed
}

/// How a WRITE asks for its data to be kept (stable_how).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stable {
    /// UNSTABLE: kept once a COMMIT says so.
    Unstable,
    /// DATA_SYNC: the data (and what is needed to read it back) on stable
    /// storage before the reply.
    DataSync,
    /// FILE_SYNC: the data and all of the file's metadata.
    FileSync,
}

impl Stable {
    fn wire(self) -> u32 {
        match self {
            Stable::Unstable => stable::UNSTABLE,
            Stable::DataSync => stable::DATA_SYNC,
            Stable::FileSync => stable::FILE_SYNC,
        }
    }
}

/// A file (or directory) of the server: its handle and its size when
/// it was looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File3 {
    /// The handle (nfs_fh3).
    pub fh: Vec<u8>,
    /// Size when looked up or created.
    pub size: u64,
}

/// What FSINFO says about transfer sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fsinfo {
    /// Largest READ the server takes.
    pub rtmax: u32,
    /// Its preferred READ size.
    pub rtpref: u32,
    /// Largest WRITE the server takes.
    pub wtmax: u32,
    /// Its preferred WRITE size.
    pub wtpref: u32,
}

/// What a WRITE reply says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Bytes written.
    pub count: u32,
    /// How they are kept (stable_how).
    pub committed: u32,
    /// The server's write verifier.
    pub verf: [u8; 8],
}

/// The MOUNT v3 MNT of `path` at `addr` (host:port) over a connection of
/// its own: the handle of that directory and the security flavors the
/// server accepts for it.
pub async fn mount(addr: &str, path: &str) -> Result<(Vec<u8>, Vec<u32>)> {
    let conn = Conn::connect(addr).await?;
    let mut a = Encoder::new();
    if path.len() > MNTPATHLEN {
        return Err(ClientError::Mount(mntstat::NAMETOOLONG));
    }
    a.string(path);
    let body = conn
        .call_proc(MOUNT_PROGRAM, MOUNT_V3, mntproc::MNT, a.as_slice())
        .await?;
    parse_mnt(&body)
}

/// A mountres3.
fn parse_mnt(body: &[u8]) -> Result<(Vec<u8>, Vec<u32>)> {
    let mut d = Decoder::new(body);
    let st = d.u32().map_err(bad)?;
    if st != mntstat::OK {
        return Err(ClientError::Mount(st));
    }
    let fh = d.opaque(FHSIZE).map_err(bad)?.to_vec();
    let n = d.count(64, 4).map_err(bad)?;
    let flavors = (0..n)
        .map(|_| d.u32().map_err(bad))
        .collect::<Result<Vec<u32>>>()?;
    Ok((fh, flavors))
}

/// Skips a post_op_attr, returning the size it carries, if any.
fn post_op_size(d: &mut Decoder<'_>) -> Result<Option<u64>> {
    if !d.bool().map_err(bad)? {
        return Ok(None);
    }
    let attrs = d.opaque_fixed(FATTR3_BYTES).map_err(bad)?;
    let size = Decoder::new(&attrs[FATTR3_SIZE_AT..]).u64().map_err(bad)?;
    Ok(Some(size))
}

/// Skips a wcc_data (pre_op_attr, post_op_attr).
fn skip_wcc(d: &mut Decoder<'_>) -> Result<()> {
    if d.bool().map_err(bad)? {
        d.skip(WCC_ATTR_BYTES).map_err(bad)?;
    }
    post_op_size(d)?;
    Ok(())
}

/// A diropargs3.
fn dirop(e: &mut Encoder, dir: &[u8], name: &str) {
    e.opaque(dir);
    e.string(name);
}

/// An NFSv3 client over one connection.
pub struct Client3 {
    conn: Arc<Conn>,
}

/// The results of a successful call: the body after its nfsstat3.
struct Res3 {
    body: Bytes,
    at: usize,
}

impl Res3 {
    fn decoder(&self) -> Decoder<'_> {
        Decoder::new(&self.body[self.at..])
    }
}

impl Client3 {
    /// Connects to the NFS server at `addr` (host:port).
    pub async fn connect(addr: &str) -> Result<Client3> {
        Ok(Client3 {
            conn: Conn::connect(addr).await?,
        })
    }

    /// Calls NFSv3 procedure `proc_`; an error unless its status is NFS3_OK.
    async fn call(&self, proc_: u32, args: &Encoder) -> Result<Res3> {
        let body = self
            .conn
            .call_proc(rpc::NFS_PROGRAM, VERSION, proc_, args.as_slice())
            .await?;
        let status = Decoder::new(&body).u32().map_err(bad)?;
        if status != 0 {
            return Err(ClientError::Status3 { proc_, status });
        }
        Ok(Res3 { body, at: 4 })
    }

    /// NULL: a round trip that does nothing.
    pub async fn null(&self) -> Result<()> {
        self.conn
            .call_proc(rpc::NFS_PROGRAM, VERSION, proc3::NULL, &[])
            .await?;
        Ok(())
    }

    /// FSINFO of the file system holding `fh`.
    pub async fn fsinfo(&self, fh: &[u8]) -> Result<Fsinfo> {
        let mut a = Encoder::new();
        a.opaque(fh);
        let r = self.call(proc3::FSINFO, &a).await?;
        let mut d = r.decoder();
        post_op_size(&mut d)?;
        let mut u = || d.u32().map_err(bad);
        let (rtmax, rtpref, _rtmult) = (u()?, u()?, u()?);
        let (wtmax, wtpref) = (u()?, u()?);
        Ok(Fsinfo {
            rtmax,
            rtpref,
            wtmax,
            wtpref,
        })
    }

    /// GETATTR: the file's size.
    pub async fn size(&self, fh: &[u8]) -> Result<u64> {
        let mut a = Encoder::new();
        a.opaque(fh);
        let r = self.call(proc3::GETATTR, &a).await?;
        let attrs = r
            .decoder()
            .opaque_fixed(FATTR3_BYTES)
            .map_err(bad)?
            .to_vec();
        Decoder::new(&attrs[FATTR3_SIZE_AT..]).u64().map_err(bad)
    }

    /// LOOKUP of `name` in directory `dir`: its handle, and its size when
    /// the server sent its attributes.
    pub async fn lookup(&self, dir: &[u8], name: &str) -> Result<(Vec<u8>, Option<u64>)> {
        let mut a = Encoder::new();
        dirop(&mut a, dir, name);
        let r = self.call(proc3::LOOKUP, &a).await?;
        let mut d = r.decoder();
        let fh = d.opaque(FHSIZE).map_err(bad)?.to_vec();
        let size = post_op_size(&mut d)?;
        Ok((fh, size))
    }

    /// CREATE UNCHECKED of `name` in `dir` with mode 0644 (an existing
    /// file is kept as it is): its handle (looked up when the reply has
    /// none) and size.
    pub async fn create(&self, dir: &[u8], name: &str) -> Result<(Vec<u8>, Option<u64>)> {
        let mut a = Encoder::new();
        dirop(&mut a, dir, name);
        a.u32(0); // UNCHECKED
                  // sattr3: mode 0644; uid, gid, size, atime, mtime unset.
        a.bool(true);
        a.u32(0o644);
        for _ in 0..3 {
            a.bool(false);
        }
        a.u32(0); // atime: DONT_CHANGE
        a.u32(0); // mtime: DONT_CHANGE
        let r = self.call(proc3::CREATE, &a).await?;
        let mut d = r.decoder();
        let fh = if d.bool().map_err(bad)? {
            Some(d.opaque(FHSIZE).map_err(bad)?.to_vec())
        } else {
            None
        };
        let size = post_op_size(&mut d)?;
        match fh {
            Some(fh) => Ok((fh, size)),
            None => self.lookup(dir, name).await,
        }
    }

    /// The file at `path` (slash-separated, below the directory `root`),
    /// made first if `create` and it does not exist.
    pub async fn open(&self, root: &[u8], path: &str, create: bool) -> Result<File3> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let (name, dirs) = parts.split_last().ok_or(ClientError::Malformed)?;
        let mut dir = root.to_vec();
        for d in dirs {
            dir = self.lookup(&dir, d).await?.0;
        }
        let (fh, size) = if create {
            self.create(&dir, name).await?
        } else {
            self.lookup(&dir, name).await?
        };
        let size = match size {
            Some(s) => s,
            None => self.size(&fh).await?,
        };
        Ok(File3 { fh, size })
    }

    async fn read_call(&self, f: &File3, offset: u64, count: u32) -> Result<Res3> {
        let mut a = Encoder::with_capacity(f.fh.len() + 16);
        a.opaque(&f.fh);
        a.u64(offset);
        a.u32(count);
        self.call(proc3::READ, &a).await
    }

    /// READ: (bytes received, eof).
    pub async fn read(&self, f: &File3, offset: u64, count: u32) -> Result<(u64, bool)> {
        let r = self.read_call(f, offset, count).await?;
        let (data, eof) = read_res(&mut r.decoder())?;
        Ok((data.len() as u64, eof))
    }

    /// READ returning the bytes themselves.
    pub async fn read_bytes(&self, f: &File3, offset: u64, count: u32) -> Result<Vec<u8>> {
        let r = self.read_call(f, offset, count).await?;
        let (data, _) = read_res(&mut r.decoder())?;
        Ok(data.to_vec())
    }

    /// WRITE of `data` at `offset`.
    pub async fn write(&self, f: &File3, offset: u64, data: &[u8], how: Stable) -> Result<Written> {
        let mut a = Encoder::with_capacity(f.fh.len() + data.len() + 32);
        a.opaque(&f.fh);
        a.u64(offset);
        a.u32(data.len() as u32);
        a.u32(how.wire());
        a.opaque(data);
        let r = self.call(proc3::WRITE, &a).await?;
        let mut d = r.decoder();
        skip_wcc(&mut d)?;
        Ok(Written {
            count: d.u32().map_err(bad)?,
            committed: d.u32().map_err(bad)?,
            verf: d.array().map_err(bad)?,
        })
    }

    /// COMMIT of the whole file: the server's write verifier.
    pub async fn commit(&self, f: &File3) -> Result<[u8; 8]> {
        let mut a = Encoder::with_capacity(f.fh.len() + 16);
        a.opaque(&f.fh);
        a.u64(0);
        a.u32(0);
        let r = self.call(proc3::COMMIT, &a).await?;
        let mut d = r.decoder();
        skip_wcc(&mut d)?;
        d.array().map_err(bad)
    }
}

/// One READDIRPLUS reply: how many entries it held, the cookie of the
/// last, the directory's cookie verifier, and whether it was the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirPage {
    /// Entries in this reply, not counting "." and "..".
    pub entries: u64,
    /// The cookie to go on from (the one it was asked from if none came).
    pub cookie: u64,
    /// The verifier to send with that cookie.
    pub verf: [u8; 8],
    /// No entries after these.
    pub eof: bool,
}

impl Client3 {
    /// READDIRPLUS of `dir` from `cookie` (0 and a zero verifier at the
    /// start), replies of at most `maxcount` bytes, as Linux clients
    /// before 5.18 ask: `dircount` an eighth of `maxcount` (5.18 and later
    /// send maxcount for both). Each entry must carry its attributes, as
    /// `ls -l` needs them.
    pub async fn readdirplus(
        &self,
        dir: &[u8],
        cookie: u64,
        verf: [u8; 8],
        maxcount: u32,
    ) -> Result<DirPage> {
        let mut a = Encoder::with_capacity(dir.len() + 32);
        a.opaque(dir);
        a.u64(cookie);
        a.opaque_fixed(&verf);
        a.u32(maxcount / 8);
        a.u32(maxcount);
        let r = self.call(proc3::READDIRPLUS, &a).await?;
        dir_page(&mut r.decoder(), cookie, true)
    }

    /// READDIR of `dir` from `cookie` (0 and a zero verifier at the
    /// start): names and file ids only, in replies of at most `count`
    /// bytes, as the Linux client lists when it needs no attributes.
    pub async fn readdir(
        &self,
        dir: &[u8],
        cookie: u64,
        verf: [u8; 8],
        count: u32,
    ) -> Result<DirPage> {
        let mut a = Encoder::with_capacity(dir.len() + 32);
        a.opaque(dir);
        a.u64(cookie);
        a.opaque_fixed(&verf);
        a.u32(count);
        let r = self.call(proc3::READDIR, &a).await?;
        dir_page(&mut r.decoder(), cookie, false)
    }

    /// RENAME of `from` to `to`, both in directory `dir`.
    pub async fn rename(&self, dir: &[u8], from: &str, to: &str) -> Result<()> {
        let mut a = Encoder::with_capacity(2 * dir.len() + from.len() + to.len() + 16);
        dirop(&mut a, dir, from);
        dirop(&mut a, dir, to);
        let r = self.call(proc3::RENAME, &a).await?;
        let mut d = r.decoder();
        skip_wcc(&mut d)?;
        skip_wcc(&mut d)
    }

    /// REMOVE of `name` in directory `dir`.
    pub async fn remove(&self, dir: &[u8], name: &str) -> Result<()> {
        let mut a = Encoder::with_capacity(dir.len() + name.len() + 8);
        dirop(&mut a, dir, name);
        let r = self.call(proc3::REMOVE, &a).await?;
        skip_wcc(&mut r.decoder())
    }
}

/// A READDIRPLUS3resok (`plus`) or READDIR3resok asked from `cookie`.
fn dir_page(d: &mut Decoder<'_>, cookie: u64, plus: bool) -> Result<DirPage> {
    post_op_size(d)?;
    let mut page = DirPage {
        entries: 0,
        cookie,
        verf: d.array().map_err(bad)?,
        eof: false,
    };
    while d.bool().map_err(bad)? {
        d.u64().map_err(bad)?; // fileid
        let name = d.opaque(usize::MAX).map_err(bad)?;
        page.cookie = d.u64().map_err(bad)?;
        if plus {
            if post_op_size(d)?.is_none() {
                // ls -l would have to ask for each entry's attributes.
                return Err(ClientError::Malformed);
            }
            if d.bool().map_err(bad)? {
                d.opaque(FHSIZE).map_err(bad)?;
            }
        }
        // "." and ".." (which NFSv3 servers list) are not the directory's
        // own entries.
        if name != b"." && name != b".." {
            page.entries += 1;
        }
    }
    page.eof = d.bool().map_err(bad)?;
    Ok(page)
}

/// A READ3resok: the data and eof. The count must match the data.
fn read_res<'a>(d: &mut Decoder<'a>) -> Result<(&'a [u8], bool)> {
    post_op_size(d)?;
    let count = d.u32().map_err(bad)?;
    let eof = d.bool().map_err(bad)?;
    let data = d.opaque(usize::MAX).map_err(bad)?;
    if data.len() != count as usize {
        return Err(ClientError::Malformed);
    }
    Ok((data, eof))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::mount::MOUNT_PROGRAM;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn fattr(e: &mut Encoder, size: u64) {
        e.u32(1); // NF3REG
        e.u32(0o644);
        e.u32(1);
        e.u32(0);
        e.u32(0);
        e.u64(size);
        e.u64(size);
        e.u64(0); // rdev
        e.u64(7); // fsid
        e.u64(42); // fileid
        for _ in 0..6 {
            e.u32(0);
        }
    }

    fn wcc(e: &mut Encoder, size: u64) {
        e.bool(true);
        e.u64(size);
        e.u64(0);
        e.u64(0);
        e.bool(true);
        fattr(e, size);
    }

    #[test]
    fn fattr3_size_is_where_post_op_size_reads_it() {
        let mut e = Encoder::new();
        e.bool(true);
        fattr(&mut e, 123_456_789_012);
        assert_eq!(e.len(), 4 + FATTR3_BYTES);
        e.bool(false);
        let b = e.into_inner();
        let mut d = Decoder::new(&b);
        assert_eq!(post_op_size(&mut d).unwrap(), Some(123_456_789_012));
        assert_eq!(post_op_size(&mut d).unwrap(), None);
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn mount_reply_with_handle_and_flavors() {
        let mut e = Encoder::new();
        e.u32(0);
        e.opaque(&[9; 28]);
        e.u32(2);
        e.u32(1);
        e.u32(0);
        assert_eq!(parse_mnt(e.as_slice()).unwrap(), (vec![9; 28], vec![1, 0]));
        let mut e = Encoder::new();
        e.u32(mntstat::NOENT);
        assert!(matches!(
            parse_mnt(e.as_slice()),
            Err(ClientError::Mount(mntstat::NOENT))
        ));
    }

    #[test]
    fn read_reply_count_must_match_its_data() {
        let mut e = Encoder::new();
        e.bool(false);
        e.u32(5);
        e.bool(true);
        e.opaque(b"hello");
        let b = e.into_inner();
        let (data, eof) = read_res(&mut Decoder::new(&b)).unwrap();
        assert_eq!((data, eof), (&b"hello"[..], true));
        let mut e = Encoder::new();
        e.bool(false);
        e.u32(6);
        e.bool(false);
        e.opaque(b"hello");
        let b = e.into_inner();
        assert!(read_res(&mut Decoder::new(&b)).is_err());
    }

    /// A tiny in-memory NFSv3 server: one directory (the mount's root,
    /// handle "root") holding files by name, handle "f:NAME".
    #[derive(Default)]
    struct Fake {
        files: Mutex<HashMap<String, Vec<u8>>>,
        calls: Mutex<Vec<(u32, u32, u32)>>,
    }

    impl Fake {
        fn answer(&self, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Encoder {
            self.calls.lock().unwrap().push((prog, vers, proc_));
            let mut d = Decoder::new(args);
            let mut e = Encoder::new();
            let mut files = self.files.lock().unwrap();
            let name_of = |fh: &[u8]| String::from_utf8(fh[2..].to_vec()).unwrap();
            match (prog, proc_) {
                (MOUNT_PROGRAM, mntproc::MNT) => {
                    assert_eq!(d.opaque(1024).unwrap(), b"/export");
                    e.u32(0);
                    e.opaque(b"root");
                    e.u32(1);
                    e.u32(rpc::AUTH_SYS);
                }
                (_, proc3::LOOKUP) | (_, proc3::CREATE) => {
                    assert_eq!(d.opaque(64).unwrap(), b"root");
                    let name = String::from_utf8(d.opaque(255).unwrap().to_vec()).unwrap();
                    if proc_ == proc3::CREATE {
                        assert_eq!(d.u32().unwrap(), 0, "UNCHECKED");
                        files.entry(name.clone()).or_default();
                    }
                    match files.get(&name) {
                        None => {
                            e.u32(2); // NOENT
                            e.bool(false);
                        }
                        Some(data) if proc_ == proc3::LOOKUP => {
                            e.u32(0);
                            e.opaque(format!("f:{name}").as_bytes());
                            e.bool(true);
                            fattr(&mut e, data.len() as u64);
                            e.bool(false);
                        }
                        Some(_) => {
                            // CREATE without the handle: the client looks it up.
                            e.u32(0);
                            e.bool(false);
                            e.bool(false);
                            wcc(&mut e, 0);
                        }
                    }
                }
                (_, proc3::READ) => {
                    let data = &files[&name_of(d.opaque(64).unwrap())];
                    let off = d.u64().unwrap() as usize;
                    let count = d.u32().unwrap() as usize;
                    let part = &data[off.min(data.len())..(off + count).min(data.len())];
                    e.u32(0);
                    e.bool(true);
                    fattr(&mut e, data.len() as u64);
                    e.u32(part.len() as u32);
                    e.bool(off + count >= data.len());
                    e.opaque(part);
                }
                (_, proc3::WRITE) => {
                    let name = name_of(d.opaque(64).unwrap());
                    let off = d.u64().unwrap() as usize;
                    let count = d.u32().unwrap();
                    let how = d.u32().unwrap();
                    let data = d.opaque(usize::MAX).unwrap();
                    assert_eq!(data.len(), count as usize);
                    let f = files.get_mut(&name).unwrap();
                    if f.len() < off + data.len() {
                        f.resize(off + data.len(), 0);
                    }
                    f[off..off + data.len()].copy_from_slice(data);
                    e.u32(0);
                    wcc(&mut e, f.len() as u64);
                    e.u32(count);
                    e.u32(how);
                    e.opaque_fixed(b"verifier");
                }
                (_, proc3::COMMIT) => {
                    e.u32(0);
                    wcc(&mut e, 0);
                    e.opaque_fixed(b"verifier");
                }
                (_, proc3::READDIRPLUS) => {
                    // Two entries per reply, cookie i + 1 for the i-th name.
                    assert_eq!(d.opaque(64).unwrap(), b"root");
                    let from = d.u64().unwrap() as usize;
                    d.array::<8>().unwrap();
                    let (dircount, maxcount) = (d.u32().unwrap(), d.u32().unwrap());
                    assert_eq!(dircount, maxcount / 8);
                    let dot = ".".to_string();
                    let mut names: Vec<&String> = files.keys().chain([&dot]).collect();
                    names.sort();
                    e.u32(0);
                    e.bool(false);
                    e.opaque_fixed(b"dirverf!");
                    for (i, n) in names.iter().enumerate().skip(from).take(2) {
                        e.bool(true);
                        e.u64(i as u64 + 100);
                        e.string(n);
                        e.u64(i as u64 + 1);
                        e.bool(true);
                        fattr(&mut e, files.get(*n).map_or(0, |f| f.len()) as u64);
                        e.bool(true);
                        e.opaque(format!("f:{n}").as_bytes());
                    }
                    e.bool(false);
                    e.bool(from + 2 >= names.len());
                }
                (_, proc3::RENAME) | (_, proc3::REMOVE) => {
                    assert_eq!(d.opaque(64).unwrap(), b"root");
                    let name = String::from_utf8(d.opaque(255).unwrap().to_vec()).unwrap();
                    match files.remove(&name) {
                        None => e.u32(2), // NOENT
                        Some(data) => {
                            e.u32(0);
                            if proc_ == proc3::RENAME {
                                assert_eq!(d.opaque(64).unwrap(), b"root");
                                let to = String::from_utf8(d.opaque(255).unwrap().to_vec());
                                files.insert(to.unwrap(), data);
                                wcc(&mut e, 0);
                            }
                        }
                    }
                    wcc(&mut e, 0);
                }
                _ => {
                    e.u32(10004); // NOTSUPP
                }
            }
            e
        }
    }

    async fn serve(fake: Arc<Fake>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let fake = fake.clone();
                tokio::spawn(async move {
                    let mut mark = [0u8; 4];
                    while s.read_exact(&mut mark).await.is_ok() {
                        let h = rpc::FragmentHeader::parse(mark);
                        let mut rec = vec![0u8; h.len];
                        s.read_exact(&mut rec).await.unwrap();
                        let c = rpc::parse_call(&rec).unwrap();
                        let res = fake.answer(c.prog, c.vers, c.proc_, &rec[c.args_at..]);
                        let mut r = rpc::accepted_reply(c.xid, rpc::AcceptStat::Success);
                        r.raw(res.as_slice());
                        let r = r.into_inner();
                        s.write_all(&rpc::record_mark(r.len())).await.unwrap();
                        s.write_all(&r).await.unwrap();
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn mount_create_write_commit_read_against_a_fake_server() {
        let fake = Arc::new(Fake::default());
        fake.files
            .lock()
            .unwrap()
            .insert("old".into(), b"0123456789".to_vec());
        let addr = serve(fake.clone()).await;
        let (root, flavors) = mount(&addr, "/export").await.unwrap();
        assert_eq!(
            (root.as_slice(), flavors),
            (&b"root"[..], vec![rpc::AUTH_SYS])
        );
        let c = Client3::connect(&addr).await.unwrap();

        let old = c.open(&root, "/old", false).await.unwrap();
        assert_eq!(old.size, 10);
        assert_eq!(c.read(&old, 4, 100).await.unwrap(), (6, true));
        assert_eq!(c.read_bytes(&old, 2, 3).await.unwrap(), b"234");

        let missing = c.open(&root, "new", false).await;
        assert!(matches!(
            missing,
            Err(ClientError::Status3 {
                proc_: proc3::LOOKUP,
                status: 2
            })
        ));
        let new = c.open(&root, "new", true).await.unwrap();
        assert_eq!(
            new,
            File3 {
                fh: b"f:new".to_vec(),
                size: 0
            }
        );
        let w = c.write(&new, 3, b"abc", Stable::Unstable).await.unwrap();
        assert_eq!(
            w,
            Written {
                count: 3,
                committed: 0,
                verf: *b"verifier"
            }
        );
        let w = c.write(&new, 0, b"xyz", Stable::FileSync).await.unwrap();
        assert_eq!(w.committed, stable::FILE_SYNC);
        assert_eq!(c.commit(&new).await.unwrap(), *b"verifier");
        assert_eq!(c.read_bytes(&new, 0, 100).await.unwrap(), b"xyzabc");
        assert!(matches!(
            c.fsinfo(&root).await,
            Err(ClientError::Status3 { status: 10004, .. })
        ));

        let calls = fake.calls.lock().unwrap().clone();
        assert_eq!(calls[0], (MOUNT_PROGRAM, MOUNT_V3, mntproc::MNT));
        assert!(calls[1..]
            .iter()
            .all(|&(p, v, _)| (p, v) == (rpc::NFS_PROGRAM, 3)));
        // CREATE sent no handle back: one LOOKUP after it.
        let procs: Vec<u32> = calls[1..].iter().map(|c| c.2).collect();
        assert_eq!(
            procs,
            [
                proc3::LOOKUP,
                proc3::READ,
                proc3::READ,
                proc3::LOOKUP,
                proc3::CREATE,
                proc3::LOOKUP,
                proc3::WRITE,
                proc3::WRITE,
                proc3::COMMIT,
                proc3::READ,
                proc3::FSINFO
            ]
        );
    }

    /// Every READDIRPLUS page of the fake's root, from the start.
    async fn list(c: &Client3) -> Vec<DirPage> {
        let (mut cookie, mut verf, mut pages) = (0, [0u8; 8], Vec::new());
        loop {
            let p = c.readdirplus(b"root", cookie, verf, 4096).await.unwrap();
            pages.push(p);
            (cookie, verf) = (p.cookie, p.verf);
            if p.eof {
                return pages;
            }
        }
    }

    #[tokio::test]
    async fn readdirplus_pages_rename_and_remove_against_a_fake_server() {
        let fake = Arc::new(Fake::default());
        for n in ["a", "b", "c"] {
            fake.files.lock().unwrap().insert(n.into(), vec![1; 3]);
        }
        let addr = serve(fake.clone()).await;
        let c = Client3::connect(&addr).await.unwrap();
        let pages = list(&c).await;
        assert_eq!(
            pages,
            [
                // "." is listed, not counted.
                DirPage {
                    entries: 1,
                    cookie: 2,
                    verf: *b"dirverf!",
                    eof: false
                },
                DirPage {
                    entries: 2,
                    cookie: 4,
                    verf: *b"dirverf!",
                    eof: true
                }
            ]
        );
        c.rename(b"root", "a", "z").await.unwrap();
        c.remove(b"root", "b").await.unwrap();
        assert!(matches!(
            c.remove(b"root", "b").await,
            Err(ClientError::Status3 {
                proc_: proc3::REMOVE,
                status: 2
            })
        ));
        let mut names: Vec<String> = fake.files.lock().unwrap().keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["c", "z"]);
        let pages = list(&c).await;
        assert_eq!(pages.iter().map(|p| p.entries).sum::<u64>(), 2);
    }

    #[test]
    fn a_readdirplus_entry_without_attributes_is_refused() {
        let mut e = Encoder::new();
        e.bool(false);
        e.opaque_fixed(&[0; 8]);
        e.bool(true);
        e.u64(5);
        e.string("x");
        e.u64(9);
        e.bool(false); // no attributes
        e.bool(false);
        e.bool(false);
        e.bool(true);
        let b = e.into_inner();
        assert!(matches!(
            dir_page(&mut Decoder::new(&b), 0, true),
            Err(ClientError::Malformed)
        ));
    }
}
