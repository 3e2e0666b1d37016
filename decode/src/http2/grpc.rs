//! gRPC's message framing inside one direction of one HTTP/2 stream: each message is a 1-byte
//! compressed flag and a 4-byte big-endian length, then that many bytes, split across DATA
//! frames anyhow. Only the 5-byte prefix is held, and, where the reader is asked to, the head
//! of each message; the rest of the bytes are counted and dropped.

use crate::protobuf::FieldScanner;

/// One complete message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub len: u32,
    pub compressed: bool,
    /// The syscall that carried the message's first byte, and the one that carried its last.
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    /// Where the message's first byte (its prefix's) was in the direction's bytes, where the
    /// caller told positions.
    pub at: Option<u64>,
    /// The message's first bytes (its prefix removed), up to the reader's head limit; empty
    /// when none is kept, the message is compressed, or a loss cut its first bytes.
    pub head: Vec<u8>,
}

/// The largest message a resynchronisation believes in: gRPC's default receive limit is 4 MiB.
const MAX_RESYNC_MESSAGE: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `usize` prefix bytes held.
    Prefix(usize),
    Body {
        left: u64,
    },
    /// Bytes were lost across a message boundary: later messages cannot be delimited.
    Lost,
}

/// The message splitter of one direction of one stream.
#[derive(Debug, Clone)]
pub struct MessageReader {
    state: State,
    prefix: [u8; 5],
    first_ts_ns: u64,
    first_at: Option<u64>,
    /// How many of each message's first bytes to hand over (0: none).
    head_limit: usize,
    head: Vec<u8>,
    /// Bytes of the open message were lost before its head was whole.
    head_cut: bool,
    /// The first message's id field, read as it passes (see [`Self::scan_first`]).
    scan: Option<FieldScanner>,
    /// The first message ended (compressed or not).
    first: Option<bool>,
}

impl Default for MessageReader {
    fn default() -> Self {
        Self::with_heads(0)
    }
}

impl MessageReader {
    /// A reader that hands over the first `head_limit` bytes of each message.
    pub fn with_heads(head_limit: usize) -> Self {
        Self {
            state: State::Prefix(0),
            prefix: [0; 5],
            first_ts_ns: 0,
            first_at: None,
            head_limit,
            head: Vec::new(),
            head_cut: false,
            scan: None,
            first: None,
        }
    }

    /// Reads top-level field `number` of the first message as it passes (an engine's request
    /// id, however far into the message): see [`Self::first_field`].
    pub fn scan_first(&mut self, number: u32, max: usize) {
        self.scan = Some(FieldScanner::new(number, max));
    }

    /// The first message's scanned field: None when none was asked for; `Some(None)` when it
    /// could not be read (compressed, cut by a loss, absent, or not yet whole).
    pub fn first_field(&self) -> Option<Option<&[u8]>> {
        let scan = self.scan.as_ref()?;
        Some(match self.first {
            Some(false) => scan.value(),
            _ => None,
        })
    }

    /// Whether message boundaries are still known.
    pub fn in_step(&self) -> bool {
        self.state != State::Lost
    }

    /// Whether a message is open (its prefix or body partly seen).
    pub fn mid_message(&self) -> bool {
        !matches!(self.state, State::Prefix(0) | State::Lost)
    }

    /// Bytes of the stream's data from the syscall at `ts_ns`; `at`: where they begin in the
    /// direction's bytes, if known.
    pub fn data(
        &mut self,
        mut bytes: &[u8],
        ts_ns: u64,
        mut at: Option<u64>,
        on: &mut dyn FnMut(Message),
    ) {
        while !bytes.is_empty() {
            let used = match self.state {
                State::Lost => return,
                State::Prefix(held) => {
                    if held == 0 {
                        self.first_ts_ns = ts_ns;
                        self.first_at = at;
                    }
                    let n = (5 - held).min(bytes.len());
                    if let (Some(dst), Some(src)) =
                        (self.prefix.get_mut(held..held + n), bytes.get(..n))
                    {
                        dst.copy_from_slice(src);
                    }
                    if held + n < 5 {
                        self.state = State::Prefix(held + n);
                    } else {
                        let [_, a, b, c, d] = self.prefix;
                        let left = u64::from(u32::from_be_bytes([a, b, c, d]));
                        self.state = State::Body { left };
                        if left == 0 {
                            self.finish(ts_ns, on);
                        }
                    }
                    n
                }
                State::Body { left } => {
                    let n = (bytes.len() as u64).min(left);
                    let body = bytes.get(..n as usize).unwrap_or_default();
                    if self.first.is_none()
                        && let Some(scan) = self.scan.as_mut()
                    {
                        scan.feed(body);
                    }
                    if !self.head_cut && self.head.len() < self.head_limit {
                        let keep = (self.head_limit - self.head.len()).min(body.len());
                        self.head
                            .extend_from_slice(body.get(..keep).unwrap_or_default());
                    }
                    self.state = State::Body { left: left - n };
                    if left == n {
                        self.finish(ts_ns, on);
                    }
                    n as usize
                }
            };
            bytes = bytes.get(used..).unwrap_or_default();
            at = at.map(|p| p.saturating_add(used as u64));
        }
    }

    fn finish(&mut self, ts_ns: u64, on: &mut dyn FnMut(Message)) {
        let [flag, a, b, c, d] = self.prefix;
        let compressed = flag & 1 != 0;
        self.first.get_or_insert(compressed);
        let head = std::mem::take(&mut self.head);
        on(Message {
            len: u32::from_be_bytes([a, b, c, d]),
            compressed,
            first_ts_ns: self.first_ts_ns,
            last_ts_ns: ts_ns,
            at: self.first_at,
            // A compressed message's bytes say nothing without its codec.
            head: if compressed || self.head_cut {
                Vec::new()
            } else {
                head
            },
        });
        self.head_cut = false;
        self.state = State::Prefix(0);
    }

    /// `n` bytes of the stream's data were lost from the syscall at `ts_ns`. Inside a message
    /// body only that message's bytes are gone (it is still counted when its end passes); a
    /// loss that reaches past a body's end loses the boundaries.
    pub fn lost(&mut self, n: u64, ts_ns: u64, on: &mut dyn FnMut(Message)) {
        if self.head.len() < self.head_limit {
            self.head_cut = true;
        }
        if self.first.is_none()
            && let Some(scan) = self.scan.as_mut()
        {
            scan.lost();
        }
        match self.state {
            State::Body { left } if n < left => self.state = State::Body { left: left - n },
            State::Body { left } if n == left => self.finish(ts_ns, on),
            _ => self.state = State::Lost,
        }
    }

    /// A reader whose boundaries were lost takes `bytes`, the beginning of a DATA frame's
    /// payload, for the beginning of a message if they open with an uncompressed message's prefix
    /// and `names_a_call` accepts the head that follows (an id where the protocol puts one):
    /// after a loss, a stream that carries many calls is followed again from its next call
    /// instead of never. Whether it took them.
    pub fn resync(&mut self, bytes: &[u8], names_a_call: impl Fn(&[u8]) -> bool) -> bool {
        if self.state != State::Lost {
            return false;
        }
        let Some(([0, a, b, c, d], body)) = bytes.split_first_chunk::<5>() else {
            return false;
        };
        let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
        if len == 0 || len > MAX_RESYNC_MESSAGE {
            return false;
        }
        let head = body.get(..len.min(body.len())).unwrap_or_default();
        if !names_a_call(head) {
            return false;
        }
        self.state = State::Prefix(0);
        self.head.clear();
        self.head_cut = false;
        true
    }

    /// The stream's data stopped being followed (the connection's framing was lost).
    pub fn abandon(&mut self) {
        self.state = State::Lost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(pieces: &[&[u8]]) -> Vec<Message> {
        let mut r = MessageReader::default();
        let mut out = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            r.data(p, i as u64 + 1, None, &mut |m| out.push(m));
        }
        out
    }

    fn msg(compressed: bool, body: &[u8]) -> Vec<u8> {
        let mut v = vec![u8::from(compressed)];
        v.extend((body.len() as u32).to_be_bytes());
        v.extend(body);
        v
    }

    #[test]
    fn messages_split_anywhere_are_counted_once_with_their_timestamps() {
        let mut wire = msg(false, b"hello");
        wire.extend(msg(true, b""));
        wire.extend(msg(false, &[7; 300]));
        let whole = messages(&[&wire]);
        assert_eq!(
            whole
                .iter()
                .map(|m| (m.len, m.compressed))
                .collect::<Vec<_>>(),
            vec![(5, false), (0, true), (300, false)]
        );
        for cut in 0..=wire.len() {
            let (a, b) = wire.split_at(cut);
            let got = messages(&[a, b]);
            assert_eq!(got.len(), 3, "cut {cut}");
            assert_eq!(got[0].len, 5);
            // The first message starts in the first piece unless the cut is at 0.
            let first_ts = if cut == 0 { 2 } else { 1 };
            assert_eq!(got[0].first_ts_ns, first_ts, "cut {cut}");
            let last_ts = if cut == wire.len() { 1 } else { 2 };
            assert_eq!(got[2].last_ts_ns, last_ts, "cut {cut}");
        }
        let bytewise: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(messages(&bytewise).len(), 3);
    }

    #[test]
    fn heads_and_positions_of_messages_split_anywhere() {
        let mut wire = msg(false, b"0123456789");
        wire.extend(msg(true, b"zz"));
        wire.extend(msg(false, b"abc"));
        for cut in 0..=wire.len() {
            let mut r = MessageReader::with_heads(4);
            let mut out = Vec::new();
            let (a, b) = wire.split_at(cut);
            r.data(a, 1, Some(100), &mut |m| out.push(m));
            r.data(b, 2, Some(100 + cut as u64), &mut |m| out.push(m));
            let got: Vec<_> = out.iter().map(|m| (m.at, m.head.as_slice())).collect();
            assert_eq!(
                got,
                [
                    (Some(100), &b"0123"[..]),
                    (Some(115), &b""[..]),
                    (Some(122), &b"abc"[..])
                ],
                "cut {cut}"
            );
        }
        // A loss inside a head: that message's head is empty, the next one's whole.
        let mut r = MessageReader::with_heads(4);
        let mut out = Vec::new();
        r.data(&wire[..7], 1, None, &mut |m| out.push(m));
        r.lost(8, 1, &mut |m| out.push(m));
        r.data(&wire[15..], 2, None, &mut |m| out.push(m));
        let heads: Vec<_> = out.iter().map(|m| m.head.as_slice()).collect();
        assert_eq!(heads, [&b""[..], b"", b"abc"]);
    }

    #[test]
    fn a_lost_reader_takes_up_only_at_a_message_that_names_a_call() {
        let mut r = MessageReader::with_heads(8);
        let mut out = Vec::new();
        let call = msg(false, b"id=7");
        // In step: nothing to take up.
        assert!(!r.resync(&call, |_| true));
        r.abandon();
        for (bytes, names) in [
            (msg(true, b"id=7"), true),
            (msg(false, b""), true),
            (msg(false, b"tensor"), false),
            (call[..4].to_vec(), true),
        ] {
            assert!(!r.resync(&bytes, |head| names && head.starts_with(b"id=")));
        }
        r.data(&call, 1, None, &mut |m| out.push(m));
        assert!(out.is_empty(), "still lost");
        assert!(r.resync(&call, |head| head.starts_with(b"id=")));
        r.data(&call, 2, None, &mut |m| out.push(m));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].head, b"id=7");
    }

    #[test]
    fn losses_inside_a_body_keep_the_boundaries_and_others_do_not() {
        let mut r = MessageReader::default();
        let mut out = Vec::new();
        r.data(&msg(false, b"abcdef")[..7], 1, None, &mut |m| out.push(m));
        r.lost(3, 1, &mut |m| out.push(m));
        r.data(b"f", 2, None, &mut |m| out.push(m));
        assert_eq!(out.len(), 1);
        assert!(r.in_step());
        // A loss that ends exactly at the body's end completes the message.
        r.data(&msg(false, b"abc")[..6], 3, None, &mut |m| out.push(m));
        r.lost(2, 4, &mut |m| out.push(m));
        assert_eq!(out.len(), 2);
        assert_eq!((out[1].len, out[1].last_ts_ns), (3, 4));
        r.data(&[0, 0], 3, None, &mut |m| out.push(m));
        r.lost(1, 5, &mut |m| out.push(m));
        assert!(!r.in_step());
        r.data(&msg(false, b"x"), 4, None, &mut |m| out.push(m));
        assert_eq!(out.len(), 2);
    }
}
