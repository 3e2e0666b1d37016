use super::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../tests/fixtures/vllm/0.33.0/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The frames of each message sent in `direction`, from messages.json.
fn sent(direction: &str) -> Vec<Vec<Vec<u8>>> {
    let json: serde_json::Value = serde_json::from_slice(&fixture("messages.json")).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .filter(|m| m["direction"] == direction)
        .map(|m| {
            m["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| hex(f.as_str().unwrap()))
                .collect()
        })
        .collect()
}

fn decode_in_chunks(bytes: &[u8], chunk: impl Fn(usize) -> usize) -> (ZmtpStream, Vec<Message>) {
    let mut stream = ZmtpStream::new(ZmtpLimits::default());
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = chunk(i).clamp(1, bytes.len() - at);
        stream.feed(&bytes[at..at + n], 0, &mut out);
        at += n;
        i += 1;
    }
    (stream, out)
}

fn frames(messages: &[Message]) -> Vec<Vec<Vec<u8>>> {
    messages
        .iter()
        .map(|m| {
            assert!(m.frames.iter().all(|f| f.complete));
            m.frames.iter().map(|f| f.data.clone()).collect()
        })
        .collect()
}

#[test]
fn fixture_streams_decode_to_the_sent_messages_whatever_the_split() {
    for transport in ["ipc", "tcp"] {
        let cases = [
            ("input.to_engine", "to_engine_input", "ROUTER"),
            ("input.from_engine", "from_engine_input", "DEALER"),
            ("output.from_engine", "from_engine_output", "PUSH"),
            ("output.to_engine", "none", "PULL"),
        ];
        for (file, direction, socket_type) in cases {
            let bytes = fixture(&format!("{transport}-{file}.bin"));
            let want = sent(direction);
            let splits: [&dyn Fn(usize) -> usize; 4] = [
                &|_| usize::MAX,
                &|_| 1,
                &|i| [3, 64, 1, 500, 7, 9000][i % 6],
                &|i| (i * 7919) % 257,
            ];
            for split in splits {
                let (stream, out) = decode_in_chunks(&bytes, split);
                assert_eq!(stream.failed(), None, "{transport} {file}");
                assert_eq!(
                    stream.socket_type(),
                    Some(socket_type),
                    "{transport} {file}"
                );
                assert_eq!(frames(&out), want, "{transport} {file}");
            }
        }
    }
}

#[test]
fn the_dealer_identity_is_the_engine_index() {
    let (stream, _) = decode_in_chunks(&fixture("ipc-input.from_engine.bin"), |_| 100);
    assert_eq!(stream.identity(), Some(&[0u8, 0][..]));
}

#[test]
fn lost_bytes_inside_a_body_mark_that_frame_and_decoding_goes_on() {
    let bytes = fixture("tcp-output.from_engine.bin");
    let want = sent("from_engine_output");
    // Greeting + READY end where the first message's header starts: find the first body.
    let first = &want[0][0];
    let body_at = bytes
        .windows(first.len())
        .position(|w| w == first.as_slice())
        .unwrap();
    let mut stream = ZmtpStream::new(ZmtpLimits::default());
    let mut out = Vec::new();
    // Capture 100 bytes of the body, lose the rest of it, then feed everything after it.
    let cut = body_at + 100;
    let stats = stream.feed(&bytes[..cut], (first.len() - 100) as u64, &mut out);
    assert_eq!(stats.frames_incomplete, 1);
    stream.feed(&bytes[body_at + first.len()..], 0, &mut out);
    assert_eq!(out.len(), want.len());
    assert!(!out[0].frames[0].complete);
    assert_eq!(out[0].frames[0].data, first[..100]);
    assert_eq!(frames(&out[1..]), want[1..]);
}

#[test]
fn lost_bytes_across_a_header_stop_the_stream() {
    let bytes = fixture("ipc-output.from_engine.bin");
    let mut stream = ZmtpStream::new(ZmtpLimits::default());
    let mut out = Vec::new();
    stream.feed(&bytes[..80], 10_000, &mut out);
    assert_eq!(stream.failed(), Some(ZmtpError::Desync));
    stream.feed(&bytes[80..], 0, &mut out);
    assert!(out.is_empty());
}

/// Offsets in `bytes` where each message sent in `direction` starts (its first frame header).
fn message_starts(bytes: &[u8], direction: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut from = 0;
    for msg in sent(direction) {
        let first = &msg[0];
        let at = from
            + bytes[from..]
                .windows(first.len())
                .position(|w| w == first.as_slice())
                .unwrap();
        let header = if first.len() > 255 { 9 } else { 2 };
        starts.push(at - header);
        from = at + first.len();
    }
    starts
}

#[test]
fn a_stream_joined_late_locks_on_at_a_message_boundary() {
    let bytes = fixture("tcp-output.from_engine.bin");
    let want = sent("from_engine_output");
    let starts = message_starts(&bytes, "from_engine_output");
    let mut stream = ZmtpStream::mid_stream(ZmtpLimits::default());
    let mut out = Vec::new();
    // Syscalls as libzmq makes them on an idle socket: one message each. The first captured
    // one starts inside a message (the agent attached mid-write): skipped.
    let stats = stream.feed(&bytes[starts[1] + 5..starts[2]], 0, &mut out);
    assert_eq!(stats.hunt_skipped, 1);
    for w in starts[2..].windows(2) {
        stream.feed(&bytes[w[0]..w[1]], 0, &mut out);
    }
    stream.feed(&bytes[*starts.last().unwrap()..], 0, &mut out);
    assert_eq!(frames(&out), want[2..]);
    // Without a greeting, a stream that never lines up is given up on.
    let mut http = ZmtpStream::new(ZmtpLimits::default());
    for _ in 0..=MAX_HUNT {
        http.feed(b"HTTP/1.1 200 OK\r\n", 0, &mut out);
    }
    assert_eq!(http.failed(), Some(ZmtpError::NotZmtp));
}

#[test]
fn bounded_frames_and_messages() {
    let mut bytes = fixture("ipc-output.from_engine.bin");
    let limits = ZmtpLimits {
        max_frame_keep: 64,
        max_frames: 1,
    };
    let mut stream = ZmtpStream::new(limits);
    let mut out = Vec::new();
    // A 3-frame message and a frame that declares 2^62 bytes.
    bytes.extend_from_slice(&[0x01, 1, b'a', 0x01, 1, b'b', 0x00, 1, b'c']);
    bytes.extend_from_slice(&[0x02, 0x40, 0, 0, 0, 0, 0, 0, 0, b'x', b'y']);
    let stats = stream.feed(&bytes, 0, &mut out);
    assert_eq!(stats.frames_dropped, 2);
    assert!(
        out.iter()
            .all(|m| m.frames.iter().all(|f| f.data.len() <= 64))
    );
    assert_eq!(out.last().unwrap().frames[0].data, b"a");
    assert_eq!(stream.failed(), None);
}

#[test]
fn rejects_what_is_not_zmtp() {
    let mut out = Vec::new();
    let mut old = ZmtpStream::new(ZmtpLimits::default());
    old.feed(&[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 2, 0], 0, &mut out);
    assert_eq!(old.failed(), Some(ZmtpError::OldVersion));
}

#[test]
fn tells_zmtp_syscalls_from_http_ones() {
    let bytes = fixture("ipc-output.from_engine.bin");
    assert!(looks_like_zmtp(&bytes[..10]));
    let starts = message_starts(&bytes, "from_engine_output");
    assert!(looks_like_zmtp(&bytes[starts[0]..starts[1]]));
    assert!(looks_like_zmtp(&bytes[starts[0]..starts[2]]));
    assert!(!looks_like_zmtp(&bytes[starts[0]..starts[1] - 1]));
    for http in [
        &b"POST /v1/chat/completions HTTP/1.1\r\n"[..],
        b"HTTP/1.1 200 OK\r\n",
        b"1a\r\ndata: {}\r\n",
        b"0\r\n\r\n",
        b"",
    ] {
        assert!(!looks_like_zmtp(http));
    }
}

#[test]
fn a_stream_joined_late_locks_on_at_a_batch_cut_mid_message() {
    // libzmq batches queued messages into one send and cuts the batch at its buffer size, so
    // a busy socket's sends rarely end on a message boundary; they start on one when the
    // previous send ended there. Two whole messages, then a message cut off: locked on.
    let whole = [0x01, 1, b'a', 0x00, 2, b'h', b'i', 0x00, 1, b'z'];
    let mut first = whole.to_vec();
    first.extend_from_slice(&[0x01, 1, b'b', 0x00, 5, b'h', b'e']);
    let mut stream = ZmtpStream::mid_stream(ZmtpLimits::default());
    let mut out = Vec::new();
    let stats = stream.feed(&first, 0, &mut out);
    assert_eq!(stats.hunt_skipped, 0);
    stream.feed(b"llo", 0, &mut out);
    assert_eq!(out.len(), 3);
    assert_eq!(out[2].frames[1].data, b"hello");
    // One whole message and a cut-off one is too little to trust.
    let mut lone = ZmtpStream::mid_stream(ZmtpLimits::default());
    let stats = lone.feed(&[0x01, 1, b'a', 0x00, 1, b'b', 0x00, 9, b'x'], 0, &mut out);
    assert_eq!(stats.hunt_skipped, 1);
}
