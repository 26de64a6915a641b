//! File handles: the kernel's persistent handle for an object, sealed with
//! a keyed MAC so clients cannot forge or alter them.
//!
//! Wire layout: version (1 byte), export id (1), kernel handle type (4,
//! little endian), kernel handle length (1), kernel handle bytes, then the
//! first 16 bytes of HMAC-SHA256 over everything before it.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

type HmacSha256 = Hmac<Sha256>;

const VERSION: u8 = 1;
const MAC_LEN: usize = 16;
const HEADER: usize = 7;
/// Longest kernel handle that still fits a 128-byte NFS handle.
const MAX_KERNEL_HANDLE: usize = 128 - HEADER - MAC_LEN;

/// Why a wire handle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleError {
    /// Malformed, forged, or from another export: NFS4ERR_BADHANDLE.
    Bad,
    /// Well-formed but the object no longer exists: NFS4ERR_STALE.
    Stale,
}

/// The key that seals handles of one server.
#[derive(Clone)]
pub struct HandleKey {
    /// HMAC-SHA256 with the key's inner and outer blocks already hashed:
    /// each MAC starts from a copy of it, two SHA-256 blocks instead of
    /// four for a handle.
    keyed: HmacSha256,
}

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandleKey(..)")
    }
}

impl HandleKey {
    /// A key from 32 secret bytes.
    pub fn new(key: [u8; 32]) -> Self {
        HandleKey {
            keyed: <HmacSha256 as Mac>::new_from_slice(&key).expect("HMAC takes any key length"),
        }
    }

    fn mac(&self, data: &[u8]) -> [u8; MAC_LEN] {
        let mut m = self.keyed.clone();
        m.update(data);
        let full = m.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    /// Seals a kernel handle into wire form.
    pub fn seal(&self, export: u8, kind: i32, bytes: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + bytes.len() + MAC_LEN);
        v.push(VERSION);
        v.push(export);
        v.extend_from_slice(&kind.to_le_bytes());
        v.push(bytes.len() as u8);
        v.extend_from_slice(bytes);
        let mac = self.mac(&v);
        v.extend_from_slice(&mac);
        v
    }

    /// Checks a wire handle and returns (export, kernel type, kernel bytes).
    pub fn open<'a>(&self, wire: &'a [u8]) -> Result<(u8, i32, &'a [u8]), HandleError> {
        if wire.len() < HEADER + MAC_LEN || wire[0] != VERSION {
            return Err(HandleError::Bad);
        }
        let n = wire[6] as usize;
        if wire.len() != HEADER + n + MAC_LEN {
            return Err(HandleError::Bad);
        }
        let (body, mac) = wire.split_at(HEADER + n);
        let want = self.mac(body);
        // Constant-time comparison.
        let diff = want.iter().zip(mac).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff != 0 {
            return Err(HandleError::Bad);
        }
        let kind = i32::from_le_bytes([wire[2], wire[3], wire[4], wire[5]]);
        Ok((wire[1], kind, &body[HEADER..]))
    }
}

#[repr(C)]
struct FileHandleBuf {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_KERNEL_HANDLE],
}

/// Asks the kernel for the handle of `name` in `dir` (or of `dir` itself
/// when `name` is empty). Symlinks are not followed.
pub fn kernel_handle(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<(i32, Vec<u8>)> {
    let mut h = FileHandleBuf {
        handle_bytes: MAX_KERNEL_HANDLE as u32,
        handle_type: 0,
        f_handle: [0; MAX_KERNEL_HANDLE],
    };
    let mut mount_id: libc::c_int = 0;
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        0
    };
    // SAFETY: `h` is a properly sized file_handle buffer and `name` is a
    // valid C string; the kernel writes within handle_bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut h as *mut FileHandleBuf,
            &mut mount_id as *mut libc::c_int,
            flags,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (h.handle_bytes as usize).min(MAX_KERNEL_HANDLE);
    Ok((h.handle_type, h.f_handle[..n].to_vec()))
}

/// Opens a kernel handle as an O_PATH descriptor on the file system of
/// `mount`. Needs CAP_DAC_READ_SEARCH.
pub fn open_kernel_handle(mount: BorrowedFd<'_>, kind: i32, bytes: &[u8]) -> io::Result<OwnedFd> {
    if bytes.len() > MAX_KERNEL_HANDLE {
        return Err(io::Error::from_raw_os_error(libc::ESTALE));
    }
    let mut h = FileHandleBuf {
        handle_bytes: bytes.len() as u32,
        handle_type: kind,
        f_handle: [0; MAX_KERNEL_HANDLE],
    };
    h.f_handle[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `h` is a valid file_handle; the returned fd is owned by us.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            &mut h as *mut FileHandleBuf,
            libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_and_open_roundtrip() {
        let k = HandleKey::new([7; 32]);
        let w = k.seal(0, 1, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(w.len() <= 128);
        assert_eq!(k.open(&w).unwrap(), (0, 1, &[1, 2, 3, 4, 5, 6, 7, 8][..]));
    }

    #[test]
    fn forged_or_foreign_handles_are_refused() {
        let k = HandleKey::new([7; 32]);
        let w = k.seal(0, 1, &[1, 2, 3, 4]);
        for i in 0..w.len() {
            let mut f = w.clone();
            f[i] ^= 1;
            assert_eq!(k.open(&f), Err(HandleError::Bad), "flip at byte {i}");
        }
        let other = HandleKey::new([8; 32]);
        assert_eq!(other.open(&w), Err(HandleError::Bad));
        assert_eq!(k.open(&w[..w.len() - 1]), Err(HandleError::Bad));
        assert_eq!(k.open(&[]), Err(HandleError::Bad));
    }

    /// Handles outlive the server (the key is kept in the state
    /// directory), so their bytes must not change with the code: the seal
    /// is HMAC-SHA256 as RFC 2104 defines it, its first 16 bytes (this
    /// value from Python's hmac module).
    #[test]
    fn the_seal_is_the_standard_hmac() {
        let k = HandleKey::new([7; 32]);
        let w = k.seal(0, 1, &[1, 2, 3, 4]);
        let hex: String = w.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "01000100000004010203043df9dc1f09b4352e716b9fd803f647c2"
        );
        // The same twice: each seal starts from the keyed state afresh.
        assert_eq!(k.seal(0, 1, &[1, 2, 3, 4]), w);
    }
}
