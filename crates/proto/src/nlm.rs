//! NLM version 4 (byte-range locks for NFSv3 clients) and NSM version 1
//! (the status monitor), as the Open Group's XNFS specifies them: program
//! and procedure numbers, statuses, and the arguments of the procedures a
//! server answers or sends.

use crate::xdr::{Decoder, Encoder, XdrError, XdrResult};

/// The NLM version served (the one NFSv3 clients use).
pub const NLM_VERSION: u32 = 4;
/// The NSM version.
pub const NSM_VERSION: u32 = 1;
/// Longest caller or host name (LM_MAXSTRLEN and SM_MAXSTRLEN).
pub const MAXSTRLEN: usize = 1024;
/// Longest netobj (MAXNETOBJ_SZ).
pub const MAXNETOBJ: usize = 1024;

/// NLM version 4 procedures.
pub mod nlmproc {
    #![allow(missing_docs)]
    pub const NULL: u32 = 0;
    pub const TEST: u32 = 1;
    pub const LOCK: u32 = 2;
    pub const CANCEL: u32 = 3;
    pub const UNLOCK: u32 = 4;
    pub const GRANTED: u32 = 5;
    pub const TEST_MSG: u32 = 6;
    pub const LOCK_MSG: u32 = 7;
    pub const CANCEL_MSG: u32 = 8;
    pub const UNLOCK_MSG: u32 = 9;
    pub const GRANTED_MSG: u32 = 10;
    pub const TEST_RES: u32 = 11;
    pub const LOCK_RES: u32 = 12;
    pub const CANCEL_RES: u32 = 13;
    pub const UNLOCK_RES: u32 = 14;
    pub const GRANTED_RES: u32 = 15;
    pub const SHARE: u32 = 20;
    pub const UNSHARE: u32 = 21;
    pub const NM_LOCK: u32 = 22;
    pub const FREE_ALL: u32 = 23;
}

/// nlm4_stats.
pub mod nlmstat {
    #![allow(missing_docs)]
    pub const GRANTED: u32 = 0;
    pub const DENIED: u32 = 1;
    pub const DENIED_NOLOCKS: u32 = 2;
    pub const BLOCKED: u32 = 3;
    pub const DENIED_GRACE_PERIOD: u32 = 4;
    pub const DEADLCK: u32 = 5;
    pub const ROFS: u32 = 6;
    pub const STALE_FH: u32 = 7;
    pub const FBIG: u32 = 8;
    pub const FAILED: u32 = 9;
}

/// NSM procedures.
pub mod smproc {
    #![allow(missing_docs)]
    pub const NULL: u32 = 0;
    pub const STAT: u32 = 1;
    pub const MON: u32 = 2;
    pub const UNMON: u32 = 3;
    pub const UNMON_ALL: u32 = 4;
    pub const SIMU_CRASH: u32 = 5;
    pub const NOTIFY: u32 = 6;
}

/// An nlm4_lock: who locks what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nlm4Lock<'a> {
    /// The client's name for itself.
    pub caller_name: &'a [u8],
    /// The file's NFS handle.
    pub fh: &'a [u8],
    /// The lock owner (opaque to the server).
    pub oh: &'a [u8],
    /// The owning process on the client.
    pub svid: i32,
    /// First byte.
    pub offset: u64,
    /// Length; 0 is to the end of the file.
    pub len: u64,
}

impl<'a> Nlm4Lock<'a> {
    fn decode(d: &mut Decoder<'a>) -> XdrResult<Self> {
        Ok(Nlm4Lock {
            caller_name: d.opaque(MAXSTRLEN)?,
            fh: d.opaque(MAXNETOBJ)?,
            oh: d.opaque(MAXNETOBJ)?,
            svid: d.i32()?,
            offset: d.u64()?,
            len: d.u64()?,
        })
    }

    /// Writes the nlm4_lock.
    pub fn encode(&self, e: &mut Encoder) {
        e.opaque(self.caller_name);
        e.opaque(self.fh);
        e.opaque(self.oh);
        e.i32(self.svid);
        e.u64(self.offset);
        e.u64(self.len);
    }
}

/// An nlm4_share: a DOS-style share reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nlm4Share<'a> {
    /// The client's name for itself.
    pub caller_name: &'a [u8],
    /// The file's NFS handle.
    pub fh: &'a [u8],
    /// The owner.
    pub oh: &'a [u8],
    /// fsh4_mode: what others are denied (0 none, 1 read, 2 write, 3 both).
    pub mode: u32,
    /// fsh4_access: what the owner wants (0 none, 1 read, 2 write, 3 both).
    pub access: u32,
}

/// The arguments of an NLM version 4 call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NlmArgs<'a> {
    /// NULL.
    Null,
    /// TEST: cookie, exclusive, lock.
    Test(&'a [u8], bool, Nlm4Lock<'a>),
    /// LOCK and NM_LOCK: cookie, block, exclusive, lock, reclaim, state.
    Lock(&'a [u8], bool, bool, Nlm4Lock<'a>, bool, i32),
    /// CANCEL: cookie, block, exclusive, lock.
    Cancel(&'a [u8], bool, bool, Nlm4Lock<'a>),
    /// UNLOCK: cookie, lock.
    Unlock(&'a [u8], Nlm4Lock<'a>),
    /// SHARE and UNSHARE: cookie, share, reclaim.
    Share(&'a [u8], Nlm4Share<'a>, bool),
    /// FREE_ALL: the client's name and state.
    FreeAll(&'a [u8], i32),
}

/// The synchronous procedure whose work an asynchronous request does
/// (TEST_MSG, LOCK_MSG, CANCEL_MSG and UNLOCK_MSG: TEST, LOCK, CANCEL and
/// UNLOCK), and the procedure that carries its results back to the
/// caller's lock manager (TEST_RES, LOCK_RES, CANCEL_RES, UNLOCK_RES).
/// None for every other procedure.
pub fn async_request(proc_: u32) -> Option<(u32, u32)> {
    use nlmproc::*;
    match proc_ {
        TEST_MSG | LOCK_MSG | CANCEL_MSG | UNLOCK_MSG => {
            Some((proc_ - TEST_MSG + TEST, proc_ - TEST_MSG + TEST_RES))
        }
        _ => None,
    }
}

impl<'a> NlmArgs<'a> {
    /// Decodes the arguments of NLM version 4 procedure `proc_` (an
    /// asynchronous request's are its synchronous twin's, see
    /// [`async_request`]); None for a procedure not served (GRANTED and
    /// GRANTED_MSG, which servers send, and the _RES ones, which carry a
    /// server's answers to a client).
    pub fn decode(proc_: u32, d: &mut Decoder<'a>) -> Option<XdrResult<Self>> {
        use nlmproc::*;
        let proc_ = async_request(proc_).map_or(proc_, |(sync, _)| sync);
        let r = (|| -> XdrResult<Self> {
            Ok(match proc_ {
                NULL => NlmArgs::Null,
                TEST => NlmArgs::Test(d.opaque(MAXNETOBJ)?, d.bool()?, Nlm4Lock::decode(d)?),
                LOCK | NM_LOCK => NlmArgs::Lock(
                    d.opaque(MAXNETOBJ)?,
                    d.bool()?,
                    d.bool()?,
                    Nlm4Lock::decode(d)?,
                    d.bool()?,
                    d.i32()?,
                ),
                CANCEL => NlmArgs::Cancel(
                    d.opaque(MAXNETOBJ)?,
                    d.bool()?,
                    d.bool()?,
                    Nlm4Lock::decode(d)?,
                ),
                UNLOCK => NlmArgs::Unlock(d.opaque(MAXNETOBJ)?, Nlm4Lock::decode(d)?),
                SHARE | UNSHARE => {
                    let cookie = d.opaque(MAXNETOBJ)?;
                    let share = Nlm4Share {
                        caller_name: d.opaque(MAXSTRLEN)?,
                        fh: d.opaque(MAXNETOBJ)?,
                        oh: d.opaque(MAXNETOBJ)?,
                        mode: d.u32()?,
                        access: d.u32()?,
                    };
                    NlmArgs::Share(cookie, share, d.bool()?)
                }
                FREE_ALL => NlmArgs::FreeAll(d.opaque(MAXSTRLEN)?, d.i32()?),
                _ => return Err(XdrError::BadValue(proc_)),
            })
        })();
        if !matches!(
            proc_,
            NULL | TEST | LOCK | CANCEL | UNLOCK | SHARE | UNSHARE | NM_LOCK | FREE_ALL
        ) {
            return None;
        }
        Some(d.whole(r))
    }
}

/// The arguments of an NSM version 1 call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsmArgs<'a> {
    /// NULL, UNMON_ALL's and SIMU_CRASH's (what they carry is not used).
    Other,
    /// STAT: a host name.
    Stat(&'a [u8]),
    /// MON: the host to monitor (the rest is not used).
    Mon(&'a [u8]),
    /// UNMON: the host.
    Unmon(&'a [u8]),
    /// NOTIFY: the host that restarted and its new state.
    Notify(&'a [u8], i32),
}

fn my_id(d: &mut Decoder<'_>) -> XdrResult<()> {
    d.opaque(MAXSTRLEN)?;
    d.u32()?;
    d.u32()?;
    d.u32()?;
    Ok(())
}

impl<'a> NsmArgs<'a> {
    /// Decodes the arguments of NSM procedure `proc_`; None for one that
    /// does not exist.
    pub fn decode(proc_: u32, d: &mut Decoder<'a>) -> Option<XdrResult<Self>> {
        use smproc::*;
        let r = (|| -> XdrResult<Self> {
            Ok(match proc_ {
                NULL | SIMU_CRASH => NsmArgs::Other,
                STAT => NsmArgs::Stat(d.opaque(MAXSTRLEN)?),
                MON => {
                    let name = d.opaque(MAXSTRLEN)?;
                    my_id(d)?;
                    d.opaque_fixed(16)?;
                    NsmArgs::Mon(name)
                }
                UNMON => {
                    let name = d.opaque(MAXSTRLEN)?;
                    my_id(d)?;
                    NsmArgs::Unmon(name)
                }
                UNMON_ALL => {
                    my_id(d)?;
                    NsmArgs::Other
                }
                NOTIFY => NsmArgs::Notify(d.opaque(MAXSTRLEN)?, d.i32()?),
                _ => return Err(XdrError::BadValue(proc_)),
            })
        })();
        if proc_ > NOTIFY {
            return None;
        }
        Some(d.whole(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(e: &mut Encoder) {
        Nlm4Lock {
            caller_name: b"client",
            fh: &[1; 32],
            oh: b"owner",
            svid: 42,
            offset: 100,
            len: 0,
        }
        .encode(e);
    }

    #[test]
    fn decodes_lock_and_refuses_trailing_bytes() {
        let mut e = Encoder::new();
        e.opaque(b"ck");
        e.bool(true);
        e.bool(true);
        lock(&mut e);
        e.bool(false);
        e.i32(3);
        let buf = e.into_inner();
        let a = NlmArgs::decode(nlmproc::LOCK, &mut Decoder::new(&buf))
            .unwrap()
            .unwrap();
        let NlmArgs::Lock(ck, block, excl, l, reclaim, state) = a else {
            panic!("{a:?}")
        };
        assert_eq!(
            (ck, block, excl, reclaim, state),
            (&b"ck"[..], true, true, false, 3)
        );
        assert_eq!(
            (l.caller_name, l.svid, l.offset, l.len),
            (&b"client"[..], 42, 100, 0)
        );
        let mut more = buf.clone();
        more.extend_from_slice(&[0; 4]);
        assert!(NlmArgs::decode(nlmproc::LOCK, &mut Decoder::new(&more))
            .unwrap()
            .is_err());
        assert!(NlmArgs::decode(nlmproc::GRANTED, &mut Decoder::new(&buf)).is_none());
        // LOCK_MSG carries LOCK's arguments.
        assert_eq!(
            NlmArgs::decode(nlmproc::LOCK_MSG, &mut Decoder::new(&buf)),
            NlmArgs::decode(nlmproc::LOCK, &mut Decoder::new(&buf))
        );
        for p in nlmproc::GRANTED_MSG..=nlmproc::GRANTED_RES {
            assert!(NlmArgs::decode(p, &mut Decoder::new(&buf)).is_none(), "{p}");
        }
    }

    #[test]
    fn async_requests_pair_with_their_twin_and_result() {
        use nlmproc::*;
        assert_eq!(async_request(TEST_MSG), Some((TEST, TEST_RES)));
        assert_eq!(async_request(LOCK_MSG), Some((LOCK, LOCK_RES)));
        assert_eq!(async_request(CANCEL_MSG), Some((CANCEL, CANCEL_RES)));
        assert_eq!(async_request(UNLOCK_MSG), Some((UNLOCK, UNLOCK_RES)));
        for p in [
            NULL,
            TEST,
            LOCK,
            GRANTED,
            GRANTED_MSG,
            TEST_RES,
            GRANTED_RES,
            SHARE,
        ] {
            assert_eq!(async_request(p), None, "{p}");
        }
    }

    #[test]
    fn decodes_nsm_notify() {
        let mut e = Encoder::new();
        e.string("client");
        e.i32(5);
        let buf = e.into_inner();
        assert_eq!(
            NsmArgs::decode(smproc::NOTIFY, &mut Decoder::new(&buf)),
            Some(Ok(NsmArgs::Notify(b"client", 5)))
        );
        assert!(NsmArgs::decode(7, &mut Decoder::new(&buf)).is_none());
    }
}
