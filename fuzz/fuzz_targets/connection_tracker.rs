//! Drives the per-connection tracker with keep-alive exchanges in which records are dropped
//! (kernel record numbers jump, response heads among them counted), captures are truncated, and
//! arbitrary bytes are read or written. Beyond "never panics": open requests stay bounded, and
//! the tracker never reports more answered requests (records with a status, plus answers whose
//! request it never saw) than response heads it was shown.
//!
//! Input layout: one op per byte (low 3 bits: what; high bits: a parameter); `raw` ops take
//! their bytes from the input that follows.
#![no_main]
use inferscope::testing::{LOST_REQUEST_NOT_CAPTURED, Peer, SyscallEvent, SyscallKind, Tracker};
use inferscope_decode::http::Limits;
use libfuzzer_sys::fuzz_target;

const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
const TOKEN: &[u8] = b"2d\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n\r\n";
const END: &[u8] = b"0\r\n\r\n";
const REQUEST: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"stream\":1}\n";

struct Feed {
    t: Tracker,
    out: Vec<inferscope_model::RequestRecord>,
    /// The kernel's next read and write numbers (reads and writes are numbered apart).
    seq: [u32; 2],
    lost_heads: u32,
    ts: u64,
    heads_shown: u64,
}

impl Feed {
    fn event(&mut self, kind: SyscallKind, payload: &[u8], cut: usize) {
        self.event_as(kind, payload, cut, false)
    }

    /// `token`: the write goes as the kernel's payload-free token record of `payload`.
    fn event_as(&mut self, kind: SyscallKind, payload: &[u8], cut: usize, token: bool) {
        self.ts += 10;
        let shown = &payload[..payload.len().saturating_sub(cut)];
        if kind == SyscallKind::Write {
            self.heads_shown += shown.windows(7).filter(|w| *w == b"HTTP/1.").count() as u64;
        }
        let ev = SyscallEvent {
            kind,
            tgid: 1,
            tid: 2,
            fd: 3,
            ts_enter_ns: self.ts,
            ts_exit_ns: self.ts,
            ret: payload.len() as i64,
            truncated: cut > 0,
            copy_failed: false,
            conn_gen: 0,
            conn_flags: 0,
            sock: 0,
            conn_seq: Some(if kind == SyscallKind::Read {
                self.seq[0]
            } else {
                self.seq[1]
            }),
            read_seq: (kind == SyscallKind::Close).then_some(self.seq[0]),
            lost_heads: self.lost_heads,
            payload: if token { b"" } else { shown },
            more: false,
            chunk_offset: None,
            token,
        };
        match kind {
            SyscallKind::Read => self.seq[0] = self.seq[0].wrapping_add(1),
            SyscallKind::Write => self.seq[1] = self.seq[1].wrapping_add(1),
            SyscallKind::Accept => self.seq = [0, 0],
            _ => {}
        }
        let peer = Peer::default();
        match kind {
            SyscallKind::Read => self.t.on_read(&ev, peer, &mut self.out),
            SyscallKind::Write => self.t.on_write(&ev, peer, &mut self.out),
            SyscallKind::Close => self.t.on_close(&ev, &mut self.out),
            SyscallKind::Shutdown => self.t.on_shutdown(&ev),
            // A TLS handshake's end: moves where the next request's wire arrival is looked for.
            SyscallKind::Tls => self.t.on_tls_handshake(&SyscallEvent { ret: 1, ..ev }),
            SyscallKind::Accept => {
                let ev = SyscallEvent { ret: 3, ..ev };
                self.t.on_accept(&ev, peer, &mut self.out)
            }
            // The kernel keeps dups to itself; the pipeline never hands one to the tracker.
            SyscallKind::Dup => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut f = Feed {
        t: Tracker::new(Limits {
            max_head_bytes: 512,
            max_body_bytes: 256,
            max_sse_event_bytes: 128,
        }),
        out: Vec::new(),
        seq: [0, 0],
        lost_heads: 0,
        ts: 0,
        heads_shown: 0,
    };
    let mut i = 0;
    while let Some(&op) = data.get(i) {
        i += 1;
        let param = usize::from(op >> 3);
        match op & 7 {
            0 => f.event(SyscallKind::Read, REQUEST, param % 4 * 7),
            1 => f.event(SyscallKind::Write, HEAD, 0),
            // A token event: cut by back-pressure, or summarised by the kernel (a token record,
            // in step with the stream or not).
            2 => f.event_as(SyscallKind::Write, TOKEN, param % 3 * 5, param % 4 == 3),
            3 => f.event(SyscallKind::Write, END, 0),
            4 => {
                // Records lost in the ring buffer; some were response heads.
                let records = (param % 8) as u32 + 1;
                // Reads or writes (by the parameter's parity); heads only among writes.
                let dir = param % 2;
                f.seq[dir] = f.seq[dir].wrapping_add(records);
                if dir == 1 {
                    f.lost_heads = f
                        .lost_heads
                        .wrapping_add((param / 8) as u32 % (records + 1));
                }
            }
            5 | 6 => {
                let len = param.min(data.len() - i);
                let bytes = &data[i..i + len];
                i += len;
                let kind = if op & 7 == 5 {
                    SyscallKind::Read
                } else {
                    SyscallKind::Write
                };
                f.event(kind, bytes, 0);
            }
            _ => match param % 4 {
                0 => f.event(SyscallKind::Close, b"", 0),
                1 => f.event(SyscallKind::Accept, b"", 0),
                2 => f.event(SyscallKind::Tls, b"", 0),
                _ => f.event(SyscallKind::Shutdown, b"", 0),
            },
        }
        assert!(f.t.open_requests() <= 65, "open requests are bounded");
    }
    f.t.finish_all(f.ts + 1, &mut f.out);
    let answered = f.out.iter().filter(|r| r.status.is_some()).count() as u64
        + f.t.stats().get(LOST_REQUEST_NOT_CAPTURED);
    assert!(
        answered <= f.heads_shown,
        "{answered} answered requests reported, {} response heads shown",
        f.heads_shown
    );
    for r in &f.out {
        assert!(!(r.aborted && r.incomplete.as_deref() == Some("agent_shutdown")));
    }
});
