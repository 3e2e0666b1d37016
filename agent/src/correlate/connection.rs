//! One TCP connection of a traced server: requests read in order, responses written in the same
//! order (HTTP/1.1 keep-alive and pipelining).
//!
//! Losses never blind a connection: when the kernel's record numbers jump (ring buffer full) or
//! a decoder loses framing, the open requests are settled (`incomplete`, or counted as lost when
//! their response head itself was dropped) and decoding resumes at the next boundary it can
//! prove: a read that starts with a request line, a write that starts with a response head.
use std::collections::VecDeque;

use inferscope_common::SyscallKind;
use inferscope_decode::http::{
    Chunk, Limits, ParseError, RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent,
};
use inferscope_model::{Counter, EndedBy};

use super::{
    Peer, RequestRecord, Stats, TemplateUpdate, Work,
    arrivals::{ArrivalIndex, Pick},
    h2_connection::H2Connection,
    loss::{self, Ending, Reason},
    peer_close::PeerEnd,
    request::{RecordContext, RequestProgress},
};
use crate::capture::SyscallEvent;

/// Requests read but not yet answered, per connection. Requests and connections are boxed so
/// that idle table slots and queue capacity cost a pointer, not a whole struct (10k in flight).
const MAX_WAITING: usize = 64;

/// Reads skipped while looking for a request line on a connection that never spoke HTTP, before
/// capture is told to ignore it (TLS, HTTP/2 or another protocol on the server's port).
const MAX_HUNT_READS_BEFORE_HTTP: u32 = 16;

/// The longest a request's first bytes are taken to have waited in the kernel for the server's
/// accept. A socket's address is reused by later connections, and segments of one the agent
/// never tracked (it closed before the agent attached to its server) stay indexed under it:
/// older segments are not this connection's.
const MAX_ACCEPT_DELAY_NS: u64 = 2_000_000_000;

pub(super) struct Connection {
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
    /// When the server's TLS handshake completed, until the first request is read: the
    /// segments before it are the handshake's, save perhaps the last (see `wire_arrival`).
    tls_handshake_ns: Option<u64>,
    /// Not HTTP: nothing more is decoded on this connection.
    failed: bool,
    /// A request did not parse: no more requests are decoded here, but the answer to it is
    /// (servers answer malformed requests with a 4xx, users want to see those).
    requests_failed: bool,
    /// The kernel's numbers for the next read and write records of this fd, once one was seen.
    expected_read: Option<u32>,
    expected_write: Option<u32>,
    /// The kernel's count of lost response heads on this fd, as of the last record.
    lost_heads_seen: u32,
    /// After a loss (or when first seen mid-stream): reads are skipped until one starts a
    /// request line, writes until one starts a response head.
    hunt_request: bool,
    hunt_response: bool,
    /// Reads skipped while hunting.
    hunted_reads: u32,
    /// A request was decoded here: later garbage is a loss, not a protocol verdict.
    spoke_http: bool,
    /// When the server shut down its sending side (shutdown(2)): it answers nothing more, so
    /// what it reads afterwards is drained, and the client's close that follows is its reply.
    server_shut_ns: Option<u64>,
    /// When the connection was first seen (accepted, or joined mid-stream).
    pub opened_ns: u64,
    /// What the kernel saw of the client's end (its FIN, a reset after it).
    peer_end_seen: PeerEnd,
    /// Responses begun after the client's FIN, with their end time: complete only if
    /// the client did not reset the socket before the server closed it (see docs/src/record-fields.md,
    /// `ended_by`). Settled at the close.
    held: Vec<(Box<RequestProgress>, u64)>,
    /// Requests dropped at [`MAX_WAITING`] after the last waiting one: the next answers are
    /// theirs (see [`RequestProgress::dropped_before`]).
    dropped_tail: u32,
    /// When the last record of this connection was seen (its syscall's exit).
    pub last_event_ns: u64,
    /// The client began with the HTTP/2 preface: every syscall goes to HTTP/2 decoding.
    h2: Option<Box<H2Connection>>,
}

impl Connection {
    /// `fresh`: the connection was seen from its accept; otherwise it is joined mid-stream and
    /// decoding starts at the first provable request boundary.
    pub(super) fn new(
        id: u64,
        pid: u32,
        engine: &'static str,
        peer: Peer,
        limits: Limits,
        fresh: bool,
    ) -> Self {
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
            tls_handshake_ns: None,
            failed: false,
            requests_failed: false,
            expected_read: None,
            expected_write: None,
            lost_heads_seen: 0,
            hunt_request: !fresh,
            hunt_response: !fresh,
            hunted_reads: 0,
            spoke_http: false,
            server_shut_ns: None,
            opened_ns: 0,
            peer_end_seen: PeerEnd::default(),
            held: Vec::new(),
            dropped_tail: 0,
            last_event_ns: 0,
            h2: None,
        }
    }

    /// Queues a fully read request for its answer. At [`MAX_WAITING`] it is dropped instead, its
    /// place in the answer order kept: the answer that comes for it is skipped and counted lost.
    fn enqueue(&mut self, mut progress: Box<RequestProgress>, stats: &mut Stats) {
        if self.waiting.len() >= MAX_WAITING {
            stats.bump(Counter::RequestsWaitingOverLimit);
            self.dropped_tail = self.dropped_tail.saturating_add(1);
            return;
        }
        progress.dropped_before = std::mem::take(&mut self.dropped_tail);
        self.waiting.push_back(progress);
    }

    /// Whether the next answer is that of a request dropped at [`MAX_WAITING`]; if so, its place
    /// is used up.
    fn take_dropped_answer(&mut self) -> bool {
        let slot = match self.waiting.front_mut() {
            Some(front) if front.response_started() => return false,
            Some(front) => &mut front.dropped_before,
            None => &mut self.dropped_tail,
        };
        if *slot == 0 {
            return false;
        }
        *slot -= 1;
        true
    }

    /// Forgets the requests waiting for an answer, and the places of dropped ones.
    fn take_waiting(&mut self) -> VecDeque<Box<RequestProgress>> {
        self.dropped_tail = 0;
        std::mem::take(&mut self.waiting)
    }

    /// The connection is decoded as HTTP/2.
    pub(super) fn speaks_http2(&self) -> bool {
        self.h2.is_some()
    }

    /// What the kernel saw of the client's end of this connection's socket so far.
    pub(super) fn learn_peer_end(&mut self, end: PeerEnd) {
        self.peer_end_seen = end;
    }

    /// Where a request the client abandoned ends: at its FIN, if that came first (not before
    /// the server read the request).
    fn client_end_ns(&self, progress: &RequestProgress, ts_ns: u64) -> u64 {
        match self.peer_end_seen.fin_ns {
            Some(fin) if fin < ts_ns => fin.max(progress.read_ns),
            _ => ts_ns,
        }
    }

    /// The server shut down its sending side: requests not answered by now never will be.
    pub(super) fn on_server_shutdown(&mut self, ts_ns: u64) {
        self.server_shut_ns.get_or_insert(ts_ns);
    }

    /// Who ended what is left open when the peer's end shows (EOF or a reset on a read, a
    /// failed write): the client, unless the server had already shut the connection down
    /// (then the client's close only answered the server's).
    fn peer_end(&self) -> EndedBy {
        if self.server_shut_ns.is_some() {
            EndedBy::Server
        } else {
            EndedBy::Client
        }
    }

    pub(super) fn context(&self, unix_offset_ns: u64, last_loss_ns: u64) -> RecordContext<'static> {
        RecordContext {
            pid: self.pid,
            engine: self.engine,
            connection_id: self.id,
            unix_offset_ns,
            last_loss_ns,
            preexisting: self.peer.preexisting,
            tls: self.peer.tls,
        }
    }

    /// The server's TLS handshake on this connection completed at `ts_ns`.
    pub(super) fn tls_handshake_done(&mut self, ts_ns: u64) {
        self.tls_handshake_ns = Some(ts_ns);
    }

    /// When the bytes of the request the server began reading at `read_ns` reached the socket.
    /// The kernel names the socket: its segments are this connection's, however late the
    /// accept. Connections that predate the agent join by address.
    ///
    /// A TLS connection's first request follows its handshake, whose segments are not the
    /// request's. With TLS 1.2 the client sends the request after the server's last handshake
    /// write, so after the handshake's end. With TLS 1.3 the server's handshake ends when it
    /// reads the client's Finished, and the request may have come just behind it (or in the
    /// same segment): then the request is the last segment up to the handshake's end.
    fn wire_arrival(&mut self, arrivals: &mut ArrivalIndex, read_ns: u64) -> Option<u64> {
        let after = self.last_response_end_ns;
        let mut lookup = |after: u64, upto: u64, pick: Pick| match (
            self.peer.sock,
            self.peer.local_port,
            self.peer.remote,
        ) {
            (sock, ..) if sock != 0 => arrivals.arrival_on(sock, after, upto, pick),
            (_, Some(port), Some(remote)) => arrivals.arrival(port, remote, after, upto, pick),
            _ => None,
        };
        match self.tls_handshake_ns.take() {
            Some(handshake) if handshake > after && handshake <= read_ns => {
                let before = lookup(after, handshake, Pick::Last);
                lookup(handshake, read_ns, Pick::First).or(before)
            }
            _ => lookup(after, read_ns, Pick::First),
        }
    }

    /// The kernel saw this connection accepted at `ts_ns`: its first request's bytes came after
    /// its handshake, at most [`MAX_ACCEPT_DELAY_NS`] before that.
    pub(super) fn accepted_at(&mut self, ts_ns: u64) {
        self.opened_ns = ts_ns;
        self.last_response_end_ns = ts_ns.saturating_sub(MAX_ACCEPT_DELAY_NS);
    }

    pub(super) fn learn_peer(&mut self, peer: Peer) {
        if self.peer.sock == 0 {
            self.peer.sock = peer.sock;
        }
        self.peer.preexisting |= peer.preexisting;
        self.peer.tls |= peer.tls;
        if self.peer.remote.is_none() {
            self.peer.remote = peer.remote;
        }
        if self.peer.local_port.is_none() {
            self.peer.local_port = peer.local_port;
        }
    }

    /// Checks the kernel's record number of `ev` against the last one of its direction (reads
    /// and writes are numbered apart; a close carries both next numbers): a jump means records
    /// of this connection were dropped, and the open requests are settled before `ev` is
    /// decoded.
    pub(super) fn observe(
        &mut self,
        ev: &SyscallEvent<'_>,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        self.last_event_ns = self.last_event_ns.max(ev.ts_exit_ns);
        let Some(seq) = ev.conn_seq else {
            return;
        };
        let missing = match ev.kind {
            SyscallKind::Accept => {
                // Both directions number from 0 after an accept.
                self.expected_read = Some(0);
                self.expected_write = Some(0);
                self.lost_heads_seen = ev.lost_heads;
                return;
            }
            SyscallKind::Read => match step(&mut self.expected_read, seq, true) {
                Some(missing) => missing,
                None => {
                    stats.bump(Counter::ConnectionRecordsOutOfOrder);
                    return;
                }
            },
            SyscallKind::Write => match step(&mut self.expected_write, seq, true) {
                Some(missing) => missing,
                None => {
                    stats.bump(Counter::ConnectionRecordsOutOfOrder);
                    return;
                }
            },
            SyscallKind::Close => {
                let writes = step(&mut self.expected_write, seq, false).unwrap_or(0);
                let reads = ev
                    .read_seq
                    .and_then(|next| step(&mut self.expected_read, next, false))
                    .unwrap_or(0);
                writes.saturating_add(reads)
            }
            _ => return,
        };
        // Lost heads are writes: a read's view of the count waits for the writes' gap.
        if ev.kind == SyscallKind::Read {
            if missing > 0 {
                stats.add(Counter::ConnectionRecordsLost, u64::from(missing));
                self.gap_in(Lost::Reads, Reason::EventsLost, 0, ctx, stats, out);
            }
            return;
        }
        let lost_heads = ev.lost_heads.wrapping_sub(self.lost_heads_seen);
        self.lost_heads_seen = ev.lost_heads;
        if missing > 0 {
            stats.add(Counter::ConnectionRecordsLost, u64::from(missing));
            let lost = if ev.kind == SyscallKind::Write {
                Lost::Writes
            } else {
                Lost::Both
            };
            self.gap_in(lost, Reason::EventsLost, lost_heads, ctx, stats, out);
        }
    }

    /// Framing is lost (dropped records, or a decoder error): settle what is open and hunt for
    /// the next provable request and response boundaries.
    fn gap(
        &mut self,
        reason: Reason,
        lost_heads: u32,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        self.gap_in(Lost::Both, reason, lost_heads, ctx, stats, out);
    }

    /// [`Connection::gap`] where only `lost` bytes are gone. Writes alone: the requests read
    /// whole keep their fields and wait for their answers, the request side keeps decoding.
    /// Reads alone: the response side keeps decoding; the requests waiting may be misaligned
    /// with their answers (a whole request may be among the lost) and are marked.
    fn gap_in(
        &mut self,
        lost: Lost,
        reason: Reason,
        lost_heads: u32,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        stats.bump(Counter::ConnectionGaps);
        if let Some(h2) = self.h2.as_mut() {
            h2.records_lost(self.last_event_ns, stats);
            return;
        }
        if lost_heads > 0 {
            stats.add(loss::LOST_EVENTS, u64::from(lost_heads));
            stats.add(loss::LOST_TOTAL, u64::from(lost_heads));
        }
        if lost == Lost::Reads {
            if let Some(mut progress) = self.reading.take() {
                progress.incomplete.get_or_insert(reason);
                self.enqueue(progress, stats);
            }
            for progress in &mut self.waiting {
                progress.incomplete.get_or_insert(reason);
            }
            self.requests.reset();
            self.hunt_request = true;
            return;
        }
        // A request read in part: its answer still comes, after those of the older ones.
        if lost == Lost::Both
            && let Some(mut progress) = self.reading.take()
        {
            progress.incomplete.get_or_insert(reason);
            self.enqueue(progress, stats);
        }
        // The response being written was answered; its end may be among what was lost.
        if self.waiting.front().is_some_and(|p| p.response_started())
            && let Some(mut progress) = self.waiting.pop_front()
        {
            progress.incomplete.get_or_insert(reason);
            let end = progress.last_io_ns();
            emit(progress, ctx, end, EndedBy::Unknown, stats, out);
        }
        // Each lost response head answered the oldest request still waiting, or one dropped at
        // the waiting limit (counted above, once).
        for _ in 0..lost_heads {
            if !self.take_dropped_answer() && self.waiting.pop_front().is_none() {
                break;
            }
        }
        self.responses.reset();
        self.hunt_response = true;
        if lost == Lost::Writes {
            // The requests were read whole: their answers are the next response heads.
            return;
        }
        // Requests still waiting lived through the loss: their fields may lack what was lost.
        for progress in &mut self.waiting {
            progress.incomplete.get_or_insert(reason);
        }
        self.requests.reset();
        self.hunt_request = true;
    }

    /// Hunting for a request's start after lost bytes: whether this read starts one (else its
    /// bytes are skipped, and a connection that never spoke HTTP is given up after a while).
    fn found_request_start(&mut self, ev: &SyscallEvent<'_>, work: &mut Work<'_>) -> bool {
        if !loss::starts_request(ev.payload) {
            work.stats.add(Counter::ResyncBytesSkipped, ev.ret as u64);
            self.hunted_reads = self.hunted_reads.saturating_add(1);
            if !self.spoke_http && self.hunted_reads >= MAX_HUNT_READS_BEFORE_HTTP {
                work.stats.bump(Counter::ConnectionsNeverHttp);
                self.fail(ev, work.to_ignore);
            }
            return false;
        }
        self.hunt_request = false;
        work.stats.bump(Counter::ConnectionResyncs);
        true
    }

    pub(super) fn on_read(
        &mut self,
        ev: &SyscallEvent<'_>,
        arrivals: &mut ArrivalIndex,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) {
        self.observe(ev, ctx, work.stats, work.out);
        if self.h2.is_none() && !self.spoke_http {
            self.h2 = H2Connection::from_read(ev.payload, self.hunt_request, work.stats);
        }
        if let Some(h2) = self.h2.as_mut() {
            let handshake = self.tls_handshake_ns.take();
            h2.on_read(ev, &self.peer, handshake, arrivals, ctx, work);
            if !h2.not_http2() {
                return;
            }
            // The server's first write looked like HTTP/2's, the client's bytes are not.
            self.h2 = None;
        }
        if ev.ret <= 0 {
            // EOF or reset from the peer: whatever is still being answered was abandoned.
            let by = self.peer_end();
            self.abort_all(ev.ts_exit_ns, by, work.stats, ctx, work.out);
            return;
        }
        if self.failed || self.requests_failed {
            return;
        }
        if self.hunt_request && !self.found_request_start(ev, work) {
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
            if !self.apply_request_event(event, ev, arrivals, ctx, work) {
                break;
            }
        }
        events.clear();
        *work.request_events = events;
    }

    /// Applies one request event; false when the decoder lost the connection's framing and
    /// the rest of the batch must be dropped.
    fn apply_request_event(
        &mut self,
        event: RequestEvent,
        ev: &SyscallEvent<'_>,
        arrivals: &mut ArrivalIndex,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) -> bool {
        match event {
            RequestEvent::Started { ts_ns } => {
                let wire_ns = self.wire_arrival(arrivals, ts_ns);
                if wire_ns.is_none() {
                    work.stats.bump(Counter::ArrivalWireUnknown);
                }
                let mut progress =
                    Box::new(RequestProgress::new(self.next_seq, ev.tid, ts_ns, wire_ns));
                self.next_seq += 1;
                progress.truncated = ev.truncated && ev.lost_bytes() > 0;
                if let Some(old) = self.reading.replace(progress) {
                    drop(old);
                    work.stats.bump(Counter::RequestsUnread);
                }
            }
            RequestEvent::Complete(summary) => {
                self.spoke_http = true;
                let Some(mut progress) = self.reading.take() else {
                    work.stats.bump(Counter::RequestCompleteWithoutStart);
                    return true;
                };
                progress.request_bytes = summary.head_bytes + summary.body_bytes;
                progress.truncated |= summary.body_truncated;
                if summary.body_json_error {
                    work.stats.bump(Counter::RequestBodyJsonError);
                }
                progress.summary = Some(summary);
                if self.server_shut_ns.is_some() {
                    // Sent after the server said it would answer no more: drained.
                    work.stats.bump(Counter::RequestsAfterServerShutdown);
                }
                work.read_complete.push((ev.tid, progress.seq));
                self.enqueue(progress, work.stats);
            }
            RequestEvent::Error(e) => {
                work.stats.bump(e.counter());
                if e == ParseError::NotHttp && !self.spoke_http {
                    match self.reading.take() {
                        // Kept for the server's answer (a record if it answers, else
                        // nothing); no more requests are decoded on this connection.
                        Some(mut progress) if self.waiting.len() < MAX_WAITING => {
                            work.stats.bump(Counter::RequestsUnparsed);
                            progress.unparsed = true;
                            progress.truncated |= ev.truncated;
                            self.enqueue(progress, work.stats);
                            self.requests_failed = true;
                        }
                        Some(_) => {
                            work.stats.bump(Counter::RequestsUnparsed);
                            self.fail(ev, work.to_ignore);
                        }
                        // Never HTTP: stop capturing it.
                        None => self.fail(ev, work.to_ignore),
                    }
                } else {
                    self.gap(Reason::from(e), 0, ctx, work.stats, work.out);
                }
                // The rest of this batch came from bytes the decoder no longer trusts.
                return false;
            }
        }
        true
    }

    pub(super) fn on_write(
        &mut self,
        ev: &SyscallEvent<'_>,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) {
        self.observe(ev, ctx, work.stats, work.out);
        if self.h2.is_none() && self.next_seq == 0 && self.reading.is_none() {
            self.h2 = H2Connection::from_first_write(ev.payload, self.hunt_response, work.stats);
        }
        if let Some(h2) = self.h2.as_mut() {
            h2.on_write(ev, ctx, work.stats, work.out);
            return;
        }
        if ev.ret < 0 {
            // EPIPE/ECONNRESET: the client went away mid-response.
            let by = self.peer_end();
            self.abort_all(ev.ts_enter_ns, by, work.stats, ctx, work.out);
            return;
        }
        if self.failed {
            return;
        }
        let head = loss::starts_response(ev.payload);
        if self.write_skipped(ev, head, work) {
            return;
        }
        let Some(target) = self.waiting.front_mut().or(self.reading.as_mut()) else {
            if head {
                // An answer to a request that was never captured: count it, skip its body.
                work.stats.bump(loss::LOST_REQUEST_NOT_CAPTURED);
                work.stats.bump(loss::LOST_TOTAL);
                self.hunt_response = true;
            } else {
                work.stats.bump(Counter::ResponseWithoutRequest);
            }
            self.responses.reset();
            return;
        };
        target.response_bytes += ev.ret as u64;
        target.last_write_ns = ev.ts_enter_ns;
        // Bytes of the response were not captured (capture limit, or the kernel's adaptive
        // capture behind a filling ring buffer): fields after them may be missing.
        target.truncated |= ev.lost_bytes() > 0;
        if ev.token && !self.responses.at_token_boundary() {
            // The kernel saw one whole event where this side of the stream cannot start one
            // (records were lost): the write's bytes count as lost, or its event as cut.
            work.stats.bump(Counter::TokenEventsOutOfStep);
            target.truncated = true;
        }
        if target.first_byte_ns.is_none() {
            target.first_byte_ns = Some(ev.ts_enter_ns);
            work.response_started = Some((target.reader_tid, target.seq));
        }
        let is_head = target.summary.as_ref().is_some_and(|s| s.method == "HEAD");
        self.responses.set_next_is_head_reply(is_head);
        self.feed_response(ev, ctx, work);
    }

    /// Writes that feed no response: neither side speaks HTTP, bytes skipped while hunting for
    /// a response head after lost bytes, the answer to a request dropped at the waiting limit.
    /// Whether `ev` was one (handled here).
    fn write_skipped(&mut self, ev: &SyscallEvent<'_>, head: bool, work: &mut Work<'_>) -> bool {
        if self.requests_failed
            && !self.spoke_http
            && !head
            && self
                .waiting
                .front()
                .is_some_and(|p| p.unparsed && !p.response_started())
        {
            // Neither side speaks HTTP (TLS, another protocol): stop capturing it.
            work.stats.bump(Counter::RequestsUnparsedUnanswered);
            self.take_waiting();
            self.fail(ev, work.to_ignore);
            return true;
        }
        if head && self.reading.is_none() && self.waiting.is_empty() {
            // An answer to no request this side holds (one whose bytes were never captured):
            // the segments before it were that request's, not the next one's. (Bytes after a
            // response's end, such as a chunked terminator, may follow the next request's
            // arrival: a client may send it once it has the last event.)
            self.last_response_end_ns = self.last_response_end_ns.max(ev.ts_enter_ns);
        }
        if self.hunt_response {
            if !head {
                work.stats
                    .add(Counter::ResyncBytesSkipped, ev.ret.max(0) as u64);
                return true;
            }
            self.hunt_response = false;
        }
        if head && self.take_dropped_answer() {
            // The answer to a request dropped at the waiting limit: counted, its body skipped
            // up to the next response head.
            work.stats.bump(loss::LOST_WAITING_OVER_LIMIT);
            work.stats.bump(loss::LOST_TOTAL);
            self.responses.reset();
            self.hunt_response = true;
            return true;
        }
        false
    }

    /// Feeds a response write to the decoder (a token write as the token event it stands for),
    /// and applies what it yields.
    fn feed_response(
        &mut self,
        ev: &SyscallEvent<'_>,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) {
        let chunk = Chunk {
            bytes: ev.payload,
            lost: ev.lost_bytes(),
            ts_ns: ev.ts_enter_ns,
        };
        let mut events = std::mem::take(work.response_events);
        if ev.token {
            self.responses
                .feed_token(ev.ts_enter_ns, ev.ret as u64, &mut events);
        } else {
            if ev.conn_gen != 0 && work.learn_templates {
                // Capture can summarise this connection's token events once it knows them.
                self.responses.set_learn_templates(true);
            }
            self.responses.feed(chunk, &mut events);
            if let Some(learned) = self.responses.take_template() {
                // The process's template is the tracker's to merge and install.
                work.templates.push(TemplateUpdate {
                    tgid: ev.tgid,
                    template: learned,
                });
            }
        }
        for event in events.drain(..) {
            if !self.apply_response_event(event, ctx, work) {
                break;
            }
        }
        events.clear();
        *work.response_events = events;
    }

    /// Applies one response event; false when framing was lost and the rest of the batch must
    /// be dropped.
    fn apply_response_event(
        &mut self,
        event: ResponseEvent,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) -> bool {
        if let ResponseEvent::Error(e) = event {
            work.stats.bump(e.counter());
            self.gap(Reason::from(e), 0, ctx, work.stats, work.out);
            return false;
        }
        let Some(target) = self.waiting.front_mut().or(self.reading.as_mut()) else {
            work.stats.bump(Counter::ResponseWithoutRequest);
            return true;
        };
        match event {
            ResponseEvent::Head { ts_ns, status, .. } => {
                target.status = Some(status);
                target.first_byte_ns.get_or_insert(ts_ns);
            }
            ResponseEvent::Sse(sse) => {
                if sse.lost {
                    work.stats.bump(Counter::SseEventsCut);
                } else if sse.json_error {
                    work.stats.bump(Counter::SseJsonError);
                }
                target.on_sse(&sse);
            }
            ResponseEvent::Body(body) => target.on_body(body, work.stats),
            ResponseEvent::End { ts_ns, .. } => {
                self.last_response_end_ns = ts_ns;
                if let Some(done) = self.pop_answered() {
                    // Only an answer not begun before the FIN: a stream the client left
                    // after its last event (closing before the terminating chunk) was read.
                    let begun = done.first_byte_ns.unwrap_or(ts_ns);
                    let after_fin = self.peer_end_seen.fin_ns.is_some_and(|fin| fin < begun);
                    if after_fin && self.peer_end_seen.reset_ns.is_some() {
                        let end = self.client_end_ns(&done, ts_ns);
                        work.stats.bump(Counter::RequestsAborted);
                        work.stats.bump(Counter::RequestsAnsweredAfterClientLeft);
                        emit(done, ctx, end, EndedBy::Client, work.stats, work.out);
                    } else if after_fin && self.held.len() < MAX_WAITING {
                        // The client had closed its side: whether it reads this is known
                        // only when the socket ends.
                        self.held.push((done, ts_ns));
                    } else {
                        emit(done, ctx, ts_ns, EndedBy::Complete, work.stats, work.out);
                    }
                }
            }
            ResponseEvent::Error(_) => {}
        }
        true
    }

    /// Requests the engine is working on: admitted, and neither the engine (where a hook says
    /// so) nor the response has finished.
    pub(super) fn admitted_requests_mut(&mut self) -> impl Iterator<Item = &mut RequestProgress> {
        self.reading
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .map(|b| &mut **b)
            .filter(|r| r.admitted_ns.is_some() && r.engine_finished_ns.is_none())
    }

    /// The request with sequence number `seq`, if it is still open.
    pub(super) fn request_mut(&mut self, seq: u32) -> Option<&mut RequestProgress> {
        self.reading
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .map(|b| &mut **b)
            .find(|r| r.seq == seq)
    }

    /// Whether request `seq` is still open here.
    pub(super) fn has_open_request(&self, seq: u32) -> bool {
        self.reading
            .iter()
            .chain(self.waiting.iter())
            .any(|r| r.seq == seq)
    }

    /// Requests open on this connection (read in part, or waiting for their answer).
    pub(super) fn open_requests(&self) -> usize {
        self.waiting.len() + usize::from(self.reading.is_some())
    }

    /// Requests open on this connection whose first bytes were read before `ts_ns`.
    pub(super) fn open_requests_read_before(&self, ts_ns: u64) -> usize {
        self.waiting
            .iter()
            .chain(self.reading.as_ref())
            .filter(|r| r.read_ns < ts_ns)
            .count()
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
            EndedBy::Client => Counter::RequestsAborted,
            EndedBy::Server => Counter::RequestsCutByServer,
            EndedBy::Complete | EndedBy::Unknown => Counter::RequestsUnfinished,
        };
        let waiting = self.take_waiting();
        for progress in waiting {
            if progress.unparsed && !progress.response_started() {
                stats.bump(Counter::RequestsUnparsedUnanswered);
                continue;
            }
            stats.bump(counter);
            let end = self.end_by(&progress, ts_ns, by);
            emit(progress, ctx, end, by, stats, out);
        }
        if let Some(progress) = self.reading.take() {
            if progress.response_started() {
                stats.bump(counter);
                let end = self.end_by(&progress, ts_ns, by);
                emit(progress, ctx, end, by, stats, out);
            } else {
                stats.bump(Counter::RequestsUnread);
            }
        }
        self.requests.reset();
        self.responses.reset();
    }

    fn end_by(&self, progress: &RequestProgress, ts_ns: u64, by: EndedBy) -> u64 {
        if by == EndedBy::Client {
            self.client_end_ns(progress, ts_ns)
        } else {
            ts_ns
        }
    }

    /// Settles responses begun after the client's FIN: the client reset the socket
    /// before the server closed it (it no longer read: its reset answered the server's
    /// write), so it never had the answer; otherwise (a half-closed client that reads on, or
    /// no reset seen) the answer stands complete.
    fn settle_held(
        &mut self,
        stats: &mut Stats,
        ctx: RecordContext<'_>,
        out: &mut Vec<RequestRecord>,
    ) {
        let reset = self.peer_end_seen.reset_ns.is_some();
        for (progress, end_ns) in std::mem::take(&mut self.held) {
            if reset {
                let end = self.client_end_ns(&progress, end_ns);
                stats.bump(Counter::RequestsAborted);
                stats.bump(Counter::RequestsAnsweredAfterClientLeft);
                emit(progress, ctx, end, EndedBy::Client, stats, out);
            } else {
                emit(progress, ctx, end_ns, EndedBy::Complete, stats, out);
            }
        }
    }

    pub(super) fn close(
        mut self,
        ts_ns: u64,
        ending: Ending,
        stats: &mut Stats,
        ctx: RecordContext<'_>,
        out: &mut Vec<RequestRecord>,
    ) {
        if let Some(h2) = self.h2.take() {
            h2.close(ts_ns, ending, stats, ctx, out);
            return;
        }
        self.settle_held(stats, ctx, out);
        // A body delimited by the connection's close (no length, not chunked) is complete now.
        if matches!(ending, Ending::Closed(_)) {
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
                            emit(done, ctx, ts_ns, EndedBy::Complete, stats, out);
                        }
                    }
                    _ => {}
                }
            }
        }
        match ending {
            Ending::Closed(by) => self.abort_all(ts_ns, by, stats, ctx, out),
            Ending::Incomplete(reason) => {
                // Still in flight when tracking stopped: nobody aborted them.
                let open = self.reading.take().into_iter().filter(|p| {
                    let read = p.summary.is_some() || p.response_started();
                    if !read {
                        stats.bump(Counter::RequestsUnread);
                    }
                    read
                });
                let all: Vec<_> = self.waiting.drain(..).chain(open).collect();
                for mut progress in all {
                    progress.incomplete.get_or_insert(reason);
                    emit(progress, ctx, ts_ns, EndedBy::Unknown, stats, out);
                }
            }
        }
    }
}

/// Turns a finished request into its record, counting incomplete ones by reason.
fn emit(
    progress: Box<RequestProgress>,
    ctx: RecordContext<'_>,
    end_ns: u64,
    ended_by: EndedBy,
    stats: &mut Stats,
    out: &mut Vec<RequestRecord>,
) {
    if let Some(reason) = progress.incomplete {
        stats.bump(loss::INCOMPLETE_TOTAL);
        stats.bump(reason.counter());
    }
    out.push(progress.into_record(ctx, end_ns, ended_by));
}

/// Which direction of a connection lost records.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lost {
    Reads,
    Writes,
    Both,
}

/// Moves a direction's expected record number past `seq` (`record`: `seq` is a record of it;
/// else `seq` is the number its next record would have had, from a close). How many records
/// were skipped, or None for a record behind the expected one (two threads raced on one
/// direction of the fd: out of order, not lost).
fn step(expected: &mut Option<u32>, seq: u32, record: bool) -> Option<u32> {
    let missing = match *expected {
        Some(expected) => seq.wrapping_sub(expected),
        // First sight: records before this one on the fd were lost.
        None => seq,
    };
    if missing >= 1 << 31 {
        return None;
    }
    *expected = Some(if record { seq.wrapping_add(1) } else { seq });
    Some(missing)
}
