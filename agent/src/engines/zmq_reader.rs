//! The ZMQ socket reader that engines whose internal IPC rides on ZeroMQ (vLLM, SGLang) share:
//! one ZMTP stream per socket and direction, keyed by (process, fd) and restarted when the fd's
//! connection generation changes. It hands out whole ZMQ messages and knows nothing of what the
//! engine put in them: decoding stays in each engine's module.
use inferscope_decode::zmtp::{Message, ZmtpError, ZmtpLimits, ZmtpStream};
use inferscope_model::{Counter, Stats};
use rustc_hash::FxHashMap;

use super::{IpcBytes, IpcDirection, IpcVerdict};

/// Sockets followed at once; beyond this the table is cleared (counted) and streams restart
/// mid-stream.
const MAX_SOCKETS: usize = 4096;

struct Socket {
    conn_gen: u64,
    read: ZmtpStream,
    write: ZmtpStream,
}

/// The ZMTP streams of every socket an engine's processes use.
#[derive(Default)]
pub(crate) struct ZmqSockets {
    sockets: FxHashMap<(u32, i32), Socket>,
    limits: ZmtpLimits,
}

impl ZmqSockets {
    /// Feeds one captured syscall to its socket's stream; the messages it completed are appended
    /// to `messages`. Framing counters go to `stats`; a full socket table is counted as
    /// `table_full` (each engine keeps its own name for it). The verdict is `NotIpc` when the
    /// bytes are not ZMTP at all.
    pub(crate) fn feed(
        &mut self,
        b: &IpcBytes<'_>,
        stats: &mut Stats,
        table_full: Counter,
        messages: &mut Vec<Message>,
    ) -> IpcVerdict {
        let key = (b.tgid, b.fd);
        if self
            .sockets
            .get(&key)
            .is_some_and(|s| s.conn_gen != b.conn_gen)
        {
            self.sockets.remove(&key);
        }
        if !self.sockets.contains_key(&key) && self.sockets.len() >= MAX_SOCKETS {
            self.sockets.clear();
            stats.bump(table_full);
        }
        let limits = self.limits;
        let socket = self.sockets.entry(key).or_insert_with(|| Socket {
            conn_gen: b.conn_gen,
            read: ZmtpStream::new(limits),
            write: ZmtpStream::new(limits),
        });
        let stream = match b.direction {
            IpcDirection::Read => &mut socket.read,
            IpcDirection::Write => &mut socket.write,
        };
        let fed = stream.feed(b.data, b.lost, messages);
        stats.add(Counter::ZmtpFramesIncomplete, fed.frames_incomplete);
        stats.add(Counter::ZmtpFramesDropped, fed.frames_dropped);
        stats.add(Counter::ZmtpHuntSkipped, fed.hunt_skipped);
        match stream.failed() {
            Some(ZmtpError::Desync) => {
                // Lost across a frame header: look for the next frame boundary.
                stats.bump(ZmtpError::Desync.counter());
                *stream = ZmtpStream::mid_stream(limits);
                IpcVerdict::Keep
            }
            Some(e) => {
                stats.bump(e.counter());
                self.sockets.remove(&key);
                IpcVerdict::NotIpc
            }
            None => IpcVerdict::Keep,
        }
    }

    pub(crate) fn close(&mut self, tgid: u32, fd: i32) {
        self.sockets.remove(&(tgid, fd));
    }

    pub(crate) fn forget_process(&mut self, tgid: u32) {
        self.sockets.retain(|(t, _), _| *t != tgid);
    }
}
