//! XDR (RFC 4506) encoding and decoding.
//!
//! The decoder works over a borrowed byte slice and never panics on bad
//! input: every read checks bounds and returns [`XdrError`]. The encoder
//! appends to a `Vec<u8>` and pads variable-length items to four bytes.

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

    /// Reads the rest of the input without interpreting it.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
}

/// Appends XDR items to a growable buffer.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// An empty encoder.
    pub fn new() -> Self {
        Encoder { buf: Vec::new() }
    }

    /// An empty encoder with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Encoder {
            buf: Vec::with_capacity(n),
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The encoded bytes.
    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }

    /// The encoded bytes, borrowed.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// Drops everything after `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// Overwrites a u32 previously written at byte offset `at`.
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes an unsigned 32-bit integer.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
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

    proptest! {
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
