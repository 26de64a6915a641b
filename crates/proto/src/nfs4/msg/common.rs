//! Building blocks shared by many messages: the [`Xdr`] impls of plain
//! values, the `xdr_struct!` macro for messages that are a sequence of
//! fields, bitmaps, attributes, owners and change info.

use super::Xdr;
use crate::nfs4::consts::OPAQUE_LIMIT;
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder, XdrResult};

/// Declares a struct whose XDR form is its fields in order, each of a
/// type with an [`Xdr`] impl, and that impl for the struct.
macro_rules! xdr_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty ),*
        }

        impl $crate::nfs4::msg::Xdr for $name {
            fn encode(&self, e: &mut $crate::xdr::Encoder) {
                $( $crate::nfs4::msg::Xdr::encode(&self.$field, e); )*
            }
            fn decode(d: &mut $crate::xdr::Decoder<'_>) -> $crate::xdr::XdrResult<Self> {
                Ok($name {
                    $( $field: <$ty as $crate::nfs4::msg::Xdr>::decode(d)? ),*
                })
            }
        }
    };
}
pub(crate) use xdr_struct;

impl Xdr for u64 {
    fn encode(&self, e: &mut Encoder) {
        e.u64(*self);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.u64()
    }
}

impl Xdr for bool {
    fn encode(&self, e: &mut Encoder) {
        e.bool(*self);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.bool()
    }
}

/// Fixed-length opaque data (verifiers, session ids).
impl<const N: usize> Xdr for [u8; N] {
    fn encode(&self, e: &mut Encoder) {
        e.opaque_fixed(self);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.array()
    }
}

/// Variable-length opaque data of at most NFS4_OPAQUE_LIMIT bytes.
impl Xdr for Vec<u8> {
    fn encode(&self, e: &mut Encoder) {
        e.opaque(self);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.opaque(OPAQUE_LIMIT).map(<[u8]>::to_vec)
    }
}

impl Xdr for Nfsstat4 {
    fn encode(&self, e: &mut Encoder) {
        e.status(*self);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.u32().map(Nfsstat4)
    }
}

/// Most words in a bitmap4 a message may carry.
pub const MAX_BITMAP_WORDS: usize = 8;

/// bitmap4: attribute or operation numbers as bits, word 0 first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bitmap4(pub Vec<u32>);

impl Bitmap4 {
    /// The bitmap of `words` without its trailing zero words, as servers
    /// send it.
    pub fn trimmed(words: &[u32]) -> Self {
        let n = words.iter().rposition(|w| *w != 0).map_or(0, |i| i + 1);
        Bitmap4(words[..n].to_vec())
    }

    /// Whether bit `n` is set.
    pub fn has(&self, n: u32) -> bool {
        self.0
            .get((n / 32) as usize)
            .is_some_and(|w| w & (1 << (n % 32)) != 0)
    }

    /// The bitmap with the bits `bits` set.
    pub fn of(bits: &[u32]) -> Self {
        let mut words = Vec::new();
        for &b in bits {
            let i = (b / 32) as usize;
            if words.len() <= i {
                words.resize(i + 1, 0);
            }
            words[i] |= 1 << (b % 32);
        }
        Bitmap4(words)
    }
}

impl Xdr for Bitmap4 {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.0.len() as u32);
        for w in &self.0 {
            e.u32(*w);
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.bitmap(MAX_BITMAP_WORDS).map(Bitmap4)
    }
}

/// Most bytes of attribute values in one fattr4.
pub const MAX_ATTR_VALS: usize = 64 * 1024;

/// fattr4: which attributes, and their values encoded in bit order. The
/// values stay encoded: what they mean depends on the bits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fattr4 {
    /// The attributes present.
    pub mask: Bitmap4,
    /// Their XDR-encoded values, in attribute number order.
    pub vals: Vec<u8>,
}

impl Xdr for Fattr4 {
    fn encode(&self, e: &mut Encoder) {
        self.mask.encode(e);
        e.opaque(&self.vals);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Fattr4 {
            mask: Bitmap4::decode(d)?,
            vals: d.opaque(MAX_ATTR_VALS)?.to_vec(),
        })
    }
}

/// Longest name component a message may carry (servers answer
/// NAMETOOLONG past 255 bytes; longer ones still decode so they can).
pub const MAX_COMPONENT: usize = 4096;

/// component4: one name in a directory, as bytes (UTF-8 is checked by
/// whoever uses it, to answer with the right status).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Component4(pub Vec<u8>);

impl Component4 {
    /// The component `s`.
    pub fn new(s: impl AsRef<[u8]>) -> Self {
        Component4(s.as_ref().to_vec())
    }
}

impl Xdr for Component4 {
    fn encode(&self, e: &mut Encoder) {
        e.opaque(&self.0);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.opaque(MAX_COMPONENT).map(|b| Component4(b.to_vec()))
    }
}

xdr_struct! {
    /// state_owner4 (open_owner4, lock_owner4).
    pub struct StateOwner4 {
        /// The owner's client id.
        pub clientid: u64,
        /// The owner, opaque to the server.
        pub owner: Vec<u8>,
    }
}

xdr_struct! {
    /// change_info4: a directory's change attribute around an op.
    pub struct ChangeInfo4 {
        /// Whether nothing else changed the directory in between.
        pub atomic: bool,
        /// Before the op.
        pub before: u64,
        /// After the op.
        pub after: u64,
    }
}

xdr_struct! {
    /// nfsace4: one access control entry.
    pub struct Nfsace4 {
        /// ACE4_ACCESS_ALLOWED_ACE_TYPE (0) and the like.
        pub acetype: u32,
        /// ACE4_* flags.
        pub flag: u32,
        /// ACE4_* access bits.
        pub access_mask: u32,
        /// The principal.
        pub who: Vec<u8>,
    }
}

/// Reads an array of at most `max` items of at least `min_bytes` each.
pub(super) fn array<T: Xdr>(
    d: &mut Decoder<'_>,
    max: usize,
    min_bytes: usize,
) -> XdrResult<Vec<T>> {
    let n = d.count(max, min_bytes)?;
    (0..n).map(|_| T::decode(d)).collect()
}

/// Writes an array.
pub(super) fn put_array<T: Xdr>(e: &mut Encoder, items: &[T]) {
    e.u32(items.len() as u32);
    for i in items {
        i.encode(e);
    }
}
