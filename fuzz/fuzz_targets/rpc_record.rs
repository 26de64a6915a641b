//! Record marking and call headers: the input is the byte stream of one
//! TCP connection. Fragments are reassembled as the server does it, with
//! the server's bound `net::MAX_RECORD`, and every complete record goes
//! through `rpc::parse_call` (and `rpc::error_reply` when refused).
//!
//! A second assembler with a small bound taken from the input checks the
//! size accounting against a plain model of it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::net::MAX_RECORD;
use sluice::rpc::{self, FragmentHeader, RecordAssembler};

/// Runs the stream through an assembler bounded at `bound`; returns the
/// records it produced.
fn reassemble(stream: &[u8], bound: usize) -> Vec<Vec<u8>> {
    let mut asm = RecordAssembler::new(bound);
    let mut records = Vec::new();
    // What the assembler should hold, kept apart to check it.
    let mut pending: Vec<u8> = Vec::new();
    let mut rest = stream;
    while rest.len() >= 4 {
        let (mark, tail) = rest.split_at(4);
        let h = FragmentHeader::parse([mark[0], mark[1], mark[2], mark[3]]);
        let word = u32::from_be_bytes([mark[0], mark[1], mark[2], mark[3]]);
        assert_eq!(h.len, (word & 0x7fff_ffff) as usize);
        assert_eq!(h.last, word >> 31 == 1);
        let fits = pending.len() + h.len <= bound;
        match asm.admit(h) {
            Ok(()) => assert!(fits, "admitted {} + {} over {bound}", pending.len(), h.len),
            Err(_) => {
                assert!(
                    !fits,
                    "refused {} + {} within {bound}",
                    pending.len(),
                    h.len
                );
                // The server closes the connection here.
                return records;
            }
        }
        if tail.len() < h.len {
            // The connection ended inside a fragment.
            return records;
        }
        let (body, tail) = tail.split_at(h.len);
        rest = tail;
        pending.extend_from_slice(body);
        match asm.push(body, h.last) {
            Ok(Some(record)) => {
                assert!(h.last);
                assert_eq!(record, pending, "reassembled record differs");
                pending.clear();
                records.push(record);
            }
            Ok(None) => assert!(!h.last),
            Err(_) => panic!("push refused a fragment that admit accepted"),
        }
    }
    records
}

fn check_call(record: &[u8]) {
    match rpc::parse_call(record) {
        Ok(call) => {
            assert!(call.args_at <= record.len());
            assert_eq!(call.args_at % 4, 0);
            assert!(call.cred.gids.len() <= 16);
            let xid = u32::from_be_bytes([record[0], record[1], record[2], record[3]]);
            assert_eq!(call.xid, xid);
        }
        Err(e) => {
            let reply = rpc::error_reply(&e);
            if let Some(r) = reply {
                assert!(r.len() >= 20 && r.len() % 4 == 0);
                assert_eq!(&r[..4], &record[..4], "the reply echoes the xid");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&small, stream)) = data.split_first() else {
        return;
    };
    for record in reassemble(stream, MAX_RECORD) {
        check_call(&record);
    }
    let small_bound = usize::from(small) * 4;
    let _ = reassemble(stream, small_bound);
});
