//! XDR (RFC 4506) encoding and decoding.
//!
//! The decoder works over a borrowed byte slice and never panics on bad
//! input: every read checks bounds and returns [`XdrError`]. The encoder
//! appends to a `Vec<u8>` and pads variable-length items to four bytes.

use bytes::Bytes;
use thiserror::Error;

/// A decoding failure: the input is shorter than the type needs, or a value
/// breaks a limit of the protocol.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum XdrError {
    /// The input ended before the item was complete.
    #[error("input truncated")]
    Truncated,
    /// A length field exceeds the limit allowed for that item.
    #[error("length {len} exceeds limit {limit}")]
    TooLong {
        /// the length the input claimed
        len: usize,
        /// the largest length accepted
        limit: usize,
    },
    /// A discriminant or boolean holds a value the type does not define.
    #[error("invalid value {0}")]
    BadValue(u32),
}

/// Result of a decode step.
pub type XdrResult<T> = Result<T, XdrError>;

/// Reads XDR items from a byte slice.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn pad4(n: usize) -> usize {
    (4 - (n & 3)) & 3
}

impl<'a> Decoder<'a> {
    /// Starts decoding at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        if self.remaining() < n {
            return Err(XdrError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Moves past `n` bytes already decoded once (to continue where an
    /// earlier decoder of the same buffer stopped).
    pub fn skip(&mut self, n: usize) -> XdrResult<()> {
        self.take(n).map(|_| ())
    }

    /// Reads an unsigned 32-bit integer.
    pub fn u32(&mut self) -> XdrResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads a signed 32-bit integer.
    pub fn i32(&mut self) -> XdrResult<i32> {
        Ok(self.u32()? as i32)
    }

    /// Reads an unsigned 64-bit integer.
    pub fn u64(&mut self) -> XdrResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// Reads a signed 64-bit integer.
    pub fn i64(&mut self) -> XdrResult<i64> {
        Ok(self.u64()? as i64)
    }

    /// Reads a boolean; values other than 0 and 1 are rejected.
    pub fn bool(&mut self) -> XdrResult<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadValue(v)),
        }
    }

    /// Reads fixed-length opaque data of `n` bytes (plus padding).
    pub fn opaque_fixed(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        let s = self.take(n)?;
        self.take(pad4(n))?;
        Ok(s)
    }

    /// Reads a fixed array of `N` bytes.
    pub fn array<const N: usize>(&mut self) -> XdrResult<[u8; N]> {
        let s = self.opaque_fixed(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// Reads variable-length opaque data of at most `limit` bytes.
    pub fn opaque(&mut self, limit: usize) -> XdrResult<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > limit {
            return Err(XdrError::TooLong { len, limit });
        }
        self.opaque_fixed(len)
    }

    /// Reads a counted array length, checked against `limit` and against
    /// the bytes left (each element takes at least `min_elem` bytes), so a
    /// hostile count cannot make the caller allocate.
    pub fn count(&mut self, limit: usize, min_elem: usize) -> XdrResult<usize> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(XdrError::TooLong { len: n, limit });
        }
        if n.saturating_mul(min_elem.max(1)) > self.remaining() {
            return Err(XdrError::Truncated);
        }
        Ok(n)
    }

    /// Reads a bitmap (array of u32 words), at most `limit` words.
    pub fn bitmap(&mut self, limit: usize) -> XdrResult<Vec<u32>> {
        let n = self.count(limit, 4)?;
        (0..n).map(|_| self.u32()).collect()
    }

    /// `r` when it decoded and nothing is left after it: procedure
    /// arguments must fill the call exactly (bytes left over are
    /// GARBAGE_ARGS).
    pub fn whole<T>(&self, r: XdrResult<T>) -> XdrResult<T> {
        let a = r?;
        if self.remaining() != 0 {
            return Err(XdrError::BadValue(self.remaining() as u32));
        }
        Ok(a)
    }

    /// Reads the rest of the input without interpreting it.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
}

/// Opaque data at least this long is spliced in by reference instead of
/// being copied into the encoder's own buffer.
pub const SHARE_MIN: usize = 2048;

/// Appends XDR items to a growable buffer.
///
/// Large opaque payloads (file data) can be spliced in by reference with
/// [`Encoder::opaque_shared`]: they are never copied into the buffer, and
/// [`Encoder::into_parts`] hands the reply to the socket as a list of
/// buffers for one vectored write. Positions (`len`, `truncate`,
/// `patch_u32`) always count the spliced bytes too.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
    /// Spliced buffers, each with the offset in `buf` it stands before,
    /// in ascending order, and whether it is lent (see
    /// [`Encoder::opaque_lent`]).
    chunks: Vec<(usize, Bytes, bool)>,
    chunk_len: usize,
}

impl Encoder {
    /// An empty encoder.
    pub fn new() -> Self {
        Encoder::default()
    }

    /// An empty encoder with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Encoder {
            buf: Vec::with_capacity(n),
            ..Default::default()
        }
    }

    /// Bytes written so far, spliced buffers included.
    pub fn len(&self) -> usize {
        self.buf.len() + self.chunk_len
    }

    /// True when nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The encoded bytes as one vector (copies spliced buffers in).
    pub fn into_inner(self) -> Vec<u8> {
        if self.chunks.is_empty() {
            return self.buf;
        }
        self.to_vec()
    }

    /// A copy of the encoded bytes as one vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        let mut at = 0;
        for (off, b, _) in &self.chunks {
            out.extend_from_slice(&self.buf[at..*off]);
            out.extend_from_slice(b);
            at = *off;
        }
        out.extend_from_slice(&self.buf[at..]);
        out
    }

    /// The encoded bytes as buffers to be sent in order, without copying
    /// spliced data. Empty buffers are left out.
    pub fn into_parts(self) -> Vec<Bytes> {
        self.into_marked_parts()
            .into_iter()
            .map(|(b, _)| b)
            .collect()
    }

    /// Like [`Encoder::into_parts`], with each buffer marked true when it
    /// is lent (see [`Encoder::opaque_lent`]).
    pub fn into_marked_parts(self) -> Vec<(Bytes, bool)> {
        let total_inline = self.buf.len();
        let inline = Bytes::from(self.buf);
        let mut parts = Vec::with_capacity(self.chunks.len() * 2 + 1);
        let mut at = 0;
        for (off, b, lent) in self.chunks {
            if off > at {
                parts.push((inline.slice(at..off), false));
            }
            if !b.is_empty() {
                parts.push((b, lent));
            }
            at = off;
        }
        if total_inline > at {
            parts.push((inline.slice(at..), false));
        }
        parts
    }

    /// Whether any spliced buffer is lent.
    pub fn has_lent(&self) -> bool {
        self.chunks.iter().any(|(_, _, lent)| *lent)
    }

    /// The encoded bytes, borrowed. Only for encoders without spliced
    /// buffers; use [`Encoder::to_vec`] otherwise.
    pub fn as_slice(&self) -> &[u8] {
        debug_assert!(self.chunks.is_empty(), "as_slice on a spliced encoder");
        &self.buf
    }

    /// Where total position `at` falls in `buf`, and the number of
    /// spliced buffers wholly before it.
    fn inline_pos(&self, at: usize) -> (usize, usize) {
        let mut before = 0;
        for (i, (off, b, _)) in self.chunks.iter().enumerate() {
            if at <= off + before {
                return (at - before, i);
            }
            if at < off + before + b.len() {
                // Inside a spliced buffer: callers only ask for positions
                // they took with len(), which never are.
                return (*off, i);
            }
            before += b.len();
        }
        (at - before, self.chunks.len())
    }

    /// Drops everything after `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        let (inline, keep) = self.inline_pos(len);
        for (_, b, _) in self.chunks.drain(keep..) {
            self.chunk_len -= b.len();
        }
        self.buf.truncate(inline);
    }

    /// Overwrites a u32 previously written at byte offset `at` (a position
    /// taken with [`Encoder::len`]).
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        let (i, _) = self.inline_pos(at);
        self.buf[i..i + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes an unsigned 32-bit integer.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// Writes an NFSv4 status.
    pub fn status(&mut self, st: crate::nfs4::Nfsstat4) {
        self.u32(st.code());
    }

    /// Writes a signed 32-bit integer.
    pub fn i32(&mut self, v: i32) {
        self.u32(v as u32);
    }

    /// Writes an unsigned 64-bit integer.
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// Writes a signed 64-bit integer.
    pub fn i64(&mut self, v: i64) {
        self.u64(v as u64);
    }

    /// Writes a boolean.
    pub fn bool(&mut self, v: bool) {
        self.u32(v as u32);
    }

    /// Writes fixed-length opaque data (plus padding).
    pub fn opaque_fixed(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
        self.buf.extend_from_slice(&[0u8; 3][..pad4(b.len())]);
    }

    /// Writes variable-length opaque data with its length.
    pub fn opaque(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.opaque_fixed(b);
    }

    /// Writes variable-length opaque data with its length, splicing the
    /// buffer in by reference when it is large (see [`SHARE_MIN`]).
    pub fn opaque_shared(&mut self, b: Bytes) {
        if b.len() < SHARE_MIN {
            self.opaque(&b);
            return;
        }
        self.splice(b, false);
    }

    /// Writes variable-length opaque data with its length, always spliced
    /// in by reference and marked as lent: memory that this process must
    /// not read itself (a mapping of a file, which a truncation elsewhere
    /// can take away), only hand to the kernel. Whoever sends the parts
    /// takes them with [`Encoder::into_marked_parts`].
    pub fn opaque_lent(&mut self, b: Bytes) {
        self.splice(b, true);
    }

    /// Writes variable-length opaque data made of `pieces` end to end,
    /// with their total length, splicing each large piece in by reference
    /// (see [`SHARE_MIN`]): data that lies in several buffers goes out
    /// without being copied together.
    pub fn opaque_pieces(&mut self, pieces: &[Bytes]) {
        let total: usize = pieces.iter().map(Bytes::len).sum();
        self.u32(total as u32);
        for p in pieces {
            if p.len() < SHARE_MIN {
                self.buf.extend_from_slice(p);
            } else {
                self.chunk(p.clone(), false);
            }
        }
        self.buf.extend_from_slice(&[0u8; 3][..pad4(total)]);
    }

    fn splice(&mut self, b: Bytes, lent: bool) {
        self.u32(b.len() as u32);
        let pad = pad4(b.len());
        self.chunk(b, lent);
        self.buf.extend_from_slice(&[0u8; 3][..pad]);
    }

    /// Splices `b` in by reference at the current position.
    fn chunk(&mut self, b: Bytes, lent: bool) {
        self.chunk_len += b.len();
        self.chunks.push((self.buf.len(), b, lent));
    }

    /// Writes a string (as opaque bytes).
    pub fn string(&mut self, s: &str) {
        self.opaque(s.as_bytes());
    }

    /// Writes a bitmap, trimming trailing zero words.
    pub fn bitmap(&mut self, words: &[u32]) {
        let mut n = words.len();
        while n > 0 && words[n - 1] == 0 {
            n -= 1;
        }
        self.u32(n as u32);
        for w in &words[..n] {
            self.u32(*w);
        }
    }

    /// Appends raw, already-encoded bytes.
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// Appends everything another encoder wrote, keeping its spliced
    /// buffers spliced.
    pub fn append(&mut self, other: Encoder) {
        let base = self.buf.len();
        if self.buf.is_empty() && self.chunks.is_empty() {
            *self = other;
            return;
        }
        self.buf.extend_from_slice(&other.buf);
        self.chunk_len += other.chunk_len;
        self.chunks.extend(
            other
                .chunks
                .into_iter()
                .map(|(off, b, l)| (off + base, b, l)),
        );
    }
}

impl From<Vec<u8>> for Encoder {
    fn from(buf: Vec<u8>) -> Self {
        Encoder {
            buf,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn opaque_is_padded() {
        let mut e = Encoder::new();
        e.opaque(b"abcde");
        assert_eq!(
            e.as_slice(),
            &[0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e', 0, 0, 0]
        );
        let mut d = Decoder::new(e.as_slice());
        assert_eq!(d.opaque(8).unwrap(), b"abcde");
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn truncated_and_oversized_inputs_fail() {
        assert_eq!(Decoder::new(&[0, 0, 1]).u32(), Err(XdrError::Truncated));
        assert_eq!(Decoder::new(&[0; 7]).u64(), Err(XdrError::Truncated));
        let mut d = Decoder::new(&[0, 0, 0, 9, 1, 2]);
        assert_eq!(
            d.clone().opaque(8),
            Err(XdrError::TooLong { len: 9, limit: 8 })
        );
        assert_eq!(d.opaque(100), Err(XdrError::Truncated));
        // A huge array count cannot promise more elements than bytes remain.
        let mut d = Decoder::new(&[0xff, 0xff, 0xff, 0xff]);
        assert!(d.count(usize::MAX, 4).is_err());
        assert_eq!(
            Decoder::new(&[0, 0, 0, 2]).bool(),
            Err(XdrError::BadValue(2))
        );
    }

    #[test]
    fn bitmap_trims_trailing_zero_words() {
        let mut e = Encoder::new();
        e.bitmap(&[1, 0, 0]);
        assert_eq!(e.as_slice(), &[0, 0, 0, 1, 0, 0, 0, 1]);
    }

    #[test]
    fn lent_buffers_are_always_spliced_and_stay_marked() {
        let mut e = Encoder::new();
        e.u32(7);
        // Even a few bytes lent are spliced, never copied in.
        e.opaque_lent(Bytes::from_static(b"abc"));
        e.opaque_shared(Bytes::from(vec![5u8; SHARE_MIN]));
        assert!(e.has_lent());
        let mut outer = Encoder::new();
        outer.u32(1);
        outer.append(e.clone());
        assert!(outer.has_lent(), "append keeps the mark");
        let marked = outer.clone().into_marked_parts();
        let lent: Vec<_> = marked
            .iter()
            .filter(|(_, l)| *l)
            .map(|(b, _)| b.clone())
            .collect();
        assert_eq!(lent, [Bytes::from_static(b"abc")]);
        assert_eq!(marked.iter().filter(|(_, l)| !*l).count(), 3);
        // The same bytes as the plain parts, in the same order.
        let flat: Vec<u8> = marked.iter().flat_map(|(b, _)| b.to_vec()).collect();
        assert_eq!(flat, outer.to_vec());
        let mut want = vec![0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 3];
        want.extend_from_slice(b"abc\0");
        assert_eq!(&flat[..16], &want[..]);
        // Truncating before it drops the mark with the buffer.
        outer.truncate(8);
        assert!(!outer.has_lent());
        assert!(!Encoder::new().has_lent());
    }

    /// Opaque data in pieces encodes as the same data in one buffer, and
    /// large pieces stay where they are.
    #[test]
    fn opaque_pieces_encode_as_one_opaque() {
        let pieces: Vec<Bytes> = [5000usize, 3, 2047, 4096, 1]
            .iter()
            .enumerate()
            .map(|(i, &n)| Bytes::from(vec![i as u8 + 1; n]))
            .collect();
        let whole = pieces.concat();
        let mut one = Encoder::new();
        one.u32(7);
        one.opaque(&whole);
        one.u32(8);
        let mut split = Encoder::new();
        split.u32(7);
        split.opaque_pieces(&pieces);
        split.u32(8);
        assert_eq!(split.len(), one.len());
        let want = one.into_inner();
        assert_eq!(split.to_vec(), want);
        let parts = split.into_parts();
        for big in pieces.iter().filter(|p| p.len() >= SHARE_MIN) {
            assert!(
                parts
                    .iter()
                    .any(|p| p.as_ptr() == big.as_ptr() && p.len() == big.len()),
                "a piece of {} bytes was copied",
                big.len()
            );
        }
        assert_eq!(parts.concat(), want);
    }

    #[test]
    fn spliced_buffers_keep_positions() {
        let big = Bytes::from(vec![7u8; SHARE_MIN + 3]);
        let mut e = Encoder::new();
        e.u32(1);
        let at = e.len();
        e.u32(0);
        e.opaque_shared(big.clone());
        let after = e.len();
        e.u32(9);
        assert_eq!(e.len(), 4 + 4 + 4 + big.len() + 1 + 4);
        e.patch_u32(at, 5);
        let flat = e.to_vec();
        let mut d = Decoder::new(&flat);
        assert_eq!(d.u32().unwrap(), 1);
        assert_eq!(d.u32().unwrap(), 5);
        assert_eq!(d.opaque(1 << 20).unwrap(), &big[..]);
        assert_eq!(d.u32().unwrap(), 9);
        // The parts are the same bytes, and the big buffer is not copied.
        let parts = e.clone().into_parts();
        assert!(parts.iter().any(|p| p.as_ptr() == big.as_ptr()));
        assert_eq!(parts.concat(), flat);
        // Truncating before the spliced buffer drops it.
        e.truncate(at + 4);
        assert_eq!(e.len(), 8);
        assert_eq!(e.to_vec(), vec![0, 0, 0, 1, 0, 0, 0, 5]);
        let _ = after;
    }

    proptest! {
        #[test]
        fn spliced_and_copied_encodings_agree(
            items in proptest::collection::vec((any::<u32>(), 0usize..5000), 0..8),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut plain = Encoder::new();
            let mut shared = Encoder::new();
            let mut marks = Vec::new();
            for (i, (v, n)) in items.iter().enumerate() {
                let data = vec![i as u8; *n];
                marks.push(plain.len());
                prop_assert_eq!(plain.len(), shared.len());
                plain.u32(*v);
                shared.u32(*v);
                plain.opaque(&data);
                let mut inner = Encoder::new();
                inner.opaque_shared(Bytes::from(data));
                shared.append(inner);
            }
            prop_assert_eq!(plain.to_vec(), shared.to_vec());
            prop_assert_eq!(shared.clone().into_parts().concat(), plain.to_vec());
            if !marks.is_empty() {
                let m = marks[cut.index(marks.len())];
                plain.patch_u32(m, 0xdead_beef);
                shared.patch_u32(m, 0xdead_beef);
                prop_assert_eq!(plain.to_vec(), shared.to_vec());
                plain.truncate(m + 4);
                shared.truncate(m + 4);
                prop_assert_eq!(plain.to_vec(), shared.to_vec());
            }
        }

        #[test]
        fn roundtrip(a in any::<u32>(), b in any::<u64>(), c in any::<i64>(),
                     o in proptest::collection::vec(any::<u8>(), 0..64), f in any::<bool>()) {
            let mut e = Encoder::new();
            e.u32(a); e.u64(b); e.i64(c); e.opaque(&o); e.bool(f);
            prop_assert_eq!(e.len() % 4, 0);
            let mut d = Decoder::new(e.as_slice());
            prop_assert_eq!(d.u32().unwrap(), a);
            prop_assert_eq!(d.u64().unwrap(), b);
            prop_assert_eq!(d.i64().unwrap(), c);
            prop_assert_eq!(d.opaque(64).unwrap(), &o[..]);
            prop_assert_eq!(d.bool().unwrap(), f);
            prop_assert_eq!(d.remaining(), 0);
        }

        #[test]
        fn arbitrary_input_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut d = Decoder::new(&buf);
            let _ = d.opaque(32);
            let _ = d.bitmap(8);
            let _ = d.u64();
            let _ = d.bool();
        }
    }
}
