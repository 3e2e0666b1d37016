//! One TCP connection of a traced server: requests read in order, responses written in the same
//! order (HTTP/1.1 keep-alive and pipelining).
use std::collections::VecDeque;

use crate::{
    capture::SyscallEvent,
    decode::http::{Chunk, Limits, RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent},
};

use super::{
    Peer, RequestRecord, Stats, Work,
    arrivals::ArrivalIndex,
    record::EndedBy,
    request::{RecordContext, RequestProgress},
};

/// Requests read but not yet answered, per connection. Requests and connections are boxed so
/// that idle table slots and queue capacity cost a pointer, not a whole struct (10k in flight).
const MAX_WAITING: usize = 64;

pub struct Connection {
    pub id: u64,
    pid: u32,
    engine: &'static str,
    pub peer: Peer,
    requests: RequestDecoder,
    responses: ResponseDecoder,
    /// The request whose bytes are being read.
    reading: Option<Box<RequestProgress>>,
    /// Fully read requests, oldest first; the front one owns the response being written.
    waiting: VecDeque<Box<RequestProgress>>,
    next_seq: u32,
    /// When the previous response ended: the next request's bytes arrived after it.
    last_response_end_ns: u64,
    /// Not HTTP, or framing lost: nothing more is decoded on this connection.
    failed: bool,
    /// A request did not parse: no more requests are decoded here, but the answer to it is
    /// (servers answer malformed requests with a 4xx, users want to see those).
    requests_failed: bool,
}

impl Connection {
    pub fn new(id: u64, pid: u32, engine: &'static str, peer: Peer, limits: Limits) -> Self {
        Self {
            id,
            pid,
            engine,
            peer,
            requests: RequestDecoder::new(limits),
            responses: ResponseDecoder::new(limits),
            reading: None,
            waiting: VecDeque::new(),
            next_seq: 0,
            last_response_end_ns: 0,
            failed: false,
            requests_failed: false,
        }
    }

    pub fn context(&self, unix_offset_ns: u64, last_loss_ns: u64) -> RecordContext<'static> {
        RecordContext {
            pid: self.pid,
            engine: self.engine,
            connection_id: self.id,
            unix_offset_ns,
            last_loss_ns,
            preexisting: self.peer.preexisting,
        }
    }

    pub fn learn_peer(&mut self, peer: Peer) {
        if self.peer.sock == 0 {
            self.peer.sock = peer.sock;
        }
        self.peer.preexisting |= peer.preexisting;
        if self.peer.remote.is_none() {
            self.peer.remote = peer.remote;
        }
        if self.peer.local_port.is_none() {
            self.peer.local_port = peer.local_port;
        }
    }

    pub fn on_read(
        &mut self,
        ev: &SyscallEvent<'_>,
        arrivals: &mut ArrivalIndex,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) {
        if ev.ret <= 0 {
            // EOF or reset from the peer: whatever is still being answered was abandoned.
            self.abort_all(ev.ts_exit_ns, EndedBy::Client, work.stats, ctx, work.out);
            return;
        }
        if self.failed || self.requests_failed {
            return;
        }
        let chunk = Chunk {
            bytes: ev.payload,
            lost: ev.lost_bytes(),
            ts_ns: ev.ts_exit_ns,
        };
        let mut events = std::mem::take(work.request_events);
        self.requests.feed(chunk, &mut events);
        for event in events.drain(..) {
            match event {
                RequestEvent::Started { ts_ns } => {
                    // The kernel names the socket: its segments are this connection's, however
                    // late the accept. Connections that predate the agent join by address.
                    let wire_ns = match (self.peer.sock, self.peer.local_port, self.peer.remote) {
                        (sock, ..) if sock != 0 => {
                            arrivals.first_arrival_on(sock, self.last_response_end_ns, ts_ns)
                        }
                        (_, Some(port), Some(remote)) => {
                            arrivals.first_arrival(port, remote, self.last_response_end_ns, ts_ns)
                        }
                        _ => None,
                    };
                    if wire_ns.is_none() {
                        work.stats.bump("arrival_wire_unknown");
                    }
                    let mut progress =
                        Box::new(RequestProgress::new(self.next_seq, ev.tid, ts_ns, wire_ns));
                    self.next_seq += 1;
                    progress.truncated = ev.truncated && ev.lost_bytes() > 0;
                    if let Some(old) = self.reading.replace(progress) {
                        drop(old);
                        work.stats.bump("requests_incomplete");
                    }
                }
                RequestEvent::Complete(summary) => {
                    let Some(mut progress) = self.reading.take() else {
                        work.stats.bump("request_complete_without_start");
                        continue;
                    };
                    progress.request_bytes = summary.head_bytes + summary.body_bytes;
                    progress.truncated |= summary.body_truncated;
                    if summary.body_json_error {
                        work.stats.bump("request_body_json_error");
                    }
                    progress.summary = Some(summary);
                    work.read_complete = Some((ev.tid, progress.seq));
                    if self.waiting.len() >= MAX_WAITING {
                        work.stats.bump("requests_waiting_over_limit");
                        continue;
                    }
                    self.waiting.push_back(progress);
                }
                RequestEvent::Error(e) => {
                    work.stats.bump(e.as_str());
                    match self.reading.take() {
                        // Kept for the server's answer (a record if it answers, else nothing);
                        // only a connection that speaks HTTP at all can have one.
                        Some(mut progress) if self.waiting.len() < MAX_WAITING => {
                            work.stats.bump("requests_unparsed");
                            progress.unparsed = true;
                            progress.truncated |= ev.truncated;
                            self.waiting.push_back(progress);
                            self.requests_failed = true;
                        }
                        Some(_) => {
                            work.stats.bump("requests_unparsed");
                            self.fail(ev, work.to_ignore);
                        }
                        None => self.fail(ev, work.to_ignore),
                    }
                }
            }
        }
        *work.request_events = events;
    }

    pub fn on_write(&mut self, ev: &SyscallEvent<'_>, ctx: RecordContext<'_>, work: &mut Work<'_>) {
        if ev.ret < 0 {
            // EPIPE/ECONNRESET: the client went away mid-response.
            self.abort_all(ev.ts_enter_ns, EndedBy::Client, work.stats, ctx, work.out);
            return;
        }
        if self.failed {
            return;
        }
        let Some(target) = self.waiting.front_mut().or(self.reading.as_mut()) else {
            work.stats.bump("response_without_request");
            return;
        };
        target.response_bytes += ev.ret as u64;
        if target.first_byte_ns.is_none() {
            target.first_byte_ns = Some(ev.ts_enter_ns);
        }
        let is_head = target.summary.as_ref().is_some_and(|s| s.method == "HEAD");
        self.responses.set_next_is_head_reply(is_head);
        let chunk = Chunk {
            bytes: ev.payload,
            lost: ev.lost_bytes(),
            ts_ns: ev.ts_enter_ns,
        };
        let mut events = std::mem::take(work.response_events);
        self.responses.feed(chunk, &mut events);
        for event in events.drain(..) {
            self.apply_response_event(event, ev, ctx, work);
        }
        *work.response_events = events;
    }

    fn apply_response_event(
        &mut self,
        event: ResponseEvent,
        ev: &SyscallEvent<'_>,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) {
        let Some(target) = self.waiting.front_mut().or(self.reading.as_mut()) else {
            work.stats.bump("response_without_request");
            return;
        };
        match event {
            ResponseEvent::Head { ts_ns, status, .. } => {
                target.status = Some(status);
                target.first_byte_ns.get_or_insert(ts_ns);
            }
            ResponseEvent::Sse(sse) => {
                if sse.json_error {
                    work.stats.bump("sse_json_error");
                }
                target.on_sse(&sse);
            }
            ResponseEvent::Body(body) => target.on_body(body, work.stats),
            ResponseEvent::End { ts_ns, .. } => {
                self.last_response_end_ns = ts_ns;
                if let Some(done) = self.pop_answered() {
                    work.out
                        .push(done.into_record(ctx, ts_ns, EndedBy::Complete));
                }
            }
            ResponseEvent::Error(e) => {
                work.stats.bump(e.as_str());
                // Framing is lost: report what we have, marked truncated, and stop decoding.
                if let Some(mut done) = self.pop_answered() {
                    done.truncated = true;
                    work.out
                        .push(done.into_record(ctx, ev.ts_enter_ns, EndedBy::Complete));
                }
                self.fail(ev, work.to_ignore);
            }
        }
    }

    /// Requests the engine is working on: admitted, and neither the engine (where a hook says
    /// so) nor the response has finished.
    pub fn admitted_requests_mut(&mut self) -> impl Iterator<Item = &mut RequestProgress> {
        self.reading
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .map(|b| &mut **b)
            .filter(|r| r.admitted_ns.is_some() && r.engine_finished_ns.is_none())
    }

    /// The request with sequence number `seq`, if it is still open.
    pub fn request_mut(&mut self, seq: u32) -> Option<&mut RequestProgress> {
        self.reading
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .map(|b| &mut **b)
            .find(|r| r.seq == seq)
    }

    fn pop_answered(&mut self) -> Option<Box<RequestProgress>> {
        self.waiting.pop_front().or_else(|| self.reading.take())
    }

    fn fail(&mut self, ev: &SyscallEvent<'_>, to_ignore: &mut Vec<(u32, i32, u64)>) {
        if !self.failed {
            self.failed = true;
            to_ignore.push((ev.tgid, ev.fd, ev.conn_gen));
        }
    }

    /// Requests that were read completely but not fully answered end, cut by `by`; a request
    /// still being read was never complete and yields no record, nor does one that did not
    /// parse and got no answer.
    fn abort_all(
        &mut self,
        ts_ns: u64,
        by: EndedBy,
        stats: &mut Stats,
        ctx: RecordContext<'_>,
        out: &mut Vec<RequestRecord>,
    ) {
        let counter = match by {
            EndedBy::Client => "requests_aborted",
            EndedBy::Server => "requests_cut_by_server",
            EndedBy::Complete | EndedBy::Unknown => "requests_unfinished",
        };
        for progress in self.waiting.drain(..) {
            if progress.unparsed && !progress.response_started() {
                stats.bump("requests_unparsed_unanswered");
                continue;
            }
            stats.bump(counter);
            out.push(progress.into_record(ctx, ts_ns, by));
        }
        if let Some(progress) = self.reading.take() {
            if progress.response_started() {
                stats.bump(counter);
                out.push(progress.into_record(ctx, ts_ns, by));
            } else {
                stats.bump("requests_incomplete");
            }
        }
        self.requests.reset();
        self.responses.reset();
    }

    /// The connection ends on the server's side: its close (`by` = server), its process
    /// exiting, or the agent stopping (`by` = unknown).
    pub fn close(
        mut self,
        ts_ns: u64,
        by: EndedBy,
        stats: &mut Stats,
        ctx: RecordContext<'_>,
        out: &mut Vec<RequestRecord>,
    ) {
        // A body delimited by the connection's close (no length, not chunked) is complete now.
        let mut events = Vec::new();
        self.responses.close(ts_ns, &mut events);
        for event in events {
            match event {
                ResponseEvent::Body(body) => {
                    if let Some(target) = self.waiting.front_mut().or(self.reading.as_mut()) {
                        target.on_body(body, stats);
                    }
                }
                ResponseEvent::End { ts_ns, .. } => {
                    if let Some(done) = self.pop_answered() {
                        out.push(done.into_record(ctx, ts_ns, EndedBy::Complete));
                    }
                }
                _ => {}
            }
        }
        self.abort_all(ts_ns, by, stats, ctx, out);
    }
}
