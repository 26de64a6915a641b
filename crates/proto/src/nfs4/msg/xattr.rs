//! Extended attribute ops (RFC 8276): GETXATTR, SETXATTR, LISTXATTRS and
//! REMOVEXATTR. Names are xattrkey4 (a component4, without the "user."
//! namespace, which the server adds); values are opaque, at most
//! [`MAX_XATTR_VALUE`] bytes here.

use super::common::{array, put_array, xdr_struct, ChangeInfo4, Component4};
use super::Xdr;
use crate::xdr::{Decoder, Encoder, XdrResult};

/// Largest extended attribute value decoded: more than any file system
/// takes (Linux: 64 KiB), so that a server can answer NFS4ERR_XATTR2BIG
/// rather than NFS4ERR_BADXDR.
pub const MAX_XATTR_VALUE: usize = 1 << 20;
/// Most names in one LISTXATTRS result that this decoder takes.
pub const MAX_LISTXATTRS_NAMES: usize = 4096;

/// setxattr_option4.
pub mod setxattr_option {
    /// SETXATTR4_EITHER: create or replace.
    pub const EITHER: u32 = 0;
    /// SETXATTR4_CREATE: fail when it exists.
    pub const CREATE: u32 = 1;
    /// SETXATTR4_REPLACE: fail when it does not.
    pub const REPLACE: u32 = 2;
}

xdr_struct! {
    /// GETXATTR4args.
    pub struct GetxattrArgs {
        /// The attribute.
        pub name: Component4,
    }
}

/// An xattrvalue4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrValue4(pub Vec<u8>);

impl Xdr for XattrValue4 {
    fn encode(&self, e: &mut Encoder) {
        e.opaque(&self.0);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.opaque(MAX_XATTR_VALUE).map(|b| XattrValue4(b.to_vec()))
    }
}

xdr_struct! {
    /// SETXATTR4args.
    pub struct SetxattrArgs {
        /// setxattr_option4.
        pub option: u32,
        /// The attribute.
        pub name: Component4,
        /// Its new value.
        pub value: XattrValue4,
    }
}

xdr_struct! {
    /// LISTXATTRS4args.
    pub struct ListxattrsArgs {
        /// 0, or the cookie of the previous result to go on from.
        pub cookie: u64,
        /// Largest result (cookie, names and eof), in bytes.
        pub maxcount: u32,
    }
}

/// LISTXATTRS4resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListxattrsResOk {
    /// Where the next call goes on from.
    pub cookie: u64,
    /// The names.
    pub names: Vec<Component4>,
    /// Whether these are the last.
    pub eof: bool,
}

impl Xdr for ListxattrsResOk {
    fn encode(&self, e: &mut Encoder) {
        e.u64(self.cookie);
        put_array(e, &self.names);
        e.bool(self.eof);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(ListxattrsResOk {
            cookie: d.u64()?,
            names: array(d, MAX_LISTXATTRS_NAMES, 4)?,
            eof: d.bool()?,
        })
    }
}

xdr_struct! {
    /// REMOVEXATTR4args.
    pub struct RemovexattrArgs {
        /// The attribute.
        pub name: Component4,
    }
}

xdr_struct! {
    /// SETXATTR4resok and REMOVEXATTR4resok.
    pub struct XattrChangeRes {
        /// The object's change attribute before and after.
        pub cinfo: ChangeInfo4,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bytes, roundtrip};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn xattr_messages_roundtrip(
            name in bytes(64), value in bytes(300), v in any::<(u32, u64, bool)>(),
            names in proptest::collection::vec(bytes(32), 0..5),
        ) {
            roundtrip(&GetxattrArgs { name: Component4(name.clone()) });
            roundtrip(&SetxattrArgs { option: v.0, name: Component4(name.clone()), value: XattrValue4(value) });
            roundtrip(&ListxattrsArgs { cookie: v.1, maxcount: v.0 });
            roundtrip(&ListxattrsResOk { cookie: v.1, names: names.into_iter().map(Component4).collect(), eof: v.2 });
            roundtrip(&RemovexattrArgs { name: Component4(name) });
            roundtrip(&XattrChangeRes { cinfo: ChangeInfo4 { atomic: v.2, before: v.1, after: v.1 ^ 1 } });
        }
    }
}
