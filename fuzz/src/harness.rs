//! A [`Server`] over a scratch export with a live session, fed one fuzz
//! input at a time.
//!
//! The export is a fresh directory (on `/dev/shm` when there is one, so
//! COMMIT and FILE_SYNC writes cost no disk I/O) holding a few fixture
//! files. The harness's own client has done EXCHANGE_ID, CREATE_SESSION and
//! RECLAIM_COMPLETE, so an input whose first op is SEQUENCE gets the live
//! session id and the next sequence id patched in and reaches the ops after
//! it. Every [`RESET_EVERY`] inputs, or when the export has grown by
//! [`RESET_BYTES`], all client state is dropped, the export is laid out
//! anew and a new session is made, so state and files cannot pile up over
//! a long run.
//!
//! A request that blocks forever is reported as a libFuzzer timeout (the
//! alarm behind `-timeout` restarts interrupted system calls).
//!
//! The process is made safe to hand arbitrary requests from root: it loses
//! CAP_MKNOD (no device nodes but the fixture's `null`), files cannot grow
//! past [`MAX_FILE`] bytes (RLIMIT_FSIZE), and the export directory is
//! removed at exit (and left-overs of killed runs at the next start).

use crate::wire::{self, Auth, Compound};
use sluice::engine::export::Export;
use sluice::engine::handle::HandleKey;
use sluice::nfs4::consts::{op, status, SESSIONID_SIZE};
use sluice::nfs4::msg::{
    CallbackSec, ChannelAttrs4, CreateSessionArgs, CreateSessionResOk, ExchangeIdArgs,
    ExchangeIdResOk, Xdr,
};
use sluice::server::{Config, Server};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Slots of the harness's session.
pub const SLOTS: u32 = 4;
/// Inputs between two resets of the export and the server state.
pub const RESET_EVERY: u64 = 4096;
/// Growth of the export's file system that forces a reset.
pub const RESET_BYTES: u64 = 256 << 20;
/// Largest file the server may make (RLIMIT_FSIZE of the fuzzing process).
pub const MAX_FILE: u64 = 16 << 20;

/// Low two bits of an input's first byte: how the rest is used.
pub const MODE_MASK: u8 = 0x03;
/// COMPOUND4args; a leading SEQUENCE gets the live session (also mode 1).
pub const MODE_SESSION: u8 = 0;
/// COMPOUND4args wrapped in a call header as they are.
pub const MODE_WRAPPED: u8 = 2;
/// A whole RPC record, handed to the server as it is.
pub const MODE_RAW: u8 = 3;
/// Call as AUTH_NONE (else AUTH_SYS).
pub const FLAG_AUTH_NONE: u8 = 0x04;
/// AUTH_SYS as uid and gid 1000 (else root).
pub const FLAG_USER: u8 = 0x08;
/// Keep the SEQUENCE's slot id (else it is taken modulo [`SLOTS`]).
pub const FLAG_RAW_SLOT: u8 = 0x10;
/// Resend the slot's last sequence id (a retransmission) instead of the
/// next one.
pub const FLAG_REPLAY: u8 = 0x20;

/// Bytes of data at each end of the fixture file `file`.
pub const FILE_DATA: usize = 4096;
/// Offset of the second data extent of `file`; a hole lies before it.
pub const FILE_HOLE_END: u64 = 192 * 1024;

/// A `compound` input: the byte `ctl` (a `MODE_` value and `FLAG_` bits)
/// and then `body`.
pub fn input(ctl: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.len() + 1);
    v.push(ctl);
    v.extend_from_slice(body);
    v
}

struct Session {
    id: [u8; SESSIONID_SIZE],
    seqids: [u32; SLOTS as usize],
}

/// The server, its export and the harness's session.
pub struct Harness {
    server: Server,
    dir: PathBuf,
    keep: PathBuf,
    session: Session,
    xid: u32,
    runs: u64,
    resets: u64,
    free_at_reset: u64,
}

static SCRATCH_DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_scratch_dir() {
    if let Some(dir) = SCRATCH_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Where scratch exports go: $SLUICE_FUZZ_DIR, else /dev/shm, else the
/// temporary directory.
fn scratch_base() -> PathBuf {
    if let Some(d) = std::env::var_os("SLUICE_FUZZ_DIR") {
        return PathBuf::from(d);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

/// Removes scratch exports of fuzzing processes that are gone.
fn sweep_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("sluice-fuzz-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_MKNOD: u32 = 27;

/// Drops CAP_MKNOD from this thread (and threads it starts later), so a
/// fuzzed CREATE cannot make device nodes for the host's disks.
fn drop_mknod() {
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget and capset read and write exactly these structures.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) != 0 {
            return;
        }
        data[0].effective &= !(1 << CAP_MKNOD);
        data[0].permitted &= !(1 << CAP_MKNOD);
        data[0].inheritable &= !(1 << CAP_MKNOD);
        libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr());
        libc::prctl(libc::PR_CAPBSET_DROP, CAP_MKNOD as libc::c_ulong, 0, 0, 0);
    }
}

/// Caps file sizes; writes past the cap fail with EFBIG instead of
/// raising SIGXFSZ.
fn limit_file_size() {
    let lim = libc::rlimit {
        rlim_cur: MAX_FILE,
        rlim_max: MAX_FILE,
    };
    // SAFETY: plain system calls on valid arguments.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
    }
}

/// Makes libFuzzer's SIGALRM handler (its -timeout check) restart the
/// system call it interrupts. Without SA_RESTART the periodic alarm breaks
/// a request out of a blocking call (an open of a FIFO with no writer, say)
/// with EINTR well before the timeout, and a request that would hang the
/// server forever passes as merely slow.
fn restart_after_alarm() {
    // SAFETY: reads and rewrites the current disposition of SIGALRM with
    // only SA_RESTART added.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGALRM, std::ptr::null(), &mut sa) != 0 {
            return;
        }
        if sa.sa_sigaction == libc::SIG_DFL || sa.sa_sigaction == libc::SIG_IGN {
            return;
        }
        sa.sa_flags |= libc::SA_RESTART;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
    }
}

fn free_bytes(dir: &Path) -> u64 {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid C string and output buffer.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return 0;
    }
    // SAFETY: statvfs succeeded and filled the buffer.
    let st = unsafe { st.assume_init() };
    st.f_bavail.saturating_mul(st.f_frsize)
}

/// The bytes of the fixture file `file`: data at both ends, a hole between.
pub fn file_byte(offset: u64) -> u8 {
    b'a' + (offset % 26) as u8
}

/// Lays out the fixtures in an empty export directory; `keep` holds the
/// template device node.
fn make_fixtures(dir: &Path, keep: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))?;
    let mut f = std::fs::File::create(dir.join("file"))?;
    let head: Vec<u8> = (0..FILE_DATA as u64).map(file_byte).collect();
    f.write_all(&head)?;
    let tail: Vec<u8> = (FILE_HOLE_END..FILE_HOLE_END + FILE_DATA as u64)
        .map(file_byte)
        .collect();
    std::os::unix::fs::FileExt::write_all_at(&f, &tail, FILE_HOLE_END)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
    let e = std::fs::File::create(dir.join("empty"))?;
    e.set_permissions(std::fs::Permissions::from_mode(0o666))?;
    std::fs::create_dir(dir.join("dir"))?;
    std::fs::set_permissions(dir.join("dir"), std::fs::Permissions::from_mode(0o777))?;
    std::fs::write(dir.join("dir/inner"), b"inner file\n")?;
    symlink("file", dir.join("link"))?;
    let fifo = CString::new(dir.join("fifo").as_os_str().as_bytes())?;
    // SAFETY: valid C string.
    if unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // A character device (the host's /dev/null), linked from the template
    // made before CAP_MKNOD was dropped: exercises the paths for objects
    // that are neither files, directories nor symlinks.
    let null = keep.join("null");
    if null.exists() {
        std::fs::set_permissions(&null, std::fs::Permissions::from_mode(0o666))?;
        std::fs::hard_link(&null, dir.join("null"))?;
    }
    Ok(())
}

/// Makes the device node the fixtures link to (needs CAP_MKNOD).
fn make_template(keep: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(keep)?;
    let null = CString::new(keep.join("null").as_os_str().as_bytes())?;
    // SAFETY: valid C string; mknod has no other effect.
    if unsafe { libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn clear_dir(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// Fore channel attributes the harness asks for.
const FORE_CHANNEL: ChannelAttrs4 = ChannelAttrs4 {
    header_pad: 0,
    max_request: 1 << 20,
    max_response: 1 << 20,
    max_response_cached: 64 * 1024,
    max_ops: 64,
    max_requests: SLOTS,
    rdma_ird: None,
};

/// Back channel attributes the harness asks for.
const BACK_CHANNEL: ChannelAttrs4 = ChannelAttrs4 {
    header_pad: 0,
    max_request: 4096,
    max_response: 4096,
    max_response_cached: 0,
    max_ops: 2,
    max_requests: 1,
    rdma_ird: None,
};

impl Harness {
    /// Makes the export, the server and the session. Panics when the
    /// server cannot be started (the fuzzer must run as root).
    pub fn new() -> Self {
        limit_file_size();
        restart_after_alarm();
        let base = scratch_base();
        sweep_stale(&base);
        let scratch = base.join(format!("sluice-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let dir = scratch.join("export");
        let keep = scratch.join("keep");
        std::fs::create_dir_all(&dir).expect("create the scratch export directory");
        if SCRATCH_DIR.set(scratch).is_ok() {
            // SAFETY: registers a plain function to run at exit.
            unsafe {
                libc::atexit(remove_scratch_dir);
            }
        }
        make_template(&keep).expect("make the template device node");
        make_fixtures(&dir, &keep).expect("lay out the fixtures");
        drop_mknod();
        let export = Export::open(&dir, 0, HandleKey::new([0x5a; 32]))
            .expect("open the scratch export (the fuzzer must run as root)");
        let config = Config {
            lease: Duration::from_secs(90),
            ..Config::default()
        };
        let server =
            Server::new(export, HandleKey::new([0x5a; 32]), config).expect("start the server");
        let free_at_reset = free_bytes(&dir);
        let mut h = Harness {
            server,
            dir,
            keep,
            session: Session {
                id: [0; SESSIONID_SIZE],
                seqids: [0; SLOTS as usize],
            },
            xid: 0,
            runs: 0,
            resets: 0,
            free_at_reset,
        };
        h.session = h.new_session();
        h
    }

    /// The exported directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server.
    pub fn server(&self) -> &Server {
        &self.server
    }

    fn next_xid(&mut self) -> u32 {
        self.xid = self.xid.wrapping_add(1);
        self.xid
    }

    /// Runs a harness-made COMPOUND as root; panics unless every op
    /// succeeded, and returns the reply record.
    fn must(&mut self, what: &str, c: &Compound) -> Vec<u8> {
        let xid = self.next_xid();
        let reply = self
            .server
            .handle_record(&wire::compound_call(xid, Auth::ROOT, &c.encode()))
            .unwrap_or_else(|| panic!("harness: no reply to {what}"));
        match wire::reply_first_op(&reply) {
            Some((status::OK, _)) => reply,
            other => panic!("harness: {what} failed: {other:?}"),
        }
    }

    /// EXCHANGE_ID, CREATE_SESSION and RECLAIM_COMPLETE for the harness's
    /// own client.
    fn new_session(&mut self) -> Session {
        let generation = self.resets;
        let xchg = Compound::new(1, "harness").op_args(
            op::EXCHANGE_ID,
            &ExchangeIdArgs {
                verifier: generation.to_be_bytes(),
                ownerid: b"sluice-fuzz-harness".to_vec(),
                ..Default::default()
            },
        );
        let reply = self.must("EXCHANGE_ID", &xchg);
        let (_, mut d) = wire::reply_results(&reply).expect("EXCHANGE_ID reply");
        // The result's op number and status (OK, checked by `must`).
        d.u32().and(d.u32()).expect("EXCHANGE_ID result header");
        let x = ExchangeIdResOk::decode(&mut d).expect("EXCHANGE_ID result");
        let create = Compound::new(1, "harness").op_args(
            op::CREATE_SESSION,
            &CreateSessionArgs {
                clientid: x.clientid,
                sequence: x.sequenceid,
                flags: 0,
                fore: FORE_CHANNEL,
                back: BACK_CHANNEL,
                cb_program: 0x4000_0000,
                cb_sec: vec![CallbackSec::None],
            },
        );
        let reply = self.must("CREATE_SESSION", &create);
        let (_, mut d) = wire::reply_results(&reply).expect("CREATE_SESSION reply");
        d.u32().and(d.u32()).expect("CREATE_SESSION result header");
        let id = CreateSessionResOk::decode(&mut d)
            .expect("CREATE_SESSION result")
            .sessionid;
        let reclaim = Compound::new(1, "harness")
            .sequence(&id, 1, 0, false)
            .op(op::RECLAIM_COMPLETE, |e| e.bool(false));
        self.must("RECLAIM_COMPLETE", &reclaim);
        let mut seqids = [0; SLOTS as usize];
        seqids[0] = 1;
        Session { id, seqids }
    }

    /// Drops all client state, lays the export out anew and makes a new
    /// session.
    pub fn reset(&mut self) {
        // Every client's lease runs out; those holding state become
        // courtesy clients, and go when their courtesy does.
        let later = Instant::now() + Duration::from_secs(86_400);
        self.server.state.expire_at(later);
        self.server
            .state
            .expire_at(later + Duration::from_secs(2 * 86_400));
        clear_dir(&self.dir).expect("clear the scratch export");
        make_fixtures(&self.dir, &self.keep).expect("lay out the fixtures");
        self.resets += 1;
        self.session = self.new_session();
        self.free_at_reset = free_bytes(&self.dir);
    }

    /// Runs one fuzz input (see the `MODE_` and `FLAG_` constants) and
    /// returns the server's reply record.
    pub fn run(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        let (&ctl, body) = data.split_first()?;
        let auth = if ctl & FLAG_AUTH_NONE != 0 {
            Auth::None
        } else if ctl & FLAG_USER != 0 {
            Auth::Sys {
                uid: 1000,
                gid: 1000,
            }
        } else {
            Auth::ROOT
        };
        let reply = match ctl & MODE_MASK {
            MODE_RAW => self.server.handle_record(body),
            MODE_WRAPPED => {
                let xid = self.next_xid();
                self.server
                    .handle_record(&wire::compound_call(xid, auth, body))
            }
            _ => self.run_in_session(ctl, auth, body),
        };
        self.ran();
        reply
    }

    /// Hands a whole RPC record to the server (as [`Harness::run`] does
    /// in its raw mode) and returns the reply record.
    pub fn run_record(&mut self, record: &[u8]) -> Option<Vec<u8>> {
        let reply = self.server.handle_record(record);
        self.ran();
        reply
    }

    /// Counts a run, and resets every [`RESET_EVERY`] runs or when the
    /// export has grown by [`RESET_BYTES`].
    fn ran(&mut self) {
        self.runs += 1;
        let grown = self.free_at_reset.saturating_sub(free_bytes(&self.dir)) > RESET_BYTES;
        if self.runs.is_multiple_of(RESET_EVERY) || grown {
            self.reset();
        }
    }

    fn run_in_session(&mut self, ctl: u8, auth: Auth, body: &[u8]) -> Option<Vec<u8>> {
        let mut args = body.to_vec();
        let xid = self.next_xid();
        let Some(at) = wire::find_sequence(&args) else {
            return self
                .server
                .handle_record(&wire::compound_call(xid, auth, &args));
        };
        let slot = if ctl & FLAG_RAW_SLOT != 0 {
            at.slot
        } else {
            at.slot % SLOTS
        };
        let replay = ctl & FLAG_REPLAY != 0;
        let tracked = self.session.seqids.get(slot as usize).copied();
        let seqid = match tracked {
            Some(last) if replay => last,
            Some(last) => last.wrapping_add(1),
            None => u32::from_be_bytes(args[at.seqid..at.seqid + 4].try_into().ok()?),
        };
        wire::patch_sequence(&mut args, at, &self.session.id, seqid, slot);
        let reply = self
            .server
            .handle_record(&wire::compound_call(xid, auth, &args));
        if let Some(r) = &reply {
            match wire::reply_first_op(r) {
                Some((_, Some((op::SEQUENCE, status::OK)))) if !replay && tracked.is_some() => {
                    self.session.seqids[slot as usize] = seqid;
                }
                Some((_, Some((op::SEQUENCE, status::BADSESSION)))) => {
                    // Our session is gone (an input destroyed it).
                    self.session = self.new_session();
                }
                _ => {}
            }
        }
        reply
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();

/// Runs `f` on the process-wide harness, made on first use.
pub fn with<T>(f: impl FnOnce(&mut Harness) -> T) -> T {
    let m = HARNESS.get_or_init(|| Mutex::new(Harness::new()));
    let mut h = m.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut h)
}
