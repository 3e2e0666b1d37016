//! Correlate stage: per-connection state machines turn decoded HTTP events into one
//! [`RequestRecord`] per request, joined with TCP arrival times.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
use inferscope_model::{Counter, PerProcess, clock::ns_to_ms};
mod arrivals;
mod connection;
mod h2_calls;
mod h2_connection;
mod h2_fields;
pub(crate) mod launch_merge;
pub(crate) mod launches;
pub(crate) mod loss;
mod peer_close;
mod request;
mod sched;
mod segment_positions;

use std::{
    collections::{HashMap, hash_map::Entry},
    net::SocketAddr,
};

pub(crate) use arrivals::ArrivalIndex;
use connection::Connection;
use inferscope_common::SchedKind;
use inferscope_decode::http::{Limits, RequestEvent, ResponseEvent};
pub(crate) use inferscope_model::{EndedBy, RequestRecord, Stats, StepMember, StepRecord};
use loss::Ending;
use peer_close::PeerCloses;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::capture::{
    SchedEvent, Segment, SockState, SyscallEvent,
    kernel::{
        commands::{KernelCommand, LARGE_CAPTURE_BYTES},
        stream_template::{TemplateSide, kernel_template},
    },
};

/// Requests listed per step record (a step's batch is bounded by the engine's slots anyway).
const MAX_STEP_MEMBERS: usize = 1024;

/// Connections tracked at once; beyond it new connections are counted and skipped.
pub(crate) const MAX_CONNECTIONS: usize = 65536;

/// Where a server connection's bytes came from, as far as capture could tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    pub local_port: Option<u16>,
    pub remote: Option<SocketAddr>,
    /// The kernel's socket address (0: unknown): arrivals join by it.
    pub sock: u64,
    /// The connection predates the agent.
    pub preexisting: bool,
    /// The connection is TLS: its bytes are the plaintext the TLS library handed over.
    pub tls: bool,
}

/// A process's token event template: learned from one of its writes (from a connection), or
/// merged and due for capture, which summarises writes that match it (see
/// `docs/src/token-events.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateUpdate {
    pub tgid: u32,
    pub template: inferscope_decode::http::TokenTemplate,
}

/// Folds a template learned from one write into its process's; a change is due for capture.
/// `Same` (the common case: a write captured whole by design, the first after a head or a
/// miss, or one from before the install) costs nothing.
fn merge_process_template(
    templates: &mut FxHashMap<u32, inferscope_decode::http::TokenTemplate>,
    due: &mut Vec<TemplateUpdate>,
    stats: &mut Stats,
    learned: TemplateUpdate,
) {
    use inferscope_decode::http::Merge;
    let merge = match templates.get_mut(&learned.tgid) {
        Some(template) => template.merge(&learned.template),
        None => {
            templates.insert(learned.tgid, learned.template.clone());
            Merge::Replaced
        }
    };
    if merge != Merge::Same
        && let Some(template) = templates.get(&learned.tgid)
    {
        stats.bump(Counter::TokenTemplatesInstalled);
        due.retain(|u| u.tgid != learned.tgid);
        due.push(TemplateUpdate {
            tgid: learned.tgid,
            template: template.clone(),
        });
    }
}

/// A connection in user space: (tgid, [`SyscallEvent::conn_key`]).
type ConnKey = (u32, u64);

pub struct Tracker {
    connections: ConnectionTable,
    arrivals: ArrivalIndex,
    /// The client's FIN and reset per socket (sock:inet_sock_set_state).
    peer_closes: PeerCloses,
    engines: HashMap<u32, &'static str>,
    stats: Stats,
    unix_offset_ns: u64,
    /// When capture last lost records (see [`Tracker::note_capture_loss`]).
    last_loss_ns: u64,
    /// Connections that turned out not to be HTTP: capture should stop copying their bytes.
    to_ignore: Vec<(u32, i32, u64)>,
    /// Templates learned from writes since the last merge.
    templates: Vec<TemplateUpdate>,
    /// Each process's template, merged from what its connections learned. One per traced
    /// process.
    process_templates: FxHashMap<u32, inferscope_decode::http::TokenTemplate>,
    /// Process templates that changed, for capture to install.
    templates_due: Vec<TemplateUpdate>,
    /// Learn templates at all (off when capture does not summarise token events).
    learn_templates: bool,
    /// Decoder output buffers, shared by all connections (one connection is fed at a time).
    request_events: Vec<RequestEvent>,
    response_events: Vec<ResponseEvent>,
    read_complete: Vec<(u32, u32)>,
    /// Scheduler-hook joins: reading thread → request → engine task.
    joins: sched::SchedJoins,
    /// Requests of processes gone ([`PerProcess::process_gone`]), until [`Tracker::take_ended`].
    ended: Vec<RequestRecord>,
    /// Processes seen serving HTTP/2 (bounded by the traced processes), and those of them not
    /// yet handed to capture ([`Tracker::take_http2_servers`]).
    http2_servers: FxHashSet<u32>,
    http2_servers_due: Vec<u32>,
}

/// What a connection needs while it handles one syscall: where results go, and scratch space.
pub(crate) struct Work<'a> {
    pub stats: &'a mut Stats,
    pub out: &'a mut Vec<RequestRecord>,
    pub to_ignore: &'a mut Vec<(u32, i32, u64)>,
    pub templates: &'a mut Vec<TemplateUpdate>,
    /// Learn token event templates from this connection's writes.
    pub learn_templates: bool,
    pub request_events: &'a mut Vec<RequestEvent>,
    pub response_events: &'a mut Vec<ResponseEvent>,
    /// Requests that finished arriving, in order: (reading thread, sequence number). Several
    /// when a client pipelines them into one read.
    pub read_complete: &'a mut Vec<(u32, u32)>,
    /// Set when a request's response began: (its reading thread, its sequence number).
    pub response_started: Option<(u32, u32)>,
}

impl Tracker {
    pub fn new(limits: Limits) -> Self {
        Self {
            connections: ConnectionTable {
                map: FxHashMap::default(),
                next_id: 1,
                limits,
                max_connections: MAX_CONNECTIONS,
            },
            arrivals: ArrivalIndex::default(),
            peer_closes: PeerCloses::default(),
            engines: HashMap::new(),
            stats: Stats::default(),
            unix_offset_ns: inferscope_model::clock::unix_offset_ns(),
            last_loss_ns: 0,
            to_ignore: Vec::new(),
            templates: Vec::new(),
            process_templates: FxHashMap::default(),
            templates_due: Vec::new(),
            learn_templates: true,
            request_events: Vec::new(),
            response_events: Vec::new(),
            read_complete: Vec::new(),
            joins: sched::SchedJoins::default(),
            ended: Vec::new(),
            http2_servers: FxHashSet::default(),
            http2_servers_due: Vec::new(),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Lowers [`MAX_CONNECTIONS`], to drive the limit.
    #[cfg(test)]
    pub(crate) fn set_max_connections(&mut self, n: usize) {
        self.connections.max_connections = n;
    }

    pub fn set_engine(&mut self, tgid: u32, engine: &'static str) {
        self.engines.insert(tgid, engine);
    }

    /// Also join arrivals by address (for connections that predate the agent, or where the
    /// kernel does not name sockets).
    pub fn join_arrivals_by_address(&mut self) {
        self.arrivals.by_address = true;
    }

    /// The process exited or is no longer traced: its open requests end, cut by the server.
    pub fn forget_process(&mut self, tgid: u32, now_ns: u64, out: &mut Vec<RequestRecord>) {
        let keys: Vec<ConnKey> = self
            .connections
            .map
            .keys()
            .filter(|(t, _)| *t == tgid)
            .copied()
            .collect();
        for key in keys {
            self.finish_connection(
                key,
                now_ns,
                Ending::Incomplete(loss::Reason::ServerExited),
                out,
            );
        }
        self.engines.remove(&tgid);
        self.process_templates.remove(&tgid);
        self.http2_servers.remove(&tgid);
        self.joins.forget_process(tgid);
    }

    /// The requests [`PerProcess::process_gone`] ended, moved to `out`.
    pub fn take_ended(&mut self, out: &mut Vec<RequestRecord>) {
        out.append(&mut self.ended);
    }

    /// Whether the tracker keeps anything for `tgid`: its engine, or a connection.
    pub fn knows_process(&self, tgid: u32) -> bool {
        self.engines.contains_key(&tgid) || self.connections.map.keys().any(|(t, _)| *t == tgid)
    }

    pub fn on_segment(&mut self, segment: &Segment) {
        self.arrivals.on_segment(segment);
    }

    /// A TCP state change on a watched port: the client's FIN, or the socket's end (then
    /// its arrivals are not the next connection's at the same address).
    pub fn on_sock_state(&mut self, state: &SockState) {
        self.peer_closes.on_state(state);
        if i32::from(state.new_state) == inferscope_common::TCP_CLOSE && state.sock != 0 {
            self.arrivals.forget_sock(state.sock);
        }
    }

    pub fn on_accept(&mut self, ev: &SyscallEvent<'_>, peer: Peer, out: &mut Vec<RequestRecord>) {
        let key = (ev.tgid, ev.conn_key());
        // Without a kernel id the key is the fd number, which came back without us seeing its
        // close (its record was lost): end the old connection first.
        self.finish_connection(
            key,
            ev.ts_exit_ns,
            Ending::Incomplete(loss::Reason::EventsLost),
            out,
        );
        if let Some(conn) =
            self.connections
                .get_or_open(key, peer, &self.engines, &mut self.stats, true)
        {
            conn.accepted_at(ev.ts_exit_ns);
            let ctx = conn.context(self.unix_offset_ns, self.last_loss_ns);
            conn.observe(ev, ctx, &mut self.stats, out);
        }
    }

    /// The server closed the connection (its last fd): what it had not finished answering
    /// ends cut by the server.
    pub fn on_close(&mut self, ev: &SyscallEvent<'_>, out: &mut Vec<RequestRecord>) {
        let key = (ev.tgid, ev.conn_key());
        if let Some(conn) = self.connections.map.get_mut(&key) {
            // Records lost just before the close settle first.
            let ctx = conn.context(self.unix_offset_ns, self.last_loss_ns);
            conn.observe(ev, ctx, &mut self.stats, out);
        }
        self.finish_connection(key, ev.ts_enter_ns, Ending::Closed(EndedBy::Server), out);
    }

    /// The server shut down the connection's sending side (shutdown(2)); it closes it later.
    pub fn on_shutdown(&mut self, ev: &SyscallEvent<'_>) {
        if let Some(conn) = self.connections.map.get_mut(&(ev.tgid, ev.conn_key())) {
            conn.on_server_shutdown(ev.ts_enter_ns);
        }
    }

    /// The server's TLS handshake on the connection completed (`SyscallKind::Tls`, ret 1).
    pub fn on_tls_handshake(&mut self, ev: &SyscallEvent<'_>) {
        if let Some(conn) = self.connections.map.get_mut(&(ev.tgid, ev.conn_key())) {
            conn.tls_handshake_done(ev.ts_enter_ns);
        }
    }

    pub fn on_read(&mut self, ev: &SyscallEvent<'_>, peer: Peer, out: &mut Vec<RequestRecord>) {
        self.feed(ev, peer, out, true);
    }

    pub fn on_write(&mut self, ev: &SyscallEvent<'_>, peer: Peer, out: &mut Vec<RequestRecord>) {
        self.feed(ev, peer, out, false);
    }

    /// Hands one read or write to its connection's state machine.
    fn feed(
        &mut self,
        ev: &SyscallEvent<'_>,
        peer: Peer,
        out: &mut Vec<RequestRecord>,
        read: bool,
    ) {
        let Some(conn) = self.connections.get_or_open(
            (ev.tgid, ev.conn_key()),
            peer,
            &self.engines,
            &mut self.stats,
            false,
        ) else {
            // Not tracked (the table is full): an answer written here is a request lost.
            if !read && ev.ret > 0 && loss::starts_response(ev.payload) {
                self.stats.bump(loss::LOST_CONNECTIONS_OVER_LIMIT);
                self.stats.bump(loss::LOST_TOTAL);
            }
            return;
        };
        if conn.opened_ns == 0 {
            conn.opened_ns = ev.ts_enter_ns;
        }
        if conn.peer.sock != 0
            && !self.peer_closes.is_empty()
            && let Some(end) = self.peer_closes.get(conn.peer.sock, conn.opened_ns)
        {
            conn.learn_peer_end(end);
        }
        let ctx = conn.context(self.unix_offset_ns, self.last_loss_ns);
        let mut work = Work {
            stats: &mut self.stats,
            out,
            to_ignore: &mut self.to_ignore,
            templates: &mut self.templates,
            learn_templates: self.learn_templates,
            request_events: &mut self.request_events,
            response_events: &mut self.response_events,
            read_complete: &mut self.read_complete,
            response_started: None,
        };
        if read {
            conn.on_read(ev, &mut self.arrivals, ctx, &mut work);
        } else {
            conn.on_write(ev, ctx, &mut work);
        }
        if conn.speaks_http2() && self.http2_servers.insert(ev.tgid) {
            self.http2_servers_due.push(ev.tgid);
        }
        let response_started = work.response_started;
        for learned in self.templates.drain(..) {
            merge_process_template(
                &mut self.process_templates,
                &mut self.templates_due,
                &mut self.stats,
                learned,
            );
        }
        if let Some((tid, seq)) = response_started {
            self.joins
                .response_started(ev.tgid, tid, ev.conn_key(), seq);
        }
        for (tid, seq) in self.read_complete.drain(..) {
            self.joins
                .request_read(ev.tgid, tid, ev.conn_key(), seq, &mut self.stats);
        }
    }

    /// An engine scheduler event (uprobe): joins the engine's task to the HTTP request read on
    /// the posting thread, and stamps admission.
    pub fn on_sched(&mut self, event: &SchedEvent, steps: &mut Vec<StepRecord>) {
        match event.kind {
            SchedKind::StepBegin => {
                self.joins.step_begin(event);
                return;
            }
            SchedKind::StepEnd => {
                if let Some(step) = self.step_end(event) {
                    steps.push(step);
                }
                return;
            }
            _ => {}
        }
        if event.kind == SchedKind::TaskPosted || event.user.is_some_and(|join| join.by_thread) {
            let connections = &self.connections.map;
            self.joins.prune_reads(event.tgid, event.tid, |conn, seq| {
                connections
                    .get(&(event.tgid, conn))
                    .is_some_and(|c| c.has_open_request(seq))
            });
        }
        let located = match event.user {
            Some(join) => self.joins.locate_user(event, join, &mut self.stats),
            None => self.joins.locate(event, &mut self.stats),
        };
        let Some((conn, seq)) = located else {
            return;
        };
        let request = self
            .connections
            .map
            .get_mut(&(event.tgid, conn))
            .and_then(|conn| conn.request_mut(seq));
        let Some(request) = request else {
            self.stats.bump(Counter::SchedRequestGone);
            if event.user.is_some() {
                self.joins.forget_user_id(event.tgid, event.task_id);
            }
            return;
        };
        let has_id = event.user.is_none_or(|join| join.has_id);
        match event.kind {
            SchedKind::TaskPosted => {
                if has_id {
                    request.task_id = Some(event.task_id);
                }
            }
            SchedKind::TaskDeferred => {
                request.deferred_ns.get_or_insert(event.ts_ns);
            }
            SchedKind::TaskAdmitted => {
                if has_id {
                    request.task_id.get_or_insert(event.task_id);
                }
                if request.admitted_ns.is_none() {
                    request.admitted_ns = Some(event.ts_ns);
                    request.slot = event.slot;
                    if request.deferred_ns.is_some() {
                        request.requeued_ns = self
                            .joins
                            .take_requeue(event.tgid)
                            .filter(|t| *t <= event.ts_ns);
                    }
                }
            }
            SchedKind::FirstToken => {
                request.engine_first_token_ns.get_or_insert(event.ts_ns);
            }
            SchedKind::Finish => {
                request.engine_finished_ns.get_or_insert(event.ts_ns);
            }
            SchedKind::SlotReleased => {
                request.slot_released_ns.get_or_insert(event.ts_ns);
            }
            SchedKind::Preempt => request.preemptions += 1,
            SchedKind::StepBegin | SchedKind::StepEnd | SchedKind::DeferredRequeued => {}
        }
    }

    /// A step finished: every admitted, unfinished request of that process took part (llama.cpp
    /// batches all busy slots each step). A request whose first token had not been written when
    /// the step ended was prefilling in it: the engine writes a step's tokens after the step
    /// returns, so the step that produced the first token counts as prefill.
    fn step_end(&mut self, event: &SchedEvent) -> Option<StepRecord> {
        let Some((start_ns, tokens)) = self.joins.step_end(event) else {
            self.stats.bump(Counter::SchedStepEndWithoutBegin);
            return None;
        };
        let mut members = Vec::new();
        let (mut sequences, mut prefilling_count) = (0u64, 0u64);
        for ((tgid, _), conn) in self.connections.map.iter_mut() {
            if *tgid != event.tgid {
                continue;
            }
            let ctx = conn.context(self.unix_offset_ns, self.last_loss_ns);
            for request in conn.admitted_requests_mut() {
                let prefilling = request
                    .engine_first_token_ns
                    .or(request.first_token_ns)
                    .is_none_or(|t| t > event.ts_ns);
                sequences += 1;
                if prefilling {
                    request.prefill_steps += 1;
                    prefilling_count += 1;
                } else {
                    request.decode_steps += 1;
                }
                if members.len() < MAX_STEP_MEMBERS {
                    members.push(StepMember {
                        request_id: request.request_id(ctx),
                        phase: if prefilling { "prefill" } else { "decode" },
                    });
                }
            }
        }
        Some(StepRecord {
            pid: event.tgid,
            engine: self
                .engines
                .get(&event.tgid)
                .copied()
                .unwrap_or("unknown")
                .to_owned(),
            tid: event.tid,
            start_mono_ns: start_ns,
            end_mono_ns: event.ts_ns,
            duration_ms: ns_to_ms(event.ts_ns.saturating_sub(start_ns)),
            batch_tokens: u64::try_from(tokens).ok(),
            sequences,
            prefilling: prefilling_count,
            requests: members,
            ..StepRecord::default()
        })
    }

    /// Whether token event templates are learned (capture summarises token events with them).
    pub fn set_learn_templates(&mut self, learn: bool) {
        self.learn_templates = learn;
    }

    /// What correlate wants of the kernel since the last call: processes newly seen serving
    /// HTTP/2 have their sends and receives taken whole (a read cut short loses the framing and
    /// header state of the rest of its connection), and processes whose token template changed
    /// get it (the latest per process wins; one the kernel cannot hold is counted). Empty with
    /// --no-token-events for templates: the tracker learns none then.
    pub(crate) fn kernel_commands(&mut self) -> Vec<KernelCommand> {
        let mut commands: Vec<KernelCommand> = self
            .take_http2_servers()
            .into_iter()
            .map(|tgid| KernelCommand::CaptureLarge {
                tgid,
                bytes: LARGE_CAPTURE_BYTES,
            })
            .collect();
        for update in self.take_templates() {
            let template = &update.template;
            let side = |bytes, mask| TemplateSide { bytes, mask };
            match kernel_template(
                0,
                side(&template.prefix, &template.prefix_mask),
                side(&template.suffix, &template.suffix_mask),
            ) {
                Some(template) => commands.push(KernelCommand::SetTemplate {
                    tgid: update.tgid,
                    template: Box::new(template),
                }),
                None => self.stats.bump(Counter::TokenTemplatesRefused),
            }
        }
        commands
    }

    /// Process templates that changed since the last call (the latest per process wins).
    fn take_templates(&mut self) -> Vec<TemplateUpdate> {
        std::mem::take(&mut self.templates_due)
    }

    /// Processes newly seen serving HTTP/2.
    fn take_http2_servers(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.http2_servers_due)
    }

    /// fds whose capture should stop (not HTTP, or framing lost for good).
    pub fn take_ignored(&mut self) -> Vec<(u32, i32, u64)> {
        std::mem::take(&mut self.to_ignore)
    }

    /// The kernel dropped records (ring buffer full) at about `now_ns`: requests alive then are
    /// reported with `capture_truncated`, since any of their events may be missing.
    pub fn note_capture_loss(&mut self, now_ns: u64) {
        self.last_loss_ns = now_ns;
    }

    /// Periodic upkeep: old segments, the wall-clock offset.
    pub fn sweep(&mut self, now_ns: u64) {
        self.arrivals.sweep(now_ns);
        self.peer_closes.sweep(now_ns);
        self.stats.add(
            Counter::PeerClosesDropped,
            std::mem::take(&mut self.peer_closes.dropped),
        );
        self.stats.add(
            Counter::ArrivalSegmentsDropped,
            std::mem::take(&mut self.arrivals.dropped),
        );
        self.unix_offset_ns = inferscope_model::clock::unix_offset_ns();
    }

    pub fn open_connections(&self) -> usize {
        self.connections.map.len()
    }

    /// Requests open right now (read in part, or waiting for their answer), all connections.
    pub fn open_requests(&self) -> usize {
        self.connections
            .map
            .values()
            .map(|c| c.open_requests())
            .sum()
    }

    /// Open requests whose first bytes were read before `ts_ns` (a retiring agent drains those).
    pub fn open_requests_read_before(&self, ts_ns: u64) -> usize {
        self.connections
            .map
            .values()
            .map(|c| c.open_requests_read_before(ts_ns))
            .sum()
    }

    /// Ends every connection (agent shutdown): open requests are reported as incomplete
    /// (`agent_shutdown`); nobody aborted them. A connection that went quiet before the kernel
    /// last dropped records may have lost its end among them (its last writes, its close, with
    /// no later record on it to show the gap): its open requests are `events_lost`.
    pub fn finish_all(&mut self, now_ns: u64, out: &mut Vec<RequestRecord>) {
        let keys: Vec<ConnKey> = self.connections.map.keys().copied().collect();
        for key in keys {
            let quiet_through_a_loss =
                self.connections.map.get(&key).is_some_and(|c| {
                    self.last_loss_ns != 0 && c.last_event_ns <= self.last_loss_ns
                });
            let reason = if quiet_through_a_loss {
                loss::Reason::EventsLost
            } else {
                loss::Reason::AgentShutdown
            };
            self.finish_connection(key, now_ns, Ending::Incomplete(reason), out);
        }
    }

    fn finish_connection(
        &mut self,
        key: ConnKey,
        ts_ns: u64,
        ending: Ending,
        out: &mut Vec<RequestRecord>,
    ) {
        let Some(conn) = self.connections.map.remove(&key) else {
            return;
        };
        let ctx = conn.context(self.unix_offset_ns, self.last_loss_ns);
        if let (Some(port), Some(remote)) = (conn.peer.local_port, conn.peer.remote) {
            self.arrivals.forget_peer(port, remote);
        }
        let mut conn = conn;
        if conn.peer.sock != 0 {
            self.arrivals.forget_sock(conn.peer.sock);
            if let Some(end) = self.peer_closes.get(conn.peer.sock, conn.opened_ns) {
                conn.learn_peer_end(end);
            }
            self.peer_closes.forget(conn.peer.sock);
        }
        conn.close(ts_ns, ending, &mut self.stats, ctx, out);
    }
}

/// Open connections by (tgid, connection key). FxHash: the key is two integers chosen by the
/// kernel, and this lookup runs once per captured syscall.
struct ConnectionTable {
    map: FxHashMap<ConnKey, Box<Connection>>,
    next_id: u64,
    limits: Limits,
    /// [`MAX_CONNECTIONS`], lowered by tests.
    max_connections: usize,
}

impl ConnectionTable {
    /// The connection for `key`, opened on first sight (one that predates the agent, or whose
    /// accept was lost, unless `accepted`), with its peer filled in.
    fn get_or_open(
        &mut self,
        key: ConnKey,
        peer: Peer,
        engines: &HashMap<u32, &'static str>,
        stats: &mut Stats,
        accepted: bool,
    ) -> Option<&mut Connection> {
        let at_limit = self.map.len() >= self.max_connections;
        match self.map.entry(key) {
            Entry::Occupied(entry) => {
                let conn = entry.into_mut();
                conn.learn_peer(peer);
                Some(conn)
            }
            Entry::Vacant(entry) => {
                if at_limit {
                    stats.bump(Counter::ConnectionsOverLimit);
                    return None;
                }
                let id = self.next_id;
                self.next_id += 1;
                stats.bump(Counter::ConnectionsOpened);
                let engine = engines.get(&key.0).copied().unwrap_or("unknown");
                Some(entry.insert(Box::new(Connection::new(
                    id,
                    key.0,
                    engine,
                    peer,
                    self.limits,
                    accepted,
                ))))
            }
        }
    }
}

/// The process's open requests end now, cut by the server; [`Tracker::take_ended`] hands them on.
impl PerProcess for Tracker {
    fn process_gone(&mut self, tgid: u32) {
        let mut ended = std::mem::take(&mut self.ended);
        self.forget_process(
            tgid,
            inferscope_model::clock::monotonic_now_ns(),
            &mut ended,
        );
        self.ended = ended;
    }
}

#[cfg(test)]
mod tests;
