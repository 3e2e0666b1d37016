//! Feeds arbitrary bytes to the HTTP/2 connection decoder (framing, HPACK, gRPC messages) as
//! syscalls of either side, split and cut by capture losses anywhere, or header blocks straight
//! to an HPACK decoder. Beyond "never panics": streams followed stay under their limit, kept
//! header values stay short, the kept dynamic table stays under its cap, closing the
//! connection ends every stream, and the id read out of a request's first message (streams
//! whose path length is a multiple of 3 ask for field 7) is non-empty and bounded, and a plain
//! stream's bodies (SSE, JSON lines, JSON) give no more token events than bytes and bounded ids. Streams whose path has an
//! even length are followed as call streams (taken up again after a loss at a message whose
//! head opens with field 3's key): each message handed over keeps a bounded head,
//! at most a bounded number wait at once, and every head reads as KServe's request and stream
//! response without a panic. In HPACK mode each block is also read as a protobuf message (the
//! request id reader, the streaming id scanner, an embedded message's prefix).
//!
//! Input layout: byte 0 picks the mode (bit 0: HPACK blocks only; bit 1: attach mid-connection;
//! bit 2: small limits) and the number of control bytes (bits 3..8); the control bytes then cut
//! the records into syscalls (two per syscall: its size, and whether capture lost bytes after
//! it). The rest is records: a big-endian u16 whose top bit is the side (server when set) and
//! whose low 15 bits are the length, then that many bytes (fewer at the end of the input).
#![no_main]

use inferscope::testing::call_stream;
use inferscope_decode::{
    http::Chunk,
    http2::{
        Http2Connection, Limits, MAX_ID_BYTES, MAX_PAIRED_MESSAGES, MessageId, PAIRED_HEAD_BYTES,
        Side, Start, hpack,
    },
    protobuf,
};
use inferscope_model::Stats;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let ctrl_len = usize::from(cfg >> 3).min(rest.len());
    let (ctrl, mut records) = rest.split_at(ctrl_len);
    let limits = if cfg & 4 == 0 {
        Limits::default()
    } else {
        Limits {
            max_header_block_bytes: 64,
            max_table_bytes: 128,
            max_streams: 3,
        }
    };

    if cfg & 1 == 1 {
        let mut d = if cfg & 2 == 0 {
            hpack::Decoder::fresh(limits.max_table_bytes)
        } else {
            hpack::Decoder::mid_connection(limits.max_table_bytes)
        };
        while let Some((_, block)) = next_record(&mut records) {
            let _ = d.decode(block, &mut |_| {});
            let mut fields = 0usize;
            for (_, value) in protobuf::fields(block) {
                if let protobuf::WireValue::Bytes(b) = value {
                    assert!(b.len() <= block.len());
                }
                fields += 1;
            }
            // Every field takes at least two bytes (a key and a value byte).
            assert!(fields * 2 <= block.len());
            let _ = protobuf::string_field(block, 1);
            // The id scanner, fed the block in two pieces, agrees with the whole-buffer reader
            // on a field it finds.
            let mut scanner = protobuf::FieldScanner::new(1, 64);
            let (a, b) = block.split_at(block.len() / 2);
            scanner.feed(a);
            scanner.feed(b);
            if let Some(v) = scanner.value() {
                assert!(v.len() <= 64);
                let first = protobuf::fields(block).find_map(|(n, v)| match v {
                    protobuf::WireValue::Bytes(b) if n == 1 => Some(b),
                    _ => None,
                });
                assert_eq!(first, Some(v));
            }
            if let Some((b, _)) = protobuf::embedded_prefix(block, 2) {
                // Its key and length came before it.
                assert!(b.len() + 2 <= block.len());
            }
        }
        return;
    }

    let start = if cfg & 2 == 0 {
        Start::Fresh
    } else {
        Start::MidConnection
    };
    let mut conn = Http2Connection::new(limits, start);
    conn.scan_ids_of(|path| (path.len() % 3 == 0).then_some(7));
    conn.pair_messages_of(
        |path| path.len() % 2 == 0,
        |_, _, head| head.first() == Some(&0x1a),
    );
    let calls = call_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        .expect("Triton declares its call stream");
    let mut stats = Stats::default();
    let mut out = Vec::new();
    let mut ts = 0u64;
    let mut i = 0usize;
    while let Some((side, mut bytes)) = next_record(&mut records) {
        while !bytes.is_empty() {
            let (size, flags) = match (
                ctrl.get(i % ctrl.len().max(1)),
                ctrl.get((i + 1) % ctrl.len().max(1)),
            ) {
                (Some(&a), Some(&b)) => (usize::from(a) + 1, b),
                _ => (bytes.len(), 0),
            };
            i += 2;
            let (now, later) = bytes.split_at(size.min(bytes.len()));
            bytes = later;
            let lost = if flags & 1 == 1 {
                u64::from(flags >> 1)
            } else {
                0
            };
            ts += 1;
            conn.feed(
                side,
                Chunk {
                    bytes: now,
                    lost,
                    ts_ns: ts,
                },
                &mut stats,
                &mut out,
            );
            assert!(conn.open_streams() <= limits.max_streams);
            let mut handed = 0;
            for m in conn.take_paired() {
                handed += 1;
                assert!(m.message.head.len() <= PAIRED_HEAD_BYTES);
                assert!(m.message.head.len() <= m.message.len as usize);
                let _ = (calls.request_id)(&m.message.head);
                let _ = (calls.response)(&m.message.head);
            }
            assert!(handed <= MAX_PAIRED_MESSAGES);
        }
    }
    conn.close(ts + 1, &mut stats, &mut out);
    assert_eq!(conn.open_streams(), 0);
    for s in &out {
        for v in [
            &s.method,
            &s.path,
            &s.content_type,
            &s.x_request_id,
            &s.grpc_message,
        ] {
            assert!(v.known().is_none_or(|v| v.len() <= 256));
        }
        // Every message counted took at least its 5-byte prefix from the DATA counted; a plain
        // stream's token events (SSE or JSON lines) at least a byte each, captured or lost.
        match &s.exchange {
            None => {
                for m in [&s.request, &s.response] {
                    assert!(u64::from(m.count) * 5 <= m.data_bytes);
                }
            }
            Some(exchange) => {
                assert!(u64::from(s.response.count) <= s.response.data_bytes);
                assert!(
                    exchange
                        .response
                        .id
                        .as_ref()
                        .is_none_or(|id| id.len() <= 128)
                );
            }
        }
        if let MessageId::Found(id) = &s.request_id {
            assert!(!id.is_empty() && id.len() <= MAX_ID_BYTES);
            assert!(s.path.known().is_some_and(|p| p.len() % 3 == 0));
        }
    }
});

/// The next record: its side and bytes.
fn next_record<'a>(records: &mut &'a [u8]) -> Option<(Side, &'a [u8])> {
    let (head, rest) = records.split_first_chunk::<2>()?;
    let word = u16::from_be_bytes(*head);
    let side = if word & 0x8000 == 0 {
        Side::Client
    } else {
        Side::Server
    };
    let len = usize::from(word & 0x7fff).min(rest.len());
    let (bytes, after) = rest.split_at(len);
    *records = after;
    Some((side, bytes))
}
