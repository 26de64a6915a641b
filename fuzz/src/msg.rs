//! The `msg` target: the decoders of the typed NFSv4 messages
//! (`sluice::nfs4::msg`).
//!
//! An input is one byte that picks a message type in [`MESSAGES`] (modulo
//! their number) and the bytes decoded as that type. Decoding must never
//! panic. When it succeeds, the value must re-encode to as many bytes as
//! were consumed, equal to them except in padding (skipped unchecked by
//! the decoder, written as zeros by the encoder), and the re-encoding must
//! decode to the same value, consuming all of it; every strict prefix of
//! the consumed bytes must fail to decode, as truncated. Failures must
//! make sense (a `TooLong` length is over its limit).
//!
//! New types go at the end of [`MESSAGES`], so that the first byte of
//! existing inputs keeps its meaning.

use sluice::nfs4::msg::*;
use sluice::xdr::{Decoder, Encoder, XdrError, XdrResult};
use std::any::Any;
use std::fmt::Debug;

/// Largest WRITE data the `WriteArgs` entry accepts (the server's
/// maximum I/O size).
pub const MAX_WRITE: usize = 1 << 20;

/// One message type of the `msg` target.
#[derive(Clone, Copy)]
pub struct Message {
    /// The type's name.
    pub name: &'static str,
    /// `std::any::type_name` of the type, to find the entry of a value.
    type_name: fn() -> &'static str,
    /// Decodes an input as the type and checks the result; panics on a
    /// failed check.
    pub check: fn(&[u8]),
}

macro_rules! messages {
    ($($ty:ident),* $(,)?) => {
        &[
            Message {
                name: "WriteArgs",
                type_name: std::any::type_name::<WriteArgs<'static>>,
                check: check_write,
            },
            $(Message {
                name: stringify!($ty),
                type_name: std::any::type_name::<$ty>,
                check: check::<$ty>,
            },)*
        ]
    };
}

/// Every message type with a decoder, in input-byte order: `WriteArgs`
/// (decoded with [`MAX_WRITE`]), then the ops' arguments and results, the
/// COMPOUND headers, the types they are made of, and the back channel's
/// messages.
pub const MESSAGES: &[Message] = messages![
    CompoundHeader,
    CompoundResHeader,
    SequenceArgs,
    SequenceResOk,
    ExchangeIdArgs,
    ExchangeIdResOk,
    CreateSessionArgs,
    CreateSessionResOk,
    BindConnToSessionArgs,
    BindConnToSessionResOk,
    OpenArgs,
    OpenResOk,
    OpenDowngradeArgs,
    CloseArgs,
    LockArgs,
    LockDenied4,
    LocktArgs,
    LockuArgs,
    ReadArgs,
    WriteResOk,
    CommitArgs,
    TestStateidArgs,
    TestStateidResOk,
    SeekArgs,
    SeekResOk,
    AllocateArgs,
    SetattrArgs,
    AccessResOk,
    ReaddirArgs,
    CreateArgs,
    CreateResOk,
    RenameArgs,
    RenameResOk,
    NfsFh4,
    Component4,
    Bitmap4,
    Fattr4,
    StateOwner4,
    ChangeInfo4,
    Nfsace4,
    Stateid4,
    Nfstime4,
    ImplId,
    StateProtectOps,
    StateProtectArgs,
    ChannelAttrs4,
    CallbackSec,
    Specdata4,
    Createtype4,
    Createhow4,
    Openflag4,
    OpenClaim4,
    SpaceLimit4,
    OpenReadDelegation4,
    OpenWriteDelegation4,
    OpenNoneDelegation4,
    OpenDelegation4,
    OpenToLockOwner4,
    ExistLockOwner4,
    Locker4,
    BackchannelCtlArgs,
    CbCompoundHeader,
    CbCompoundResHeader,
    ReferringCall4,
    ReferringCallList4,
    CbSequenceArgs,
    CbSequenceResOk,
    CbRecallArgs,
    CbRecallAnyArgs,
    CbGetattrArgs,
    CbGetattrResOk,
    GetxattrArgs,
    XattrValue4,
    SetxattrArgs,
    ListxattrsArgs,
    ListxattrsResOk,
    RemovexattrArgs,
    XattrChangeRes,
    CloneArgs,
    Netloc4,
    CopyArgs,
    WriteResponse4,
    CopyRequirements4,
    CopyResOk,
    OffloadArgs,
    OffloadStatusResOk,
    OffloadInfo4,
    CbOffloadArgs,
];

/// Runs one `msg` input.
pub fn run(input: &[u8]) {
    let Some((&kind, data)) = input.split_first() else {
        return;
    };
    (MESSAGES[usize::from(kind) % MESSAGES.len()].check)(data);
}

/// The index of the entry named `name` in [`MESSAGES`].
pub fn index(name: &str) -> Option<u8> {
    MESSAGES
        .iter()
        .position(|m| m.name == name)
        .map(|i| i as u8)
}

/// A `msg` input that decodes `v`: its type's index, then its encoding.
/// Panics if the type has no entry.
pub fn input<T: Xdr>(v: &T) -> Vec<u8> {
    let want = std::any::type_name::<T>();
    let kind = MESSAGES
        .iter()
        .position(|m| (m.type_name)() == want)
        .unwrap_or_else(|| panic!("{want} is not in msg::MESSAGES"));
    let mut e = Encoder::new();
    v.encode(&mut e);
    let mut bytes = vec![kind as u8];
    bytes.extend_from_slice(e.as_slice());
    bytes
}

/// A `msg` input that decodes `w` as `WriteArgs`.
pub fn write_input(w: &WriteArgs<'_>) -> Vec<u8> {
    let mut v = vec![index("WriteArgs").expect("WriteArgs is in msg::MESSAGES")];
    let mut e = Encoder::new();
    w.encode(&mut e);
    v.extend_from_slice(e.as_slice());
    v
}

/// Whether `v` holds a part its decoder reads and drops, so that it
/// re-encodes to fewer or other bytes than it was decoded from: the
/// parameters of SP4_SSV state protection (sluice does not support it).
fn drops_fields(v: &dyn Any) -> bool {
    let ssv = |s: &StateProtectArgs| matches!(s, StateProtectArgs::Ssv(_));
    if let Some(a) = v.downcast_ref::<ExchangeIdArgs>() {
        return ssv(&a.state_protect);
    }
    v.downcast_ref::<StateProtectArgs>().is_some_and(ssv)
}

/// Checks a failed decode.
fn check_error(name: &str, err: &XdrError) {
    if let XdrError::TooLong { len, limit } = err {
        assert!(
            len > limit,
            "{name}: TooLong with length {len} <= limit {limit}"
        );
    }
}

/// Checks where a successful decode of `data` stopped: within the input,
/// after whole XDR words.
fn check_used(name: &str, data: &[u8], used: usize) {
    assert!(used <= data.len(), "{name}: consumed more than the input");
    assert_eq!(used % 4, 0, "{name}: consumed a partial XDR word");
}

/// Checks that `encoded`, the re-encoding of what `data[..used]` decoded
/// to, has the same length and the same bytes except in padding: a byte
/// may differ only where the encoding wrote a zero, and never in the first
/// byte of a word (padding follows at least one byte of data).
fn check_bytes(name: &str, data: &[u8], used: usize, encoded: &[u8]) {
    assert_eq!(
        encoded.len(),
        used,
        "{name}: re-encoding has {} bytes, decoding consumed {used}\n  input:   {:02x?}\n  encoded: {encoded:02x?}",
        encoded.len(),
        &data[..used],
    );
    for (i, (&a, &b)) in data.iter().zip(encoded).enumerate() {
        assert!(
            a == b || (b == 0 && i % 4 != 0),
            "{name}: re-encoding differs at byte {i} ({a:#04x} read, {b:#04x} written), not padding\n  input:   {:02x?}\n  encoded: {encoded:02x?}",
            &data[..used],
        );
    }
}

/// Checks that strict prefixes of the `used` bytes of `data` fail to
/// decode as truncated. Tries two (cutting the last byte and half the
/// message), so the cost stays linear in the input.
fn check_prefixes<T: Debug>(
    name: &str,
    data: &[u8],
    used: usize,
    decode: impl for<'b> Fn(&mut Decoder<'b>) -> XdrResult<T>,
) {
    for cut in [used.saturating_sub(1), used / 2] {
        if cut >= used {
            continue;
        }
        let r = decode(&mut Decoder::new(&data[..cut]));
        assert!(
            matches!(r, Err(XdrError::Truncated)),
            "{name}: the first {cut} of {used} bytes decode to {r:?}, not Truncated"
        );
    }
}

/// Decodes `data` as `T` and checks the result (see the module doc).
fn check<T: Xdr + PartialEq + Debug + Any>(data: &[u8]) {
    let name = std::any::type_name::<T>();
    let mut d = Decoder::new(data);
    let v = match T::decode(&mut d) {
        Ok(v) => v,
        Err(e) => return check_error(name, &e),
    };
    let used = d.position();
    check_used(name, data, used);
    let mut e = Encoder::new();
    v.encode(&mut e);
    let encoded = e.into_inner();
    check_prefixes(name, data, used, T::decode);
    if !drops_fields(&v) {
        check_bytes(name, data, used, &encoded);
    }
    let mut d = Decoder::new(&encoded);
    let back = T::decode(&mut d)
        .unwrap_or_else(|e| panic!("{name}: the re-encoding of {v:?} does not decode: {e}"));
    assert_eq!(
        d.position(),
        encoded.len(),
        "{name}: decoding the re-encoding of {v:?} leaves bytes"
    );
    assert_eq!(
        back, v,
        "{name}: decoding the re-encoding gives another value"
    );
}

/// [`check`] for `WriteArgs`, whose data is borrowed and whose decoder
/// takes a limit.
fn check_write(data: &[u8]) {
    let name = "WriteArgs";
    let decode = |d: &mut Decoder<'_>| WriteArgs::decode(d, MAX_WRITE).map(|w| w.data.len());
    let mut d = Decoder::new(data);
    let v = match WriteArgs::decode(&mut d, MAX_WRITE) {
        Ok(v) => v,
        Err(e) => return check_error(name, &e),
    };
    assert!(v.data.len() <= MAX_WRITE, "{name}: data over the limit");
    let used = d.position();
    check_used(name, data, used);
    let mut e = Encoder::new();
    v.encode(&mut e);
    let encoded = e.into_inner();
    check_bytes(name, data, used, &encoded);
    check_prefixes(name, data, used, decode);
    let mut d = Decoder::new(&encoded);
    let back = WriteArgs::decode(&mut d, MAX_WRITE)
        .unwrap_or_else(|e| panic!("{name}: the re-encoding of {v:?} does not decode: {e}"));
    assert_eq!(
        back, v,
        "{name}: decoding the re-encoding gives another value"
    );
    assert_eq!(d.position(), encoded.len(), "{name}: leaves bytes");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        for (i, m) in MESSAGES.iter().enumerate() {
            assert_eq!(index(m.name), Some(i as u8), "{}", m.name);
        }
        assert!(MESSAGES.len() <= 256);
    }

    #[test]
    fn inputs_pick_their_type() {
        let v = SeekResOk {
            eof: true,
            offset: 7,
        };
        let i = input(&v);
        assert_eq!(MESSAGES[usize::from(i[0])].name, "SeekResOk");
        assert_eq!(i.len(), 1 + 12);
        run(&i);
    }
}
