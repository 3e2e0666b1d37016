//! ZMTP 3.x (ZeroMQ's wire protocol, RFC 23/37) for one direction of one connection: the
//! greeting, commands (READY's Socket-Type and Identity) and multipart messages.
//!
//! Bytes come as captured syscall payloads: one syscall may hold several frames and one frame may
//! span syscalls, and the kernel copies only a prefix of each syscall (`lost` bytes follow the
//! copied ones). Bytes lost inside a frame body leave the frame marked incomplete and decoding
//! continues after it; bytes lost across a frame header cannot be re-synchronised (ZMTP has no
//! frame marker), so the stream stops decoding and says so. Every buffer is bounded.

mod frame;

pub use frame::{Frame, Message};

/// Bounds for one stream.
#[derive(Debug, Clone, Copy)]
pub struct ZmtpLimits {
    /// Bytes kept of one frame body; the rest is counted and skipped.
    pub max_frame_keep: usize,
    /// Frames kept of one multipart message; further frames are dropped (counted).
    pub max_frames: usize,
}

impl Default for ZmtpLimits {
    fn default() -> Self {
        Self {
            max_frame_keep: 256 * 1024,
            max_frames: 16,
        }
    }
}

/// Why a stream stopped decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ZmtpError {
    #[error("not a ZMTP 3.x greeting")]
    NotZmtp,
    #[error("ZMTP version before 3.0")]
    OldVersion,
    #[error(
        "captured bytes were lost across a frame boundary; the stream cannot be re-synchronised"
    )]
    Desync,
}

impl ZmtpError {
    pub fn as_str(&self) -> &'static str {
        match self {
            ZmtpError::NotZmtp => "zmtp_not_zmtp",
            ZmtpError::OldVersion => "zmtp_old_version",
            ZmtpError::Desync => "zmtp_desync",
        }
    }

    /// The agent counter this failure is counted in.
    pub fn counter(&self) -> inferscope_model::Counter {
        use inferscope_model::Counter;

        match self {
            ZmtpError::NotZmtp => Counter::ZmtpNotZmtp,
            ZmtpError::OldVersion => Counter::ZmtpOldVersion,
            ZmtpError::Desync => Counter::ZmtpDesync,
        }
    }
}

/// What one `feed` produced besides messages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FeedStats {
    /// Frames whose body was not fully captured (lost or beyond `max_frame_keep`).
    pub frames_incomplete: u64,
    /// Frames dropped because a message had more than `max_frames`.
    pub frames_dropped: u64,
    pub commands: u64,
    /// Syscall payloads skipped while looking for a frame boundary (see [`ZmtpStream::feed`]).
    pub hunt_skipped: u64,
}

/// Payloads that fail to line up with frames before a stream without a greeting is judged not
/// to be ZMTP at all.
const MAX_HUNT: u32 = 64;

const GREETING_LEN: usize = 64;
const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

#[derive(Debug)]
enum State {
    Greeting {
        buf: [u8; GREETING_LEN],
        have: usize,
    },
    /// Joined mid-connection (the agent attached after the handshake, or bytes were lost): wait
    /// for a syscall payload that is exactly a run of whole frames ending a message. libzmq
    /// writes from its batch buffer, so an uncongested socket's syscalls start on a frame.
    Hunting {
        failures: u32,
    },
    Header {
        buf: [u8; 9],
        have: usize,
    },
    Body(frame::Partial),
    Failed(ZmtpError),
}

#[derive(Debug)]
pub struct ZmtpStream {
    limits: ZmtpLimits,
    state: State,
    /// Frames of the message being assembled.
    frames: Vec<Frame>,
    /// The sender's socket type from its READY command ("ROUTER", "PUSH", ...).
    socket_type: Option<String>,
    identity: Option<Vec<u8>>,
    mechanism: Option<[u8; 20]>,
}

impl ZmtpStream {
    pub fn new(limits: ZmtpLimits) -> Self {
        Self {
            limits,
            state: State::Greeting {
                buf: [0; GREETING_LEN],
                have: 0,
            },
            frames: Vec::new(),
            socket_type: None,
            identity: None,
            mechanism: None,
        }
    }

    /// A stream whose start was not seen: it looks for a frame boundary instead of a greeting.
    pub fn mid_stream(limits: ZmtpLimits) -> Self {
        let mut stream = Self::new(limits);
        stream.state = State::Hunting { failures: 0 };
        stream
    }

    /// The sending peer's socket type, once its READY command was read.
    pub fn socket_type(&self) -> Option<&str> {
        self.socket_type.as_deref()
    }

    pub fn identity(&self) -> Option<&[u8]> {
        self.identity.as_deref()
    }

    pub fn failed(&self) -> Option<ZmtpError> {
        match self.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Decodes `data`, then accounts for `lost` bytes that followed it on the wire. Complete
    /// messages are appended to `out`. Returns what was incomplete or dropped; a stream that
    /// failed stays failed (see [`ZmtpStream::failed`]).
    pub fn feed(&mut self, mut data: &[u8], lost: u64, out: &mut Vec<Message>) -> FeedStats {
        let mut stats = FeedStats::default();
        // A greeting starts with 0xff, a frame never does: anything else is a stream joined late.
        if let (State::Greeting { have: 0, .. }, Some(&first)) = (&self.state, data.first())
            && first != 0xff
        {
            self.state = State::Hunting { failures: 0 };
        }
        if let State::Hunting { failures } = &mut self.state {
            if lost == 0 && whole_frames(data) {
                self.state = State::Header {
                    buf: [0; 9],
                    have: 0,
                };
            } else {
                stats.hunt_skipped += 1;
                *failures += 1;
                if *failures > MAX_HUNT {
                    self.state = State::Failed(ZmtpError::NotZmtp);
                }
                return stats;
            }
        }
        while !data.is_empty() {
            match &mut self.state {
                State::Failed(_) | State::Hunting { .. } => return stats,
                State::Greeting { buf, have } => {
                    let n = (GREETING_LEN - *have).min(data.len());
                    buf[*have..*have + n].copy_from_slice(&data[..n]);
                    *have += n;
                    data = &data[n..];
                    // Reject a non-ZMTP stream as soon as its first byte says so.
                    if buf[0] != 0xff || (*have >= 10 && buf[9] & 0x01 != 0x01) {
                        self.state = State::Failed(ZmtpError::NotZmtp);
                        return stats;
                    }
                    if *have >= 11 && buf[10] < 3 {
                        self.state = State::Failed(ZmtpError::OldVersion);
                        return stats;
                    }
                    if *have == GREETING_LEN {
                        let mut mechanism = [0u8; 20];
                        mechanism.copy_from_slice(&buf[12..32]);
                        self.mechanism = Some(mechanism);
                        self.state = State::Header {
                            buf: [0; 9],
                            have: 0,
                        };
                    }
                }
                State::Header { buf, have } => {
                    if *have == 0 {
                        buf[0] = data[0];
                        *have = 1;
                        data = &data[1..];
                        continue;
                    }
                    let need = if buf[0] & FLAG_LONG != 0 { 9 } else { 2 };
                    let n = (need - *have).min(data.len());
                    buf[*have..*have + n].copy_from_slice(&data[..n]);
                    *have += n;
                    data = &data[n..];
                    if *have == need {
                        let flags = buf[0];
                        let size = if need == 9 {
                            u64::from_be_bytes([
                                buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7], buf[8],
                            ])
                        } else {
                            buf[1] as u64
                        };
                        self.state = State::Body(frame::Partial::new(
                            flags,
                            size,
                            self.limits.max_frame_keep,
                        ));
                        if size == 0 {
                            self.finish_frame(out, &mut stats);
                        }
                    }
                }
                State::Body(partial) => {
                    let used = partial.push(data);
                    data = &data[used..];
                    if partial.remaining() == 0 {
                        self.finish_frame(out, &mut stats);
                    }
                }
            }
        }
        if lost > 0 {
            self.lose(lost, out, &mut stats);
        }
        stats
    }

    fn lose(&mut self, lost: u64, out: &mut Vec<Message>, stats: &mut FeedStats) {
        match &mut self.state {
            State::Failed(_) => {}
            State::Body(partial) if lost <= partial.remaining() => {
                partial.skip(lost);
                if partial.remaining() == 0 {
                    self.finish_frame(out, stats);
                }
            }
            _ => {
                self.frames.clear();
                self.state = State::Failed(ZmtpError::Desync);
            }
        }
    }

    fn finish_frame(&mut self, out: &mut Vec<Message>, stats: &mut FeedStats) {
        let State::Body(partial) = std::mem::replace(
            &mut self.state,
            State::Header {
                buf: [0; 9],
                have: 0,
            },
        ) else {
            return;
        };
        let flags = partial.flags();
        let frame = partial.into_frame();
        if !frame.complete {
            stats.frames_incomplete += 1;
        }
        if flags & FLAG_COMMAND != 0 {
            stats.commands += 1;
            self.on_command(&frame);
            return;
        }
        if self.frames.len() < self.limits.max_frames {
            self.frames.push(frame);
        } else {
            stats.frames_dropped += 1;
        }
        if flags & FLAG_MORE == 0 {
            out.push(Message {
                frames: std::mem::take(&mut self.frames),
            });
        }
    }

    fn on_command(&mut self, frame: &Frame) {
        let body = &frame.data;
        let Some((&name_len, rest)) = body.split_first() else {
            return;
        };
        let Some(name) = rest.get(..name_len as usize) else {
            return;
        };
        if name != b"READY" {
            return;
        }
        let mut props = &rest[name_len as usize..];
        // Properties: 1-byte name length, name, 4-byte value length, value.
        while let Some((&n, tail)) = props.split_first() {
            let Some(key) = tail.get(..n as usize) else {
                return;
            };
            let tail = &tail[n as usize..];
            let Some(len) = tail.get(..4) else {
                return;
            };
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let Some(value) = tail.get(4..4 + len) else {
                return;
            };
            if key.eq_ignore_ascii_case(b"Socket-Type") {
                self.socket_type = std::str::from_utf8(value).ok().map(str::to_owned);
            } else if key.eq_ignore_ascii_case(b"Identity") {
                self.identity = Some(value.to_vec());
            }
            props = &tail[4 + len..];
        }
    }
}

/// Whether one syscall's bytes look like ZMTP: a greeting's start (0xff), or exactly a run of
/// whole frames ending a message. HTTP never does (its bytes start with a letter or a hex
/// digit, which are not frame flags).
pub fn looks_like_zmtp(data: &[u8]) -> bool {
    data.first() == Some(&0xff) || whole_frames(data)
}

/// Whether `data` is exactly a run of whole frames whose last one ends a message.
/// Whether `data` starts on a frame boundary: it is a run of whole frames ending a message, or
/// (a batch that libzmq cut at its 8 KiB send buffer) at least two whole messages followed by
/// part of another.
fn whole_frames(data: &[u8]) -> bool {
    let mut pos = 0usize;
    // Whole messages walked.
    let mut messages = 0u32;
    loop {
        let Some(&flags) = data.get(pos) else {
            return false;
        };
        if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 {
            return false;
        }
        let (header, size) = if flags & FLAG_LONG != 0 {
            let Some(b) = data.get(pos + 1..pos + 9) else {
                return false;
            };
            let mut be = [0u8; 8];
            be.copy_from_slice(b);
            (9usize, u64::from_be_bytes(be))
        } else {
            let Some(&b) = data.get(pos + 1) else {
                return false;
            };
            (2usize, b as u64)
        };
        let Some(end) = usize::try_from(size)
            .ok()
            .and_then(|s| pos.checked_add(header)?.checked_add(s))
        else {
            return false;
        };
        if end == data.len() {
            return flags & (FLAG_MORE | FLAG_COMMAND) == 0;
        }
        if end > data.len() {
            return messages >= 2 && flags & FLAG_COMMAND == 0;
        }
        if flags & (FLAG_MORE | FLAG_COMMAND) == 0 {
            messages += 1;
        }
        pos = end;
    }
}

#[cfg(test)]
mod tests;
