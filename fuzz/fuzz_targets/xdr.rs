//! The XDR decoder primitives. The input is a script and the data it
//! reads: the first byte gives the script's length, each script byte picks
//! one primitive (low nibble) and its limit (high nibble), and the rest of
//! the input is what they decode. Besides never panicking, the decoder
//! must keep its position and remaining count consistent, respect limits,
//! hand back exactly the bytes it consumed, and re-encode to them (padding
//! bytes aside).

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::xdr::{Decoder, Encoder, XdrError};

/// What one primitive decoded, re-encoded, and how many leading bytes of
/// the encoding must equal the input (the rest is padding, which the
/// decoder skips without checking).
struct Decoded {
    encoded: Encoder,
    exact: usize,
}

fn canonical(encoded: Encoder) -> Decoded {
    let exact = encoded.len();
    Decoded { encoded, exact }
}

fn step(d: &mut Decoder<'_>, s: u8, at: &[u8]) -> Result<Decoded, XdrError> {
    let limit = usize::from(s >> 4) * 5;
    let mut e = Encoder::new();
    match s & 0x0f {
        0 => e.u32(d.u32()?),
        1 => e.i32(d.i32()?),
        2 => e.u64(d.u64()?),
        3 => e.i64(d.i64()?),
        4 => e.bool(d.bool()?),
        5 => {
            let v = d.opaque_fixed(limit)?;
            assert_eq!(v, &at[..limit]);
            e.opaque_fixed(v);
            return Ok(Decoded {
                encoded: e,
                exact: limit,
            });
        }
        6 => {
            let v = d.opaque(limit)?;
            assert!(v.len() <= limit);
            assert_eq!(v, &at[4..4 + v.len()]);
            e.opaque(v);
            return Ok(Decoded {
                encoded: e,
                exact: 4 + v.len(),
            });
        }
        7 => e.opaque_fixed(&d.array::<16>()?),
        8 => {
            e.opaque_fixed(&d.array::<7>()?);
            return Ok(Decoded {
                encoded: e,
                exact: 7,
            });
        }
        9 => {
            let min = 1 + usize::from(s >> 6);
            let c = d.count(limit, min)?;
            assert!(c <= limit);
            assert!(c * min <= d.remaining(), "count promises more than is left");
            e.u32(c as u32);
        }
        10 => {
            let words = d.bitmap(limit)?;
            assert!(words.len() <= limit);
            e.u32(words.len() as u32);
            for w in words {
                e.u32(w);
            }
        }
        11 => {
            let r = d.rest();
            assert_eq!(r, at);
            assert_eq!(d.remaining(), 0);
            e.raw(r);
        }
        _ => e.u32(d.u32()?),
    }
    Ok(canonical(e))
}

fuzz_target!(|input: &[u8]| {
    let Some((&n, rest)) = input.split_first() else {
        return;
    };
    let n = usize::from(n % 48).min(rest.len());
    let (script, data) = rest.split_at(n);
    let mut d = Decoder::new(data);
    let mut clean = true;
    for &s in script {
        let before = d.position();
        let r = step(&mut d, s, &data[before..]);
        let after = d.position();
        assert_eq!(after + d.remaining(), data.len());
        assert!(after >= before);
        match r {
            Ok(out) => {
                let used = &data[before..after];
                let enc = out.encoded.as_slice();
                assert_eq!(enc.len(), used.len(), "re-encoding changes the size");
                assert_eq!(&enc[..out.exact], &used[..out.exact]);
                if s & 0x0f == 11 {
                    // The raw rest of the input need not be aligned.
                    clean = false;
                } else if clean {
                    assert_eq!(after % 4, 0, "misaligned after clean reads");
                }
            }
            Err(XdrError::Truncated) => clean = false,
            Err(XdrError::TooLong { len, limit }) => {
                assert!(len > limit);
                clean = false;
            }
            Err(XdrError::BadValue(v)) => {
                assert!(v > 1);
                clean = false;
            }
        }
    }
});
