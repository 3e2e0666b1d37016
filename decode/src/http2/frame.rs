//! HTTP/2 framing (RFC 9113 §4, §6) of one direction of a connection, fed captured syscall
//! payloads split anywhere.
//!
//! DATA payloads stream through as they arrive (nothing of them is kept); header block fragments
//! (HEADERS, PUSH_PROMISE, CONTINUATION) are gathered, up to a bound, into one block for HPACK;
//! control frames keep only their fixed fields. Bytes lost in capture inside a frame's payload
//! lose that payload only, since the frame's length still says where the next frame starts; bytes
//! lost across a frame header lose the framing, and decoding resumes at the first syscall whose
//! bytes begin with a plausible frame header (writes almost always do: servers write whole
//! frames).

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

use crate::http::wipe;

const HEADER_LEN: usize = 9;
/// The largest frame length a hunt accepts as plausible: peers rarely raise
/// SETTINGS_MAX_FRAME_SIZE, and a random 24-bit length is almost always larger.
const HUNT_MAX_FRAME: u32 = 1 << 20;
/// Frames past the first that a hunt checks when the syscall holds them.
const HUNT_CHAIN: usize = 4;

pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

mod flag {
    pub(super) const END_STREAM: u8 = 0x1;
    pub(super) const ACK: u8 = 0x1;
    pub(super) const END_HEADERS: u8 = 0x4;
    pub(super) const PADDED: u8 = 0x8;
    pub(super) const PRIORITY: u8 = 0x20;
}

const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;

/// A frame that broke the protocol's rules while its length kept the framing intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("padding longer than the frame")]
    BadPadding,
    #[error("frame length wrong for its type")]
    BadLength,
    #[error("frame on the wrong stream for its type")]
    BadStream,
    #[error("header block not continued by CONTINUATION on its stream")]
    BrokenContinuation,
    #[error("CONTINUATION without an open header block")]
    StrayContinuation,
    #[error("bytes of the frame were lost in capture")]
    PayloadLost,
}

/// Why a header block did not reach HPACK; the table is out of step afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockLoss {
    /// Over the configured bound.
    TooLarge,
    /// A malformed frame or lost bytes cut it.
    Broken,
}

/// What the framer found, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Bytes of a DATA frame's payload (padding excluded), as they arrive.
    Data {
        stream_id: u32,
        bytes: &'a [u8],
        /// Where `bytes` begin in the direction's bytes (see [`FrameDecoder::position`]).
        at: Option<u64>,
        /// `bytes` begin the frame's payload (padding length aside).
        starts_frame: bool,
    },
    /// DATA payload bytes the capture lost.
    DataLost {
        stream_id: u32,
        len: u64,
    },
    /// The end of a DATA frame.
    DataEnd {
        stream_id: u32,
        end_stream: bool,
    },
    /// A complete header block: HEADERS (or PUSH_PROMISE) and its CONTINUATIONs.
    HeaderBlock {
        stream_id: u32,
        block: &'a [u8],
        end_stream: bool,
        push: bool,
        /// Where the block's first frame began in the direction's bytes (see
        /// [`FrameDecoder::position`]).
        at: Option<u64>,
    },
    /// A header block that could not be decoded.
    HeaderBlockLost {
        stream_id: u32,
        end_stream: bool,
        push: bool,
        why: BlockLoss,
        at: Option<u64>,
    },
    RstStream {
        stream_id: u32,
        error_code: u32,
    },
    GoAway {
        last_stream_id: u32,
        error_code: u32,
    },
    /// SETTINGS; `header_table_size` is the last SETTINGS_HEADER_TABLE_SIZE it carried.
    Settings {
        ack: bool,
        header_table_size: Option<u32>,
    },
    Ping {
        ack: bool,
    },
    WindowUpdate {
        stream_id: u32,
        increment: u32,
    },
    Priority {
        stream_id: u32,
    },
    /// A frame type this decoder does not know; skipped, as RFC 9113 §4.1 requires.
    Unknown {
        frame_type: u8,
    },
    Malformed {
        stream_id: u32,
        error: FrameError,
    },
    /// Bytes were lost across a frame boundary: frames resume at a plausible frame header.
    FramingLost,
    /// A hunt found a plausible frame header; `skipped` bytes went by meanwhile.
    Resynced {
        skipped: u64,
    },
    /// The direction was to start with the client preface and did not: not HTTP/2.
    NotHttp2,
    /// A hunt found the client preface: this is the connection's start.
    Preface,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    length: u32,
    frame_type: u8,
    flags: u8,
    stream_id: u32,
}

impl Header {
    fn parse(b: &[u8; HEADER_LEN]) -> Self {
        Self {
            length: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            frame_type: b[3],
            flags: b[4],
            stream_id: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// Fields before the body: pad length, priority, promised stream id.
    fn prefix_len(&self) -> usize {
        let padded = matches!(
            self.frame_type,
            kind::DATA | kind::HEADERS | kind::PUSH_PROMISE
        ) && self.has(flag::PADDED);
        usize::from(padded)
            + match self.frame_type {
                kind::HEADERS if self.has(flag::PRIORITY) => 5,
                kind::PUSH_PROMISE => 4,
                _ => 0,
            }
    }

    /// The rules a frame of a known type must follow, checkable from its header alone.
    fn check(&self) -> Result<(), FrameError> {
        let on_stream = self.stream_id != 0;
        let (stream_ok, length_ok) = match self.frame_type {
            kind::DATA | kind::HEADERS | kind::PUSH_PROMISE | kind::CONTINUATION => {
                (on_stream, true)
            }
            kind::PRIORITY => (on_stream, self.length == 5),
            kind::RST_STREAM => (on_stream, self.length == 4),
            kind::SETTINGS => (
                !on_stream,
                self.length.is_multiple_of(6) && !(self.has(flag::ACK) && self.length != 0),
            ),
            kind::PING => (!on_stream, self.length == 8),
            kind::GOAWAY => (!on_stream, self.length >= 8),
            kind::WINDOW_UPDATE => (true, self.length == 4),
            _ => (true, true),
        };
        if !stream_ok {
            return Err(FrameError::BadStream);
        }
        if !length_ok || self.prefix_len() > self.length as usize {
            return Err(FrameError::BadLength);
        }
        Ok(())
    }

    /// Strict enough that random bytes rarely pass: a known type, only its defined flags, the
    /// reserved bit clear, a modest length.
    fn plausible(raw: &[u8; HEADER_LEN]) -> bool {
        let h = Self::parse(raw);
        let defined = match h.frame_type {
            kind::DATA => flag::END_STREAM | flag::PADDED,
            kind::HEADERS => flag::END_STREAM | flag::END_HEADERS | flag::PADDED | flag::PRIORITY,
            kind::SETTINGS | kind::PING => flag::ACK,
            kind::PUSH_PROMISE => flag::END_HEADERS | flag::PADDED,
            kind::PRIORITY | kind::RST_STREAM | kind::GOAWAY | kind::WINDOW_UPDATE => 0,
            // A CONTINUATION cannot start a hunt: its block's start was lost.
            _ => return false,
        };
        raw[5] & 0x80 == 0
            && h.flags & !defined == 0
            && h.length <= HUNT_MAX_FRAME
            && h.check().is_ok()
    }
}

/// Whether `bytes` start with a plausible frame header, and so do the next few frames they hold.
/// Bytes lost that can be counted: `u64::MAX` stands for an unknown number (dropped records),
/// which adds nothing to the count of bytes skipped.
fn known(lost: u64) -> u64 {
    if lost == u64::MAX { 0 } else { lost }
}

fn plausible_start(bytes: &[u8]) -> bool {
    let mut rest = bytes;
    for _ in 0..=HUNT_CHAIN {
        let Some(raw) = rest.first_chunk::<HEADER_LEN>() else {
            // The first header must be whole; later ones may be cut by the syscall's end.
            return rest.len() != bytes.len();
        };
        if !Header::plausible(raw) {
            return false;
        }
        let next = HEADER_LEN + Header::parse(raw).length as usize;
        match rest.get(next..) {
            Some(after) if !after.is_empty() => rest = after,
            _ => return true,
        }
    }
    true
}

/// Whether `bytes` are whole, plausible frames end to end (at least one): how a syscall of an
/// HTTP/2 connection joined mid-connection looks, and what other protocols almost never do.
pub fn whole_frames(bytes: &[u8]) -> bool {
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(raw) = rest.first_chunk::<HEADER_LEN>() else {
            return false;
        };
        if !Header::plausible(raw) {
            return false;
        }
        let next = HEADER_LEN + Header::parse(raw).length as usize;
        let Some(after) = rest.get(next..) else {
            return false;
        };
        rest = after;
    }
    !bytes.is_empty()
}

/// A header block being gathered across HEADERS/PUSH_PROMISE and CONTINUATION frames.
#[derive(Debug, Clone, Copy)]
struct OpenBlock {
    stream_id: u32,
    end_stream: bool,
    push: bool,
    loss: Option<BlockLoss>,
    at: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Collecting the fields before the body (`prefix_len` bytes).
    Prefix,
    Body,
    Padding,
    /// The rest of the frame is skipped (malformed, unknown type, lost).
    Skip,
}

#[derive(Debug)]
enum State {
    /// Matching the client preface; `usize` bytes of it matched.
    Preface(usize),
    /// Collecting a frame header.
    Header,
    Payload,
    /// Framing lost: waiting for a syscall that starts with a plausible frame.
    Hunting {
        skipped: u64,
    },
    /// Not HTTP/2: nothing more is decoded.
    Failed,
}

/// The framer of one direction.
#[derive(Debug)]
pub struct FrameDecoder {
    state: State,
    max_block: usize,
    head: [u8; HEADER_LEN],
    head_len: usize,
    frame: Header,
    phase: Phase,
    /// Payload bytes of the current frame not consumed yet.
    left: usize,
    /// Body bytes (after the prefix, before the padding) not consumed yet.
    body_left: usize,
    /// The body's length: a piece taken while `body_left` still equals it begins the body.
    body_len: usize,
    /// HEADERS frames begun so far.
    blocks_begun: u32,
    /// The prefix fields, or a control frame's fixed fields (at most 8 bytes are needed).
    fixed: [u8; 8],
    fixed_len: usize,
    /// SETTINGS entries are read 6 bytes at a time.
    setting: [u8; 6],
    setting_len: usize,
    table_size: Option<u32>,
    block: Vec<u8>,
    open: Option<OpenBlock>,
    /// Bytes of the direction fed so far, captured or lost (None after a loss of unknown
    /// size): where each frame lies in the byte stream, for matching frames to the TCP
    /// segments that carried them.
    pos: Option<u64>,
    /// Where the frame being read began.
    frame_at: Option<u64>,
}

impl FrameDecoder {
    /// `expect_preface`: the client's direction from the connection's start. `at_frame`: the
    /// first bytes begin a frame (the server's direction from the start); otherwise the first
    /// bytes are hunted for a frame header, as after a loss.
    pub fn new(expect_preface: bool, at_frame: bool, max_block: usize) -> Self {
        let state = if expect_preface {
            State::Preface(0)
        } else if at_frame {
            State::Header
        } else {
            State::Hunting { skipped: 0 }
        };
        Self {
            state,
            max_block,
            head: [0; HEADER_LEN],
            head_len: 0,
            frame: Header {
                length: 0,
                frame_type: 0,
                flags: 0,
                stream_id: 0,
            },
            phase: Phase::Skip,
            left: 0,
            body_left: 0,
            body_len: 0,
            blocks_begun: 0,
            fixed: [0; 8],
            fixed_len: 0,
            setting: [0; 6],
            setting_len: 0,
            table_size: None,
            block: Vec::new(),
            open: None,
            pos: Some(0),
            frame_at: None,
        }
    }

    /// Bytes of this direction fed so far (captured and lost), from the first fed; None once
    /// a loss of unknown size made it unknown.
    pub fn position(&self) -> Option<u64> {
        self.pos
    }

    fn move_position(&mut self, n: u64) {
        self.pos = match n {
            u64::MAX => None,
            n => self.pos.map(|p| p.saturating_add(n)),
        };
    }

    /// HEADERS frames whose frame header was read so far (a request's or trailers' first frame).
    pub fn blocks_begun(&self) -> u32 {
        self.blocks_begun
    }

    /// Whether a header block is being gathered: its HEADERS frame began, its last frame did not
    /// end yet.
    pub fn block_open(&self) -> bool {
        self.open.is_some()
    }

    /// Whether the direction turned out not to be HTTP/2.
    pub fn failed(&self) -> bool {
        matches!(self.state, State::Failed)
    }

    /// Feeds one syscall's captured bytes, then the `lost` bytes that followed them.
    pub fn feed(&mut self, mut bytes: &[u8], lost: u64, on: &mut dyn FnMut(Frame<'_>)) {
        if let State::Hunting { skipped } = self.state {
            if let Some(rest) = bytes.strip_prefix(PREFACE.as_slice()) {
                // The connection's start after all (its server spoke first): frames follow.
                self.state = State::Header;
                on(Frame::Preface);
                bytes = rest;
                self.move_position(PREFACE.len() as u64);
            } else if plausible_start(bytes) {
                self.state = State::Header;
                on(Frame::Resynced { skipped });
            } else {
                self.state = State::Hunting {
                    skipped: skipped
                        .saturating_add(bytes.len() as u64)
                        .saturating_add(known(lost)),
                };
                self.move_position(bytes.len() as u64);
                self.move_position(lost);
                return;
            }
        }
        while !bytes.is_empty() {
            let used = match self.state {
                State::Preface(matched) => self.preface(matched, bytes, on),
                State::Header => self.header(bytes, on),
                State::Payload => self.payload(bytes, on),
                State::Hunting { .. } | State::Failed => {
                    self.move_position(bytes.len() as u64);
                    self.move_position(lost);
                    return;
                }
            };
            self.move_position(used as u64);
            bytes = bytes.get(used..).unwrap_or_default();
        }
        if lost > 0 {
            self.lose(lost, on);
            self.move_position(lost);
        }
    }

    fn preface(&mut self, matched: usize, bytes: &[u8], on: &mut dyn FnMut(Frame<'_>)) -> usize {
        let want = PREFACE.get(matched..).unwrap_or_default();
        let n = want.len().min(bytes.len());
        if want.get(..n) != bytes.get(..n) {
            self.state = State::Failed;
            on(Frame::NotHttp2);
            return bytes.len();
        }
        self.state = if matched + n == PREFACE.len() {
            State::Header
        } else {
            State::Preface(matched + n)
        };
        n
    }

    fn header(&mut self, bytes: &[u8], on: &mut dyn FnMut(Frame<'_>)) -> usize {
        if self.head_len == 0 {
            self.frame_at = self.pos;
        }
        let n = (HEADER_LEN - self.head_len).min(bytes.len());
        if let (Some(dst), Some(src)) = (
            self.head.get_mut(self.head_len..self.head_len + n),
            bytes.get(..n),
        ) {
            dst.copy_from_slice(src);
        }
        self.head_len += n;
        if self.head_len == HEADER_LEN {
            self.head_len = 0;
            self.start_frame(Header::parse(&self.head), on);
        }
        n
    }

    fn start_frame(&mut self, h: Header, on: &mut dyn FnMut(Frame<'_>)) {
        self.frame = h;
        self.left = h.length as usize;
        self.fixed_len = 0;
        self.setting_len = 0;
        self.table_size = None;
        self.phase = Phase::Prefix;
        if let Some(open) = self.open
            && (h.frame_type != kind::CONTINUATION || h.stream_id != open.stream_id)
        {
            // RFC 9113 §6.10: nothing may come between a header block's frames.
            self.open = None;
            self.block_lost(open, BlockLoss::Broken, on);
            on(Frame::Malformed {
                stream_id: open.stream_id,
                error: FrameError::BrokenContinuation,
            });
        }
        if h.frame_type == kind::HEADERS {
            self.blocks_begun = self.blocks_begun.wrapping_add(1);
        }
        if matches!(h.frame_type, kind::HEADERS | kind::PUSH_PROMISE) {
            // Opened even when malformed: HPACK must learn that a block went by.
            self.open = Some(OpenBlock {
                stream_id: h.stream_id,
                end_stream: h.frame_type == kind::HEADERS && h.has(flag::END_STREAM),
                push: h.frame_type == kind::PUSH_PROMISE,
                loss: None,
                at: self.frame_at,
            });
            wipe(&mut self.block);
        }
        if h.frame_type > kind::CONTINUATION {
            on(Frame::Unknown {
                frame_type: h.frame_type,
            });
            self.phase = Phase::Skip;
        } else if let Err(error) = h.check() {
            self.malformed(error, on);
        } else if h.frame_type == kind::CONTINUATION && self.open.is_none() {
            self.malformed(FrameError::StrayContinuation, on);
        }
        self.state = State::Payload;
        self.advance(on);
    }

    /// Moves to the next phase once the current one is done; ends the frame when all are.
    fn advance(&mut self, on: &mut dyn FnMut(Frame<'_>)) {
        if self.phase == Phase::Prefix && self.fixed_len == self.frame.prefix_len() {
            let pad = if self.frame.prefix_len() > 0 && self.frame.has(flag::PADDED) {
                usize::from(self.fixed[0])
            } else {
                0
            };
            match self.left.checked_sub(pad) {
                Some(body) => {
                    self.body_left = body;
                    self.body_len = body;
                    self.phase = Phase::Body;
                    self.fixed_len = 0;
                }
                None => self.malformed(FrameError::BadPadding, on),
            }
        }
        if self.phase == Phase::Body && self.body_left == 0 {
            self.phase = Phase::Padding;
        }
        if self.left == 0 {
            self.end_frame(on);
        }
    }

    fn malformed(&mut self, error: FrameError, on: &mut dyn FnMut(Frame<'_>)) {
        let h = self.frame;
        if matches!(
            h.frame_type,
            kind::HEADERS | kind::PUSH_PROMISE | kind::CONTINUATION
        ) && let Some(open) = self.open.as_mut()
        {
            open.loss = Some(BlockLoss::Broken);
        }
        on(Frame::Malformed {
            stream_id: h.stream_id,
            error,
        });
        self.phase = Phase::Skip;
    }

    fn payload(&mut self, bytes: &[u8], on: &mut dyn FnMut(Frame<'_>)) -> usize {
        let take = match self.phase {
            Phase::Prefix => (self.frame.prefix_len() - self.fixed_len).min(bytes.len()),
            Phase::Body => self.body_left.min(bytes.len()),
            Phase::Padding | Phase::Skip => self.left.min(bytes.len()),
        };
        let piece = bytes.get(..take).unwrap_or_default();
        match self.phase {
            Phase::Prefix => self.keep_fixed(piece),
            Phase::Body => {
                self.body(piece, on);
                self.body_left -= take;
            }
            Phase::Padding | Phase::Skip => {}
        }
        self.left -= take;
        self.advance(on);
        take
    }

    fn keep_fixed(&mut self, piece: &[u8]) {
        for &b in piece {
            if let Some(slot) = self.fixed.get_mut(self.fixed_len) {
                *slot = b;
                self.fixed_len += 1;
            }
        }
    }

    fn body(&mut self, piece: &[u8], on: &mut dyn FnMut(Frame<'_>)) {
        let h = self.frame;
        match h.frame_type {
            kind::DATA => on(Frame::Data {
                stream_id: h.stream_id,
                bytes: piece,
                at: self.pos,
                starts_frame: self.body_left == self.body_len,
            }),
            kind::HEADERS | kind::PUSH_PROMISE | kind::CONTINUATION => {
                if let Some(open) = self.open.as_mut()
                    && open.loss.is_none()
                {
                    if self.block.len() + piece.len() > self.max_block {
                        open.loss = Some(BlockLoss::TooLarge);
                        wipe(&mut self.block);
                    } else {
                        self.block.extend_from_slice(piece);
                    }
                }
            }
            kind::SETTINGS => {
                for &b in piece {
                    if let Some(slot) = self.setting.get_mut(self.setting_len) {
                        *slot = b;
                        self.setting_len += 1;
                    }
                    if self.setting_len == self.setting.len() {
                        self.setting_len = 0;
                        let [i0, i1, v0, v1, v2, v3] = self.setting;
                        if u16::from_be_bytes([i0, i1]) == SETTINGS_HEADER_TABLE_SIZE {
                            self.table_size = Some(u32::from_be_bytes([v0, v1, v2, v3]));
                        }
                    }
                }
            }
            // Only the first 8 bytes of GOAWAY (its debug data is skipped) and of the others.
            _ => self.keep_fixed(piece),
        }
    }

    fn end_frame(&mut self, on: &mut dyn FnMut(Frame<'_>)) {
        self.state = State::Header;
        let h = self.frame;
        let f = self.fixed;
        let word = |i: usize| {
            let b = f.get(i..i + 4).and_then(|s| <[u8; 4]>::try_from(s).ok());
            b.map_or(0, u32::from_be_bytes)
        };
        match h.frame_type {
            // Even a malformed DATA frame's header says whether it ended its stream.
            kind::DATA => on(Frame::DataEnd {
                stream_id: h.stream_id,
                end_stream: h.has(flag::END_STREAM),
            }),
            kind::HEADERS | kind::PUSH_PROMISE | kind::CONTINUATION if h.has(flag::END_HEADERS) => {
                self.finish_block(on)
            }
            // A header block continues in the next frame.
            kind::HEADERS | kind::PUSH_PROMISE | kind::CONTINUATION => {}
            // A skipped frame's event (Unknown, Malformed) was given already.
            _ if self.phase == Phase::Skip => {}
            kind::RST_STREAM => on(Frame::RstStream {
                stream_id: h.stream_id,
                error_code: word(0),
            }),
            kind::GOAWAY => on(Frame::GoAway {
                last_stream_id: word(0) & 0x7fff_ffff,
                error_code: word(4),
            }),
            kind::SETTINGS => on(Frame::Settings {
                ack: h.has(flag::ACK),
                header_table_size: self.table_size,
            }),
            kind::PING => on(Frame::Ping {
                ack: h.has(flag::ACK),
            }),
            kind::WINDOW_UPDATE => on(Frame::WindowUpdate {
                stream_id: h.stream_id,
                increment: word(0) & 0x7fff_ffff,
            }),
            kind::PRIORITY => on(Frame::Priority {
                stream_id: h.stream_id,
            }),
            _ => {}
        }
    }

    /// The block's last frame (END_HEADERS) ended: it goes to HPACK, or is reported lost.
    fn finish_block(&mut self, on: &mut dyn FnMut(Frame<'_>)) {
        let Some(open) = self.open.take() else {
            return;
        };
        match open.loss {
            None => {
                on(Frame::HeaderBlock {
                    stream_id: open.stream_id,
                    block: &self.block,
                    end_stream: open.end_stream,
                    push: open.push,
                    at: open.at,
                });
                wipe(&mut self.block);
            }
            Some(why) => self.block_lost(open, why, on),
        }
    }

    fn block_lost(&mut self, open: OpenBlock, why: BlockLoss, on: &mut dyn FnMut(Frame<'_>)) {
        wipe(&mut self.block);
        on(Frame::HeaderBlockLost {
            stream_id: open.stream_id,
            end_stream: open.end_stream,
            push: open.push,
            why,
            at: open.at,
        });
    }

    /// `n` bytes the capture lost after what was fed.
    /// `n` bytes that followed were not captured (`u64::MAX`: an unknown number, records were
    /// dropped).
    fn lose(&mut self, n: u64, on: &mut dyn FnMut(Frame<'_>)) {
        let within = matches!(self.state, State::Payload) && n <= self.left as u64;
        if !within {
            if let Some(open) = self.open.take() {
                self.block_lost(open, BlockLoss::Broken, on);
            }
            if !matches!(self.state, State::Failed | State::Hunting { .. }) {
                self.head_len = 0;
                self.state = State::Hunting { skipped: known(n) };
                on(Frame::FramingLost);
            }
            return;
        }
        let h = self.frame;
        let n_usize = n as usize;
        match self.phase {
            Phase::Body if h.frame_type == kind::DATA && n_usize <= self.body_left => {
                on(Frame::DataLost {
                    stream_id: h.stream_id,
                    len: n,
                });
                self.body_left -= n_usize;
            }
            Phase::Body if h.frame_type == kind::DATA => {
                on(Frame::DataLost {
                    stream_id: h.stream_id,
                    len: self.body_left as u64,
                });
                self.body_left = 0;
                self.phase = Phase::Padding;
            }
            Phase::Padding | Phase::Skip => {}
            _ => {
                // A prefix, a header block fragment or a control frame's fields: the frame
                // means nothing without them.
                self.malformed(FrameError::PayloadLost, on);
                if h.frame_type == kind::DATA {
                    on(Frame::DataLost {
                        stream_id: h.stream_id,
                        len: n,
                    });
                }
            }
        }
        self.left -= n_usize;
        self.advance(on);
    }
}
