//! What vLLM's IPC says about each request and each engine step, accumulated from decoded
//! messages and joined to HTTP records by id. The same message can be seen twice (written by
//! one traced process, read by another): events are kept once per (kind, timestamp), outputs
//! once per message timestamp.
use std::collections::VecDeque;

use inferscope_model::{
    Counter, RequestRecord, Stats, StepMember, StepRecord, StepRef,
    clock::{mono_seconds_to_ns, ns_to_ms},
};
use rustc_hash::FxHashMap;

use super::messages::{AddRequest, EventKind, IpcMessage, KvTransfers, Output, Outputs};

/// Requests remembered at once; the oldest is forgotten (counted) beyond this.
const MAX_REQUESTS: usize = 16_384;
/// Events kept per request (a request preempted more often than this is still counted).
const MAX_EVENTS: usize = 64;
/// Output-message timestamps remembered to drop the second sighting of a message.
const SEEN_OUTPUTS: usize = 256;
/// Steps remembered per engine to list each request's steps when its HTTP record ends.
const STEPS_PER_ENGINE: usize = 1 << 14;
/// Steps that gave one request a token, remembered (a longer request's steps are unknown).
const OUTPUT_STEPS: usize = 1 << 14;
/// The same across all requests remembered (8 MiB); beyond it new ones' steps are unknown.
const OUTPUT_STEPS_TOTAL: usize = 1 << 20;
/// Engines whose recent steps are kept (each up to [`STEPS_PER_ENGINE`]).
const STEP_ENGINES: usize = 64;
/// Requests remembered per step as admitted after waiting (for the KV-transfer attribution);
/// a step with more attributes none.
const MAX_HELD: usize = 64;

/// What one outputs message's requests tell of its step, beside their membership.
#[derive(Default)]
struct Batch {
    /// SCHEDULED / PREEMPTED stamps carried by the message: the scheduler's clock at some
    /// step's schedule().
    sched_stamps: Vec<u64>,
    /// Requests first admitted per the message: (SCHEDULED, QUEUED, id).
    admitted: Vec<(u64, u64, String)>,
}
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct RequestState {
    pub request_id: String,
    pub external_req_id: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub queued_ns: Option<u64>,
    /// First SCHEDULED: admission.
    pub scheduled_ns: Option<u64>,
    pub preemptions: u64,
    pub output_tokens: u64,
    /// When the engine built the first output carrying a token for this request.
    pub first_output_ns: Option<u64>,
    pub finish_reason: Option<&'static str>,
    pub aborted: bool,
    events: Vec<(EventKind, u64)>,
    /// The engine (server, engine index) whose outputs carried it.
    engine: Option<(u32, i64)>,
    /// The vLLM server (API server pid) whose IPC carried its new-request message.
    server: Option<u32>,
    /// Ends of the steps that gave it tokens (or finished it), in step order.
    output_steps: Vec<u64>,
    /// Some of its events or output steps were not kept: its step list is unknown.
    steps_overflow: bool,
}

/// One step of an engine, as remembered for the per-request join.
#[derive(Debug, Clone)]
struct EngineStep {
    end: u64,
    /// The process the step's message was seen in (the step record's pid).
    tgid: u32,
    /// The KV transfers its worker reported finished (the connector's own durations).
    transfers: KvTransfers,
    /// Requests first admitted in this step that had waited through the step before (queued
    /// before it ended): (queued, engine id). A request whose remote KV arrived is admitted
    /// in the step after the one that reported its transfer finished.
    held: Vec<(u64, String)>,
    held_overflow: bool,
}

#[derive(Debug, Default)]
pub(super) struct IpcState {
    requests: FxHashMap<String, RequestState>,
    order: VecDeque<String>,
    /// External id (`chatcmpl-…`) → engine ids carrying it.
    by_external: FxHashMap<String, Vec<String>>,
    seen_outputs: VecDeque<u64>,
    /// Per engine (server, engine index): the previous step's timestamp and whether requests
    /// were running then. Each engine core steps on its own clock of work.
    last_step: FxHashMap<(u32, i64), (u64, bool)>,
    /// Per engine: its recent steps, by end.
    engine_steps: FxHashMap<(u32, i64), VecDeque<EngineStep>>,
    /// Per engine: its EngineCore process, which launches the step's kernels (found by
    /// [`super::VllmIpc`] in /proc).
    pub engine_pids: FxHashMap<(u32, i64), u32>,
    /// Output steps remembered across all requests.
    output_steps_total: usize,
    pub stats: Stats,
}

/// Engines whose previous step is remembered; beyond this the table starts over (counted).
const MAX_ENGINES: usize = 1024;
/// Prompts of one batched completions request looked up (`cmpl-<id>-0`, `-1`, ...).
const MAX_PROMPTS: usize = 4096;

/// The engine ids of `key` and of its prompts (`key-0`, `key-1`, ...).
fn externals_of<'a>(
    by_external: &'a FxHashMap<String, Vec<String>>,
    key: &'a str,
) -> impl Iterator<Item = &'a Vec<String>> + 'a {
    let prompts = (0..MAX_PROMPTS).map_while(move |i| by_external.get(&format!("{key}-{i}")));
    by_external.get(key).into_iter().chain(prompts)
}

/// The external ids `record`'s engine requests may carry: the stream's own id,
/// `chatcmpl-`/`cmpl-` + its X-Request-Id, and the id a gRPC call's request message named
/// (`vllm serve --grpc` hands it to the engine as is).
fn join_keys(record: &RequestRecord) -> Vec<String> {
    let mut keys: Vec<String> = Vec::with_capacity(3);
    if let Some(id) = &record.response_id {
        keys.push(id.clone());
    }
    if let Some(id) = &record.rpc_request_id {
        keys.push(id.clone());
    }
    if let Some(x) = &record.x_request_id {
        keys.push(format!("chatcmpl-{x}"));
        keys.push(format!("cmpl-{x}"));
    }
    keys
}

/// `<n>_<id>` (a child of an `n > 1` request) → `<id>`.
fn parent_of(request_id: &str) -> &str {
    match request_id.split_once('_') {
        Some((n, rest)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => request_id,
    }
}

/// `<external>-<8 chars>` → `<external>`, when the id has vLLM's suffix (children of `n > 1`
/// requests carry their parent's external id).
fn external_of(request_id: &str) -> Option<&str> {
    let (head, tail) = parent_of(request_id).rsplit_once('-')?;
    (tail.len() == 8 && !head.is_empty()).then_some(head)
}

impl IpcState {
    #[cfg(test)]
    pub(super) fn request(&self, request_id: &str) -> Option<&RequestState> {
        self.requests.get(request_id)
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    fn entry(&mut self, request_id: &str) -> &mut RequestState {
        if !self.requests.contains_key(request_id) {
            if self.requests.len() >= MAX_REQUESTS {
                // `order` may still hold ids joined since: skip those.
                while let Some(old) = self.order.pop_front() {
                    if self.remove(&old).is_some() {
                        self.stats.bump(Counter::VllmRequestsEvictedUnjoined);
                        break;
                    }
                }
            }
            if self.order.len() >= 2 * MAX_REQUESTS {
                // Joined ids are left in `order` (removing each is O(n)); drop them in bulk.
                let requests = &self.requests;
                self.order.retain(|id| requests.contains_key(id));
            }
            if let Some(ext) = external_of(request_id) {
                self.by_external
                    .entry(ext.to_owned())
                    .or_default()
                    .push(request_id.to_owned());
            }
            self.order.push_back(request_id.to_owned());
        }
        self.requests
            .entry(request_id.to_owned())
            .or_insert_with(|| RequestState {
                request_id: request_id.to_owned(),
                external_req_id: external_of(request_id).map(str::to_owned),
                ..Default::default()
            })
    }

    fn remove(&mut self, request_id: &str) -> Option<RequestState> {
        let state = self.requests.remove(request_id)?;
        self.output_steps_total = self
            .output_steps_total
            .saturating_sub(state.output_steps.len());
        if let Some(ext) = &state.external_req_id
            && let Some(ids) = self.by_external.get_mut(ext)
        {
            ids.retain(|id| id != request_id);
            if ids.is_empty() {
                self.by_external.remove(ext);
            }
        }
        Some(state)
    }

    /// Applies one decoded message; `tgid`/`tid` say where it was seen (for step records) and
    /// `server` which vLLM server it belongs to (the API server's pid, for both its processes).
    pub(super) fn apply(
        &mut self,
        message: IpcMessage,
        (tgid, tid, server): (u32, u32, u32),
        steps: &mut Vec<StepRecord>,
    ) {
        match message {
            IpcMessage::Add(add) => self.on_add(add, server),
            IpcMessage::Abort { request_ids } => {
                for id in request_ids {
                    if let Some(r) = self.requests.get_mut(&id) {
                        r.aborted = true;
                    }
                }
            }
            IpcMessage::Outputs(outputs) => self.on_outputs(outputs, (tgid, tid, server), steps),
            IpcMessage::Ready { .. } | IpcMessage::Other => {}
        }
    }

    fn on_add(&mut self, add: AddRequest, server: u32) {
        self.stats.bump(Counter::VllmRequestsAdded);
        if add.partial {
            self.stats.bump(Counter::VllmRequestsPartial);
        }
        let external = add.external_req_id.clone();
        let r = self.entry(&add.request_id);
        r.server = Some(server);
        r.prompt_tokens = add.prompt_tokens.or(r.prompt_tokens);
        let moved = external.is_some() && r.external_req_id != external;
        let old = if moved {
            std::mem::replace(&mut r.external_req_id, external.clone())
        } else {
            None
        };
        if moved {
            // The request's own external id beats the one guessed from the suffix.
            if let Some(old) = old
                && let Some(ids) = self.by_external.get_mut(&old)
            {
                ids.retain(|id| id != &add.request_id);
            }
            if let Some(ext) = external {
                self.by_external
                    .entry(ext)
                    .or_default()
                    .push(add.request_id.clone());
            }
        }
    }

    fn on_outputs(
        &mut self,
        outputs: Outputs,
        (tgid, tid, server): (u32, u32, u32),
        steps: &mut Vec<StepRecord>,
    ) {
        let ts_ns = outputs.timestamp.and_then(mono_seconds_to_ns);
        if ts_ns.is_some_and(|ts| self.seen_twice(ts)) {
            self.stats.bump(Counter::VllmOutputsSeenTwice);
            return;
        }
        if outputs.partial {
            self.stats.bump(Counter::VllmOutputsPartial);
        }
        let engine = (server, outputs.engine_index.unwrap_or(0));
        let mut batch = Batch::default();
        let members: Vec<StepMember> = outputs
            .outputs
            .into_iter()
            .map(|out| self.on_output(out, ts_ns, engine, &mut batch))
            .collect();
        let (Some(end), Some(stats)) = (ts_ns, outputs.stats) else {
            return;
        };
        let (start, start_from, kernels_from) = self.step_start(
            engine,
            end,
            &batch.sched_stamps,
            stats.running.unwrap_or(0) > 0,
        );
        self.remember_step(
            engine,
            end,
            tgid,
            stats.kv_transfers.clone(),
            batch.admitted,
        );
        steps.push(StepRecord {
            pid: tgid,
            engine: "vllm".into(),
            tid,
            start_mono_ns: start,
            end_mono_ns: end,
            duration_ms: ns_to_ms(end - start),
            batch_tokens: None,
            sequences: members.len() as u64,
            prefilling: members.iter().filter(|m| m.phase == "prefill").count() as u64,
            requests: members,
            kv_cache_usage: stats.kv_cache_usage,
            running_requests: stats.running,
            waiting_requests: stats.waiting,
            start_from: Some(start_from),
            kernels_from_ns: kernels_from,
            kernel_pid: self
                .engine_pids
                .get(&engine)
                .copied()
                .filter(|&p| p != tgid),
            ..StepRecord::default()
        });
    }

    /// Whether an outputs message stamped `ts` was seen already (the API server and the
    /// engine core's sides of one socket both captured); remembers it.
    fn seen_twice(&mut self, ts: u64) -> bool {
        if self.seen_outputs.contains(&ts) {
            return true;
        }
        if self.seen_outputs.len() >= SEEN_OUTPUTS {
            self.seen_outputs.pop_front();
        }
        self.seen_outputs.push_back(ts);
        false
    }

    /// One request's output in a step: its scheduler events, tokens, finish; its membership
    /// of the step (prefill for the step of its first token).
    fn on_output(
        &mut self,
        out: Output,
        ts_ns: Option<u64>,
        engine_key: (u32, i64),
        batch: &mut Batch,
    ) -> StepMember {
        let room = self.output_steps_total < OUTPUT_STEPS_TOTAL;
        let mut kept = false;
        let r = self.entry(&out.request_id);
        let was_admitted = r.scheduled_ns.is_some();
        let mut bad_time = 0;
        for ev in &out.events {
            let Some(ns) = mono_seconds_to_ns(ev.timestamp) else {
                bad_time += 1;
                continue;
            };
            if r.events.contains(&(ev.kind, ns)) {
                continue;
            }
            if r.events.len() < MAX_EVENTS {
                r.events.push((ev.kind, ns));
            } else {
                r.steps_overflow = true;
            }
            if ev.kind != EventKind::Queued && batch.sched_stamps.len() < MAX_EVENTS {
                batch.sched_stamps.push(ns);
            }
            match ev.kind {
                EventKind::Queued => r.queued_ns = Some(r.queued_ns.map_or(ns, |q| q.min(ns))),
                EventKind::Scheduled => {
                    r.scheduled_ns = Some(r.scheduled_ns.map_or(ns, |s| s.min(ns)))
                }
                EventKind::Preempted => r.preemptions += 1,
            }
        }
        if !was_admitted && let (Some(sched), Some(queued)) = (r.scheduled_ns, r.queued_ns) {
            batch.admitted.push((sched, queued, out.request_id.clone()));
        }
        let first = r.first_output_ns.is_none() && out.new_tokens > 0;
        if out.new_tokens > 0 && ts_ns.is_some() {
            r.first_output_ns = r.first_output_ns.or(ts_ns);
        }
        r.output_tokens += out.new_tokens as u64;
        r.engine = Some(engine_key);
        if let Some(ts) = ts_ns
            && (out.new_tokens > 0 || out.finish_reason.is_some())
            && r.output_steps.last().is_none_or(|&l| l < ts)
        {
            if room && r.output_steps.len() < OUTPUT_STEPS {
                r.output_steps.push(ts);
                kept = true;
            } else {
                r.steps_overflow = true;
            }
        }
        if out.finish_reason.is_some() {
            r.finish_reason = out.finish_reason;
            r.aborted |= out.finish_reason == Some("abort");
        }
        self.output_steps_total += usize::from(kept);
        self.stats.add(Counter::VllmEventBadTimestamp, bad_time);
        StepMember {
            request_id: out.request_id,
            phase: if first { "prefill" } else { "decode" },
        }
    }

    /// Where the step that ended at `end` started. A SCHEDULED or PREEMPTED stamp after the
    /// previous step's end was taken in this step's schedule(): its start, on the scheduler's
    /// own clock. Otherwise, while requests run, vLLM steps back to back: the previous step's
    /// end (the engine's work between steps, such as reading new requests, counts in). After
    /// an idle gap the start is unknown and reported as the end; the engine ran nothing since
    /// its previous step, so the kernels launched since then are this step's.
    fn step_start(
        &mut self,
        engine: (u32, i64),
        end: u64,
        sched_stamps: &[u64],
        running: bool,
    ) -> (u64, &'static str, Option<u64>) {
        let found = match self.last_step.get(&engine) {
            Some(&(prev, was_running)) if prev <= end => {
                match sched_stamps.iter().filter(|&&t| t > prev && t <= end).min() {
                    Some(&t) => (t, "scheduled", None),
                    None if was_running => (prev, "previous_step", None),
                    None => (end, "unknown", Some(prev + 1)),
                }
            }
            _ => (end, "unknown", None),
        };
        if self.last_step.len() >= MAX_ENGINES && !self.last_step.contains_key(&engine) {
            self.last_step.clear();
            self.stats.bump(Counter::VllmEngineTableFull);
        }
        self.last_step.insert(engine, (end, running));
        found
    }

    /// Keeps the step in its engine's ring (one engine's outputs come in step order; a late
    /// one is put in its place), with each request it first admitted: to the step its
    /// SCHEDULED stamp fell in (the first whose end is not before it), when it was queued
    /// before the step ahead of that one ended.
    fn remember_step(
        &mut self,
        engine: (u32, i64),
        end: u64,
        tgid: u32,
        transfers: KvTransfers,
        admitted: Vec<(u64, u64, String)>,
    ) {
        if self.engine_steps.len() >= STEP_ENGINES && !self.engine_steps.contains_key(&engine) {
            self.engine_steps.clear();
            self.stats.bump(Counter::VllmStepEnginesReset);
        }
        let ring = self.engine_steps.entry(engine).or_default();
        if ring.len() >= STEPS_PER_ENGINE {
            ring.pop_front();
        }
        let at = ring.partition_point(|s| s.end < end);
        if ring.get(at).is_none_or(|s| s.end != end) {
            ring.insert(
                at,
                EngineStep {
                    end,
                    tgid,
                    transfers,
                    held: Vec::new(),
                    held_overflow: false,
                },
            );
        }
        for (sched, queued, id) in admitted {
            let a = ring.partition_point(|s| s.end < sched);
            let Some(before) = a.checked_sub(1).and_then(|i| ring.get(i)).map(|s| s.end) else {
                continue;
            };
            if queued >= before {
                continue;
            }
            if let Some(step) = ring.get_mut(a) {
                if step.held.len() < MAX_HELD {
                    step.held.push((queued, id));
                } else {
                    step.held_overflow = true;
                }
            }
        }
    }

    /// Engine ids that belong to `record`: those whose external id is one of its ids (the
    /// stream id, `chatcmpl-`/`cmpl-` + X-Request-Id), or that id plus `-<prompt index>`
    /// (completions: one engine request per prompt), and whose events lie inside the HTTP
    /// request's lifetime. `n > 1` children share their parent's external id. None when one
    /// external id names engine requests of different HTTP requests (a reused X-Request-Id).
    fn members(&mut self, record: &RequestRecord) -> Option<Vec<String>> {
        let keys = join_keys(record);
        let key = self.known_key(&keys)?;
        // Two servers may hold requests with one external id (a disaggregated request's
        // prefill and decode legs share the proxy's X-Request-Id): where the record's own
        // server holds some, only those are its.
        let pid = record.pid;
        let server_of = |r: &RequestState| r.server.or(r.engine.map(|(s, _)| s));
        let own_server = externals_of(&self.by_external, key)
            .flat_map(|ids| ids.iter())
            .any(|id| self.requests.get(id).and_then(server_of) == Some(pid));
        let inside = |r: &RequestState| {
            if own_server && server_of(r) != Some(pid) {
                return false;
            }
            let first = r.queued_ns.or(r.scheduled_ns);
            // An engine request aborted with its client may be admitted after the client left
            // (the abort reaches the engine after the API server forwarded the request).
            first.is_none_or(|t| t >= record.arrival_mono_ns)
                && r.scheduled_ns
                    .is_none_or(|t| t <= record.end_mono_ns || (record.aborted && r.aborted))
        };
        let mut externals = vec![key.clone()];
        for i in 0..MAX_PROMPTS {
            let ext = format!("{key}-{i}");
            if !self.by_external.contains_key(&ext) {
                break;
            }
            externals.push(ext);
        }
        let mut members = Vec::new();
        let mut outside = false;
        for ext in &externals {
            let Some(ids) = self.by_external.get(ext) else {
                continue;
            };
            let mut parents: Vec<&str> = Vec::new();
            for id in ids {
                if !self.requests.get(id).is_some_and(inside) {
                    outside = true;
                    continue;
                }
                let parent = parent_of(id);
                if !parents.contains(&parent) {
                    parents.push(parent);
                }
                members.push(id.clone());
            }
            if parents.len() > 1 {
                self.stats.bump(Counter::VllmJoinAmbiguous);
                return None;
            }
        }
        if members.is_empty() && outside {
            self.stats.bump(Counter::VllmJoinOutsideRequestTime);
        }
        (!members.is_empty()).then_some(members)
    }

    /// The steps of its engine that `r` took part in, with its phase in each: the steps that
    /// gave it a token, and those it was scheduled in without one (prefill chunks, recomputing
    /// after a preemption). vLLM sends an output only for a request that got a token, so the
    /// latter are the engine's steps whose schedule() fell after a SCHEDULED event (stamped
    /// inside a step's schedule(), so before that step's end and after the previous one's),
    /// before the next PREEMPTED and before its next output. Up to its last
    /// output when it finished, else to `until` (the HTTP request's end). Prefill up to and
    /// including the step of its first token. None when the join cannot be exact (events or
    /// steps not kept).
    fn steps_of(&self, r: &RequestState, until: u64) -> Option<Vec<StepRef>> {
        if r.steps_overflow {
            return None;
        }
        let mut marks: Vec<(u64, bool)> = r
            .events
            .iter()
            .filter(|(k, _)| *k != EventKind::Queued)
            .map(|&(k, t)| (t, k == EventKind::Scheduled))
            .collect();
        marks.sort_unstable();
        let Some(&(first, true)) = marks.first() else {
            return Some(Vec::new());
        };
        let Some(ring) = r.engine.and_then(|e| self.engine_steps.get(&e)) else {
            // No step of its engine was seen (its outputs carry no scheduler stats): nothing
            // to join, and the timeline says its steps are unknown.
            return Some(Vec::new());
        };
        if ring.front().is_none_or(|s| s.end > first) && ring.len() >= STEPS_PER_ENGINE {
            // Its first steps were forgotten.
            return None;
        }
        let last = match (r.finish_reason, r.output_steps.last()) {
            (Some(reason), Some(&l)) if reason != "abort" => l,
            (_, l) => until.max(l.copied().unwrap_or(0)),
        };
        let first_token = r.output_steps.first().copied();
        let from = ring.partition_point(|s| s.end <= first);
        let mut out = Vec::new();
        for step in ring.range(from..) {
            if step.end > last {
                break;
            }
            // Without an output, it took part only while it was (re)computing its tokens:
            // scheduled, and no output yet since. Once it has one, every step it is scheduled
            // in gives it a token (a step without one skipped it for want of token budget).
            let chunk = marks
                .partition_point(|&(t, _)| t < step.end)
                .checked_sub(1)
                .is_some_and(|i| {
                    let (since, running) = marks[i];
                    let next = r.output_steps.partition_point(|&o| o <= since);
                    running && r.output_steps.get(next).is_none_or(|&o| o >= step.end)
                });
            if !chunk && r.output_steps.binary_search(&step.end).is_err() {
                continue;
            }
            let prefill = first_token.is_none_or(|f| step.end <= f);
            out.push(StepRef {
                pid: step.tgid,
                end_mono_ns: step.end,
                phase: if prefill { "prefill" } else { "decode" },
            });
        }
        Some(out)
    }

    /// Lists on `record` the steps its engine requests took part in (one entry per step; a
    /// step is prefill when any of them prefilled in it), and counts them.
    fn join_steps(&mut self, record: &mut RequestRecord, states: &[RequestState]) {
        let mut steps: Vec<StepRef> = Vec::new();
        for s in states {
            match self.steps_of(s, record.end_mono_ns) {
                Some(mine) => steps.extend(mine),
                None => {
                    self.stats.bump(Counter::VllmRequestStepsUnknown);
                    record.engine_unknown.push("prefill_steps");
                    record.engine_unknown.push("decode_steps");
                    return;
                }
            }
        }
        steps.sort_unstable_by_key(|s| (s.end_mono_ns, s.pid, s.phase != "prefill"));
        steps.dedup_by_key(|s| (s.end_mono_ns, s.pid));
        if steps.is_empty() {
            return;
        }
        let prefill = steps.iter().filter(|s| s.phase == "prefill").count() as u64;
        record.prefill_steps = Some(prefill);
        record.decode_steps = Some(steps.len() as u64 - prefill);
        record.engine_steps = steps;
    }

    /// The KV connector's own transfer time (ms) for `r`, a request that waited for a remote
    /// KV cache: the connector reports its finished transfers' durations with the step its
    /// worker saw them finish (naming no request), and the scheduler admits those requests in
    /// the next step. So the step before `r`'s admission step holds its duration, when that
    /// step reported as many transfers as requests the admission step took in after waiting;
    /// NIXL lists them in the order their loads started, which is the waiting queue's order
    /// (first queued first), so the i-th duration is the i-th of them by queued time. None
    /// when `r` was not admitted after a reported transfer; counted when it was but the
    /// numbers do not match.
    fn kv_transfer_ms(&mut self, r: &RequestState) -> Option<f64> {
        let sched = r.scheduled_ns?;
        let ring = self.engine_steps.get(&r.engine?)?;
        let a = ring.partition_point(|s| s.end < sched);
        let admission = ring.get(a)?;
        let before = ring.get(a.checked_sub(1)?)?;
        if !admission.held.iter().any(|(_, id)| id == &r.request_id) {
            return None;
        }
        let durations = match &before.transfers {
            KvTransfers::None => return None,
            KvTransfers::Durations(d)
                if !admission.held_overflow && d.len() == admission.held.len() =>
            {
                d
            }
            _ => {
                self.stats.bump(Counter::VllmKvTransfersUnattributed);
                return None;
            }
        };
        let mut order: Vec<&(u64, String)> = admission.held.iter().collect();
        order.sort_unstable();
        let i = order.iter().position(|(_, id)| id == &r.request_id)?;
        durations.get(i).map(|s| s * 1e3)
    }

    /// The first of `keys` that names engine requests (itself, or its first prompt's).
    fn known_key<'k>(&self, keys: &'k [String]) -> Option<&'k String> {
        keys.iter().find(|k| {
            self.by_external.contains_key(k.as_str())
                || self.by_external.contains_key(&format!("{k}-0"))
        })
    }

    /// Whether the engine may still tell about `record`'s request: its client left before
    /// any token, and the engine has not yet heard of it (vLLM's API server forwards a request
    /// only after tokenising it), or some of its engine requests have not been aborted or
    /// finished yet (the API server forwards the abort after that).
    pub(super) fn awaits_engine(&self, record: &RequestRecord) -> bool {
        if !record.aborted || record.first_token_mono_ns.is_some() {
            return false;
        }
        let keys = join_keys(record);
        if keys.is_empty() {
            // Nothing could join it, however long it waits.
            return false;
        }
        let Some(key) = self.known_key(&keys) else {
            return true;
        };
        externals_of(&self.by_external, key)
            .flatten()
            .filter_map(|id| self.requests.get(id))
            .any(|r| !r.aborted && r.finish_reason.is_none())
    }

    /// Fills `record` (an HTTP request that just finished) from the engine requests that
    /// served it (one, or one per prompt and per `n`), and forgets them. Admission is the
    /// first SCHEDULED of any; preemptions add up, and are unknown (not 0) when a request was
    /// aborted: vLLM reports a preemption only with the request's next output, which an
    /// aborted request may never get.
    pub(super) fn enrich(&mut self, record: &mut RequestRecord) {
        let served = record.first_token_mono_ns.is_some();
        let Some(members) = self.members(record) else {
            if served && (record.path.contains("completions") || record.rpc_request_id.is_some()) {
                // The engine generated for it, yet no IPC message named it.
                self.stats.bump(Counter::VllmRequestsUnjoined);
                record.engine_unknown = vec!["admitted_mono_ns", "prompt_tokens", "preemptions"];
            }
            return;
        };
        let states: Vec<RequestState> = members.iter().filter_map(|id| self.remove(id)).collect();
        self.join_steps(record, &states);
        self.stats
            .add(Counter::VllmRequestsJoined, states.len() as u64);
        if record.prompt_tokens.is_none() {
            // One prompt per parent: `n > 1` children repeat their parent's prompt.
            let mut seen: Vec<&str> = Vec::new();
            let mut sum = Some(0u64);
            for s in &states {
                let parent = parent_of(&s.request_id);
                if seen.contains(&parent) {
                    continue;
                }
                seen.push(parent);
                sum = sum.zip(s.prompt_tokens).map(|(a, b)| a + b);
            }
            record.prompt_tokens = sum;
            if sum.is_none() {
                record.engine_unknown.push("prompt_tokens");
            }
        }
        record.engine_queued_mono_ns = states.iter().filter_map(|s| s.queued_ns).min();
        record.engine_first_output_mono_ns = states.iter().filter_map(|s| s.first_output_ns).min();
        // One request's KV transfer (a decode leg of disaggregated serving holds one engine
        // request; for several, the longest is the one the record waited for).
        record.engine_kv_transfer_ms = states
            .iter()
            .filter_map(|s| self.kv_transfer_ms(s))
            .reduce(f64::max);
        let Some(admitted) = states.iter().filter_map(|s| s.scheduled_ns).min() else {
            if served {
                record.engine_unknown.push("admitted_mono_ns");
            }
            return;
        };
        record.set_admitted(admitted);
        let aborted = record.aborted || states.iter().any(|s| s.aborted);
        record.preemptions = if aborted {
            self.stats.bump(Counter::VllmPreemptionsUnknownAborted);
            record.engine_unknown.push("preemptions");
            None
        } else {
            Some(states.iter().map(|s| s.preemptions).sum())
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::vllm::messages::{Event, Output};

    fn output(id: &str, kind: EventKind, ts: f64) -> IpcMessage {
        IpcMessage::Outputs(Outputs {
            timestamp: Some(ts + 0.5),
            engine_index: Some(0),
            outputs: vec![Output {
                request_id: id.into(),
                new_tokens: 1,
                finish_reason: None,
                events: vec![Event {
                    kind,
                    timestamp: ts,
                }],
            }],
            stats: None,
            finished_requests: Vec::new(),
            partial: false,
        })
    }

    #[test]
    fn external_ids_are_the_request_id_without_its_suffix() {
        assert_eq!(external_of("chatcmpl-abc-12345678"), Some("chatcmpl-abc"));
        assert_eq!(external_of("chatcmpl-abc-123"), None);
        assert_eq!(external_of("-12345678"), None);
    }

    #[test]
    fn the_request_table_is_bounded_and_joins_stay_cheap() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        for i in 0..(3 * MAX_REQUESTS) {
            let id = format!("chatcmpl-r{i}-abcdefgh");
            state.apply(
                output(&id, EventKind::Queued, 10.0 + i as f64),
                (1, 1, 1),
                &mut steps,
            );
            // Every other request is joined (its HTTP record finished).
            if i % 2 == 0 {
                let mut record = RequestRecord {
                    response_id: Some(format!("chatcmpl-r{i}")),
                    end_mono_ns: u64::MAX,
                    ..Default::default()
                };
                state.enrich(&mut record);
            }
        }
        assert!(state.requests.len() <= MAX_REQUESTS);
        assert!(state.order.len() <= 2 * MAX_REQUESTS);
        assert!(state.by_external.len() <= MAX_REQUESTS);
        // Output steps are accounted for as requests come and go.
        let kept: usize = state.requests.values().map(|r| r.output_steps.len()).sum();
        assert_eq!(state.output_steps_total, kept);
        assert!(kept > 0 && kept <= OUTPUT_STEPS_TOTAL);
        assert!(state.stats.get(Counter::VllmRequestsEvictedUnjoined) > 0);
    }

    /// The client left while its request was being tokenised: the record ends before the
    /// engine hears of the request, which it then queues, schedules, and is told to abort.
    #[test]
    fn a_request_whose_client_left_before_the_engine_heard_of_it_joins_late() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        let mut record = RequestRecord {
            x_request_id: Some("q1".into()),
            arrival_mono_ns: 9_000_000_000,
            end_mono_ns: 9_020_000_000,
            aborted: true,
            ..Default::default()
        };
        assert!(
            state.awaits_engine(&record),
            "the engine has not heard of it"
        );
        let add = |prompt| {
            IpcMessage::Add(AddRequest {
                request_id: "chatcmpl-q1-abcdefgh".into(),
                external_req_id: Some("chatcmpl-q1".into()),
                prompt_tokens: Some(prompt),
                arrival_time: None,
                partial: false,
            })
        };
        state.apply(add(61), (1, 1, 1), &mut steps);
        assert!(state.awaits_engine(&record), "nor told it to abort");
        state.apply(
            output("chatcmpl-q1-abcdefgh", EventKind::Queued, 9.05),
            (1, 1, 1),
            &mut steps,
        );
        state.apply(
            output("chatcmpl-q1-abcdefgh", EventKind::Scheduled, 9.06),
            (1, 1, 1),
            &mut steps,
        );
        state.apply(
            IpcMessage::Abort {
                request_ids: vec!["chatcmpl-q1-abcdefgh".into()],
            },
            (1, 1, 1),
            &mut steps,
        );
        assert!(!state.awaits_engine(&record));
        state.enrich(&mut record);
        assert_eq!(record.prompt_tokens, Some(61));
        // Admitted after its client left: the engine's work for nobody, shown as it was.
        assert_eq!(record.admitted_mono_ns, Some(9_060_000_000));
        assert_eq!(record.preemptions, None);

        // Served, unaborted, or unjoinable records never wait.
        let served = RequestRecord {
            x_request_id: Some("q2".into()),
            aborted: true,
            first_token_mono_ns: Some(1),
            ..Default::default()
        };
        let finished = RequestRecord {
            x_request_id: Some("q3".into()),
            ..Default::default()
        };
        let anonymous = RequestRecord {
            aborted: true,
            ..Default::default()
        };
        for r in [&served, &finished, &anonymous] {
            assert!(!state.awaits_engine(r), "{r:?}");
        }
        // An engine request admitted after the record's end is not its own unless both ended
        // by an abort.
        state.apply(add(7), (1, 1, 1), &mut steps);
        state.apply(
            output("chatcmpl-q1-abcdefgh", EventKind::Scheduled, 9.5),
            (1, 1, 1),
            &mut steps,
        );
        let mut unaborted = RequestRecord {
            x_request_id: Some("q1".into()),
            arrival_mono_ns: 9_000_000_000,
            end_mono_ns: 9_020_000_000,
            ..Default::default()
        };
        state.enrich(&mut unaborted);
        assert_eq!(unaborted.admitted_mono_ns, None);
    }

    #[test]
    fn two_engine_requests_with_one_http_id_are_not_guessed_between() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        // A client reused its X-Request-Id: two engine requests share the external id.
        state.apply(
            output("chatcmpl-x-aaaaaaaa", EventKind::Scheduled, 10.0),
            (1, 1, 1),
            &mut steps,
        );
        state.apply(
            output("chatcmpl-x-bbbbbbbb", EventKind::Scheduled, 11.0),
            (1, 1, 1),
            &mut steps,
        );
        let mut record = RequestRecord {
            response_id: Some("chatcmpl-x".into()),
            arrival_mono_ns: 9_000_000_000,
            end_mono_ns: 12_000_000_000,
            ..Default::default()
        };
        state.enrich(&mut record);
        assert_eq!(record.admitted_mono_ns, None);
        assert_eq!(state.stats.get(Counter::VllmJoinAmbiguous), 1);
        // A request whose lifetime holds only one of them gets that one.
        record.arrival_mono_ns = 10_500_000_000;
        state.enrich(&mut record);
        assert_eq!(record.admitted_mono_ns, Some(11_000_000_000));
    }

    /// Disaggregated serving: the proxy sends the prefill and the decode server the same
    /// X-Request-Id, so both servers' engine requests carry one external id; each server's
    /// record joins its own.
    #[test]
    fn two_servers_with_one_http_id_each_join_their_own() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        for (server, id, t) in [
            (100, "cmpl-x-0-aaaaaaaa", 10.0),
            (200, "cmpl-x-0-bbbbbbbb", 10.2),
        ] {
            state.apply(add(id, "cmpl-x-0", 7), (server, 1, server), &mut steps);
            state.apply(
                output(id, EventKind::Scheduled, t),
                (server + 1, 1, server),
                &mut steps,
            );
        }
        for (server, admitted) in [(200, 10_200_000_000), (100, 10_000_000_000)] {
            let mut record = RequestRecord {
                pid: server,
                path: "/v1/completions".into(),
                x_request_id: Some("x".into()),
                arrival_mono_ns: 9_000_000_000,
                end_mono_ns: 12_000_000_000,
                ..Default::default()
            };
            state.enrich(&mut record);
            assert_eq!(record.admitted_mono_ns, Some(admitted), "server {server}");
        }
        assert_eq!(state.stats.get(Counter::VllmJoinAmbiguous), 0);
    }

    fn add(id: &str, external: &str, prompt: u64) -> IpcMessage {
        IpcMessage::Add(AddRequest {
            request_id: id.into(),
            external_req_id: Some(external.into()),
            prompt_tokens: Some(prompt),
            arrival_time: None,
            partial: false,
        })
    }

    #[test]
    fn completions_join_every_prompt_and_every_choice() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        // Two prompts with n = 2: four engine requests, `<k>_cmpl-<id>-<prompt>-<8 chars>`.
        for (id, ext, prompt, t) in [
            ("0_cmpl-x-0-aaaaaaaa", "cmpl-x-0", 5, 10.2),
            ("1_cmpl-x-0-aaaaaaaa", "cmpl-x-0", 5, 10.1),
            ("0_cmpl-x-1-bbbbbbbb", "cmpl-x-1", 7, 10.3),
            ("1_cmpl-x-1-bbbbbbbb", "cmpl-x-1", 7, 10.3),
        ] {
            state.apply(add(id, ext, prompt), (1, 1, 1), &mut steps);
            state.apply(output(id, EventKind::Scheduled, t), (1, 1, 1), &mut steps);
        }
        let mut record = RequestRecord {
            response_id: Some("cmpl-x".into()),
            arrival_mono_ns: 9_000_000_000,
            end_mono_ns: 12_000_000_000,
            ..Default::default()
        };
        state.enrich(&mut record);
        assert_eq!(record.admitted_mono_ns, Some(10_100_000_000));
        // Each prompt once, however many choices it had.
        assert_eq!(record.prompt_tokens, Some(12));
        assert_eq!(record.preemptions, Some(0));
        assert!(state.is_empty());
    }

    #[test]
    fn a_preempted_then_aborted_request_has_unknown_preemptions() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        state.apply(
            add("chatcmpl-a-aaaaaaaa", "chatcmpl-a", 3),
            (1, 1, 1),
            &mut steps,
        );
        state.apply(
            output("chatcmpl-a-aaaaaaaa", EventKind::Scheduled, 10.0),
            (1, 1, 1),
            &mut steps,
        );
        state.apply(
            IpcMessage::Abort {
                request_ids: vec!["chatcmpl-a-aaaaaaaa".into()],
            },
            (1, 1, 1),
            &mut steps,
        );
        let mut record = RequestRecord {
            response_id: Some("chatcmpl-a".into()),
            arrival_mono_ns: 9_000_000_000,
            end_mono_ns: 12_000_000_000,
            ..Default::default()
        };
        state.enrich(&mut record);
        assert_eq!(record.admitted_mono_ns, Some(10_000_000_000));
        assert_eq!(record.preemptions, None);
        assert_eq!(record.engine_unknown, vec!["preemptions"]);
    }

    fn step(ts: f64, running: u64) -> IpcMessage {
        IpcMessage::Outputs(Outputs {
            timestamp: Some(ts),
            engine_index: Some(0),
            outputs: Vec::new(),
            stats: Some(crate::engines::vllm::messages::SchedulerStats {
                running: Some(running),
                ..Default::default()
            }),
            finished_requests: Vec::new(),
            partial: false,
        })
    }

    /// One output of a scripted step: engine id, new tokens, finish, events.
    type ScriptedOutput<'a> = (&'a str, u32, Option<&'static str>, &'a [(EventKind, f64)]);

    /// One step's message.
    fn step_with(ts: f64, outputs: &[ScriptedOutput<'_>]) -> IpcMessage {
        step_on(ts, 0, outputs)
    }

    /// One step's message from the data-parallel engine core `engine_index`.
    fn step_on(ts: f64, engine_index: i64, outputs: &[ScriptedOutput<'_>]) -> IpcMessage {
        IpcMessage::Outputs(Outputs {
            timestamp: Some(ts),
            engine_index: Some(engine_index),
            outputs: outputs
                .iter()
                .map(|&(id, new_tokens, finish_reason, events)| Output {
                    request_id: id.into(),
                    new_tokens,
                    finish_reason,
                    events: events
                        .iter()
                        .map(|&(kind, timestamp)| Event { kind, timestamp })
                        .collect(),
                })
                .collect(),
            stats: Some(crate::engines::vllm::messages::SchedulerStats {
                running: Some(1),
                ..Default::default()
            }),
            finished_requests: Vec::new(),
            partial: false,
        })
    }

    /// One step's message whose scheduler stats carry the connector's transfer durations.
    fn step_kv(ts: f64, transfers: &[f64], outputs: &[ScriptedOutput<'_>]) -> IpcMessage {
        let IpcMessage::Outputs(mut o) = step_with(ts, outputs) else {
            unreachable!("step_with builds outputs");
        };
        if let Some(stats) = o.stats.as_mut() {
            stats.kv_transfers = if transfers.is_empty() {
                KvTransfers::None
            } else {
                KvTransfers::Durations(transfers.to_vec())
            };
        }
        IpcMessage::Outputs(o)
    }

    /// Disaggregated decode: the connector reports finished transfers' durations with the step
    /// its worker saw them finish, naming no request; the requests whose KV arrived are
    /// admitted in the next step. Each gets its own duration (in the order of their queueing,
    /// NIXL's order), and a step whose numbers do not match attributes none.
    #[test]
    fn connector_transfer_times_go_to_the_requests_they_released() {
        use EventKind::{Queued, Scheduled};
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        let (d1, d2, d3) = (
            "cmpl-d1-0-aaaaaaaa",
            "cmpl-d2-0-bbbbbbbb",
            "cmpl-d3-0-cccccccc",
        );
        let (p, q) = ("cmpl-p-0-dddddddd", "cmpl-q-0-eeeeeeee");
        for (id, ext) in [
            (d1, "cmpl-d1-0"),
            (d2, "cmpl-d2-0"),
            (d3, "cmpl-d3-0"),
            (p, "cmpl-p-0"),
            (q, "cmpl-q-0"),
        ] {
            state.apply(add(id, ext, 40), (1, 1, 1), &mut steps);
        }
        let script: &[(f64, &[f64], &[ScriptedOutput<'_>])] = &[
            (1.00, &[], &[]),
            (1.01, &[], &[]),
            // d1 and d2 (queued at 0.995 and 0.996) finished loading: d2's listed second.
            (1.02, &[0.011, 0.0123], &[]),
            (
                1.03,
                &[],
                &[
                    (d2, 1, None, &[(Queued, 0.996), (Scheduled, 1.025)]),
                    (d1, 1, None, &[(Queued, 0.995), (Scheduled, 1.025)]),
                ],
            ),
            // p arrived after 1.03 and was admitted at once: it waited for nothing.
            (
                1.04,
                &[],
                &[(p, 1, None, &[(Queued, 1.035), (Scheduled, 1.036)])],
            ),
            // One transfer reported (d3's), but a request held for room (q) was admitted with
            // d3: which is whose is not known.
            (1.05, &[0.02], &[]),
            (
                1.06,
                &[],
                &[
                    (d3, 1, None, &[(Queued, 1.0305), (Scheduled, 1.055)]),
                    (q, 1, None, &[(Queued, 1.041), (Scheduled, 1.055)]),
                ],
            ),
        ];
        for &(ts, transfers, outputs) in script {
            state.apply(step_kv(ts, transfers, outputs), (1, 1, 1), &mut steps);
        }
        let transfer = |state: &mut IpcState, x: &str| {
            let mut record = RequestRecord {
                pid: 1,
                path: "/v1/completions".into(),
                x_request_id: Some(x.into()),
                arrival_mono_ns: 900_000_000,
                end_mono_ns: 2_000_000_000,
                ..Default::default()
            };
            state.enrich(&mut record);
            assert!(record.admitted_mono_ns.is_some(), "{x} joined");
            record.engine_kv_transfer_ms
        };
        let close = |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() < 1e-9);
        assert!(close(transfer(&mut state, "d1"), 11.0));
        assert!(close(transfer(&mut state, "d2"), 12.3));
        assert_eq!(transfer(&mut state, "p"), None);
        assert_eq!(state.stats.get(Counter::VllmKvTransfersUnattributed), 0);
        assert_eq!(transfer(&mut state, "d3"), None);
        assert_eq!(transfer(&mut state, "q"), None);
        assert_eq!(state.stats.get(Counter::VllmKvTransfersUnattributed), 2);
    }

    #[test]
    fn requests_get_their_steps_with_chunks_and_preemptions() {
        use EventKind::{Preempted, Queued, Scheduled};
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        let a = "chatcmpl-a-aaaaaaaa";
        let b = "chatcmpl-b-bbbbbbbb";
        state.apply(add(a, "chatcmpl-a", 3000), (5, 5, 1), &mut steps);
        state.apply(add(b, "chatcmpl-b", 10), (5, 5, 1), &mut steps);
        // Step ends at 1.0, 1.1, ...: `a` is scheduled in step 1.1's schedule() and prefills
        // in chunks (1.1, 1.2: no output), its first token comes with 1.3; preempted in 1.5's
        // schedule(), back in 1.7's where it recomputes (no output), tokens again from 1.8,
        // finished at 1.9. `b` runs 1.4 .. 1.6 alone; 2.0 is an idle step.
        let script: &[(f64, &[ScriptedOutput<'_>])] = &[
            (1.0, &[]),
            (1.1, &[]),
            (1.2, &[]),
            (1.3, &[(a, 1, None, &[(Queued, 1.01), (Scheduled, 1.05)])]),
            (
                1.4,
                &[(a, 1, None, &[]), (b, 1, None, &[(Scheduled, 1.35)])],
            ),
            (1.5, &[(b, 1, None, &[])]),
            // 1.55: a step that skipped `b` (token budget): no output, not listed.
            (1.55, &[]),
            (1.6, &[(b, 1, Some("stop"), &[])]),
            (1.7, &[]),
            (
                1.8,
                &[(a, 1, None, &[(Preempted, 1.45), (Scheduled, 1.65)])],
            ),
            (1.9, &[(a, 1, Some("length"), &[])]),
            (2.0, &[]),
        ];
        for &(ts, outs) in script {
            state.apply(step_with(ts, outs), (5, 5, 1), &mut steps);
        }
        let mut record = RequestRecord {
            response_id: Some("chatcmpl-a".into()),
            arrival_mono_ns: 1_000_000_000,
            end_mono_ns: 1_950_000_000,
            ..Default::default()
        };
        state.enrich(&mut record);
        let got: Vec<(u64, &str)> = record
            .engine_steps
            .iter()
            .map(|s| (s.end_mono_ns / 1_000_000, s.phase))
            .collect();
        assert_eq!(
            got,
            vec![
                (1100, "prefill"),
                (1200, "prefill"),
                (1300, "prefill"),
                (1400, "decode"),
                (1700, "decode"),
                (1800, "decode"),
                (1900, "decode"),
            ]
        );
        assert_eq!(
            (record.prefill_steps, record.decode_steps),
            (Some(3), Some(4))
        );
        assert!(record.engine_steps.iter().all(|s| s.pid == 5));

        let mut record = RequestRecord {
            response_id: Some("chatcmpl-b".into()),
            arrival_mono_ns: 1_000_000_000,
            end_mono_ns: 1_950_000_000,
            ..Default::default()
        };
        state.enrich(&mut record);
        assert_eq!(
            (record.prefill_steps, record.decode_steps),
            (Some(1), Some(2))
        );
    }

    #[test]
    fn an_aborted_request_lists_steps_only_until_its_record_ends() {
        use EventKind::Scheduled;
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        let a = "chatcmpl-a-aaaaaaaa";
        state.apply(add(a, "chatcmpl-a", 3000), (5, 5, 1), &mut steps);
        state.apply(step_with(1.0, &[]), (5, 5, 1), &mut steps);
        state.apply(
            step_with(1.1, &[(a, 1, None, &[(Scheduled, 1.05)])]),
            (5, 5, 1),
            &mut steps,
        );
        state.apply(step_with(1.2, &[(a, 1, None, &[])]), (5, 5, 1), &mut steps);
        state.apply(
            IpcMessage::Abort {
                request_ids: vec![a.into()],
            },
            (5, 5, 1),
            &mut steps,
        );
        // The engine ran one more step before the abort reached it: no output, not listed.
        state.apply(step_with(1.3, &[]), (5, 5, 1), &mut steps);
        let mut record = RequestRecord {
            response_id: Some("chatcmpl-a".into()),
            arrival_mono_ns: 1_000_000_000,
            end_mono_ns: 1_250_000_000,
            aborted: true,
            ..Default::default()
        };
        state.enrich(&mut record);
        assert_eq!(
            (record.prefill_steps, record.decode_steps),
            (Some(1), Some(1))
        );
    }

    #[test]
    fn two_servers_chain_their_own_steps() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        // Interleaved steps of servers 100 and 200.
        for (ts, server) in [
            (1.0, 100),
            (1.001, 200),
            (1.004, 100),
            (1.006, 200),
            (1.008, 100),
        ] {
            state.apply(step(ts, 1), (server, server, server), &mut steps);
        }
        let starts: Vec<(u32, u64, u64)> = steps
            .iter()
            .map(|s| (s.pid, s.start_mono_ns, s.end_mono_ns))
            .collect();
        assert_eq!(
            starts,
            vec![
                (100, 1_000_000_000, 1_000_000_000),
                (200, 1_001_000_000, 1_001_000_000),
                (100, 1_000_000_000, 1_004_000_000),
                (200, 1_001_000_000, 1_006_000_000),
                (100, 1_004_000_000, 1_008_000_000),
            ]
        );
    }

    /// Two data-parallel engine cores of server 100 (engine_index 0 and 1) and server 200's
    /// one, their EngineCoreOutputs interleaved as the API servers read them: each step starts
    /// from its own engine's previous step or from a stamp its own schedule() took, its kernels
    /// are its own EngineCore's, and each request's steps are its engine's only.
    #[test]
    fn data_parallel_engines_chain_their_own_steps() {
        use EventKind::{Queued, Scheduled};
        let mut state = IpcState::default();
        for (key, pid) in [((100, 0), 1000), ((100, 1), 1001), ((200, 0), 2000)] {
            state.engine_pids.insert(key, pid);
        }
        let (a, b, c) = (
            "chatcmpl-a-aaaaaaaa",
            "chatcmpl-b-bbbbbbbb",
            "chatcmpl-c-cccccccc",
        );
        // (end, server, engine index, outputs)
        let script: &[(f64, u32, i64, &[ScriptedOutput<'_>])] = &[
            (1.000, 100, 0, &[]),
            (1.001, 100, 1, &[]),
            (1.002, 200, 0, &[]),
            (
                1.004,
                100,
                0,
                &[(a, 1, None, &[(Queued, 0.999), (Scheduled, 1.0035)])],
            ),
            (1.005, 100, 1, &[(b, 1, None, &[(Scheduled, 1.0045)])]),
            (1.006, 100, 0, &[(a, 1, None, &[])]),
            (1.007, 100, 1, &[(b, 1, None, &[])]),
            (1.0075, 200, 0, &[]),
            (1.008, 100, 0, &[(a, 1, Some("length"), &[])]),
            // c was admitted in engine 1's schedule() at 1.0075: after engine 1's previous
            // step (1.007), before engine 0's (1.008), which is not its engine's.
            (
                1.009,
                100,
                1,
                &[
                    (b, 1, Some("stop"), &[]),
                    (c, 1, None, &[(Scheduled, 1.0075)]),
                ],
            ),
        ];
        let mut steps = Vec::new();
        for &(ts, server, engine, outs) in script {
            state.apply(
                step_on(ts, engine, outs),
                (server, server, server),
                &mut steps,
            );
        }
        let t = |s: f64| mono_seconds_to_ns(s).unwrap();
        /// pid, start, end, start_from, kernel_pid
        type Step<'a> = (u32, u64, u64, Option<&'a str>, Option<u32>);
        let got: Vec<Step<'_>> = steps
            .iter()
            .map(|s| {
                (
                    s.pid,
                    s.start_mono_ns,
                    s.end_mono_ns,
                    s.start_from,
                    s.kernel_pid,
                )
            })
            .collect();
        let want: Vec<Step<'_>> = [
            (100, 1.000, 1.000, "unknown", 1000),
            (100, 1.001, 1.001, "unknown", 1001),
            (200, 1.002, 1.002, "unknown", 2000),
            (100, 1.0035, 1.004, "scheduled", 1000),
            (100, 1.0045, 1.005, "scheduled", 1001),
            (100, 1.004, 1.006, "previous_step", 1000),
            (100, 1.005, 1.007, "previous_step", 1001),
            (200, 1.002, 1.0075, "previous_step", 2000),
            (100, 1.006, 1.008, "previous_step", 1000),
            (100, 1.0075, 1.009, "scheduled", 1001),
        ]
        .iter()
        .map(|&(pid, start, end, from, kernel_pid)| {
            (pid, t(start), t(end), Some(from), Some(kernel_pid))
        })
        .collect();
        assert_eq!(got, want);

        let steps_of = |state: &mut IpcState, ext: &str| {
            let mut record = RequestRecord {
                response_id: Some(ext.into()),
                arrival_mono_ns: t(0.9),
                end_mono_ns: t(1.1),
                ..Default::default()
            };
            state.enrich(&mut record);
            record
                .engine_steps
                .iter()
                .map(|s| (s.end_mono_ns, s.phase))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            steps_of(&mut state, "chatcmpl-a"),
            vec![
                (t(1.004), "prefill"),
                (t(1.006), "decode"),
                (t(1.008), "decode")
            ]
        );
        assert_eq!(
            steps_of(&mut state, "chatcmpl-b"),
            vec![
                (t(1.005), "prefill"),
                (t(1.007), "decode"),
                (t(1.009), "decode")
            ]
        );
        assert_eq!(
            steps_of(&mut state, "chatcmpl-c"),
            vec![(t(1.009), "prefill")]
        );
    }

    /// `vllm serve --grpc`: the engine request is the call's own `request_id`, suffixed; an
    /// id that is only the prefix of another's never joins it.
    #[test]
    fn a_grpc_call_joins_by_the_id_its_message_named() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        for (id, external) in [("g-1-abcdefgh", "g-1"), ("g-10-12345678", "g-10")] {
            state.apply(add(id, external, 40), (1, 1, 1), &mut steps);
            state.apply(output(id, EventKind::Queued, 2.0), (1, 1, 1), &mut steps);
            state.apply(output(id, EventKind::Scheduled, 2.5), (1, 1, 1), &mut steps);
        }
        let mut record = RequestRecord {
            path: "/vllm.grpc.engine.VllmEngine/Generate".into(),
            rpc_request_id: Some("g-1".into()),
            arrival_mono_ns: 1_000_000_000,
            first_token_mono_ns: Some(3_000_000_000),
            end_mono_ns: 4_000_000_000,
            ..Default::default()
        };
        state.enrich(&mut record);
        assert_eq!(record.prompt_tokens, Some(40));
        assert_eq!(record.admitted_mono_ns, Some(2_500_000_000));
        assert!(
            state.request("g-1-abcdefgh").is_none(),
            "joined and forgotten"
        );
        assert!(state.request("g-10-12345678").is_some(), "another call's");

        // A call whose engine request the IPC never named is counted, not guessed.
        let mut unnamed = RequestRecord {
            rpc_request_id: Some("g-2".into()),
            ..record.clone()
        };
        unnamed.prompt_tokens = None;
        state.enrich(&mut unnamed);
        assert_eq!(unnamed.prompt_tokens, None);
        assert_eq!(state.stats.get(Counter::VllmRequestsUnjoined), 1);
    }
}
