//! What vLLM's IPC says about each request and each engine step, accumulated from decoded
//! messages and joined to HTTP records by id. The same message can be seen twice (written by
//! one traced process, read by another): events are kept once per (kind, timestamp), outputs
//! once per message timestamp.
use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::messages::{AddRequest, EventKind, IpcMessage, Outputs};
use crate::correlate::{RequestRecord, Stats, StepMember, StepRecord};

/// Requests remembered at once; the oldest is forgotten (counted) beyond this.
const MAX_REQUESTS: usize = 16_384;
/// Events kept per request (a request preempted more often than this is still counted).
const MAX_EVENTS: usize = 64;
/// Output-message timestamps remembered to drop the second sighting of a message.
const SEEN_OUTPUTS: usize = 256;

/// CLOCK_MONOTONIC seconds (vLLM's time.monotonic()) → nanoseconds; None for values no clock
/// reads (negative, NaN, more than ~300 years).
pub fn mono_ns(seconds: f64) -> Option<u64> {
    (seconds.is_finite() && (0.0..1e10).contains(&seconds))
        .then(|| (seconds * 1e9 + 0.5).floor() as u64)
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestState {
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
}

#[derive(Debug, Default)]
pub struct IpcState {
    requests: FxHashMap<String, RequestState>,
    order: VecDeque<String>,
    /// External id (`chatcmpl-…`) → engine ids carrying it.
    by_external: FxHashMap<String, Vec<String>>,
    seen_outputs: VecDeque<u64>,
    /// The previous step's timestamp and whether requests were running then.
    last_step: Option<(u64, bool)>,
    pub stats: Stats,
}

/// `<external>-<8 chars>` → `<external>`, when the id has vLLM's suffix.
fn external_of(request_id: &str) -> Option<&str> {
    let (head, tail) = request_id.rsplit_once('-')?;
    (tail.len() == 8 && !head.is_empty()).then_some(head)
}

impl IpcState {
    #[cfg(test)]
    pub fn request(&self, request_id: &str) -> Option<&RequestState> {
        self.requests.get(request_id)
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    fn entry(&mut self, request_id: &str) -> &mut RequestState {
        if !self.requests.contains_key(request_id) {
            if self.requests.len() >= MAX_REQUESTS {
                // `order` may still hold ids joined since: skip those.
                while let Some(old) = self.order.pop_front() {
                    if self.remove(&old).is_some() {
                        self.stats.bump("vllm_requests_evicted_unjoined");
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

    /// Applies one decoded message; `tgid`/`tid` say where it was seen (for step records).
    pub fn apply(&mut self, message: IpcMessage, tgid: u32, tid: u32, steps: &mut Vec<StepRecord>) {
        match message {
            IpcMessage::Add(add) => self.on_add(add),
            IpcMessage::Abort { request_ids } => {
                for id in request_ids {
                    if let Some(r) = self.requests.get_mut(&id) {
                        r.aborted = true;
                    }
                }
            }
            IpcMessage::Outputs(outputs) => self.on_outputs(outputs, tgid, tid, steps),
            IpcMessage::Ready { .. } | IpcMessage::Other => {}
        }
    }

    fn on_add(&mut self, add: AddRequest) {
        self.stats.bump("vllm_requests_added");
        let external = add.external_req_id.clone();
        let r = self.entry(&add.request_id);
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

    fn on_outputs(&mut self, outputs: Outputs, tgid: u32, tid: u32, steps: &mut Vec<StepRecord>) {
        let ts_ns = outputs.timestamp.and_then(mono_ns);
        if let Some(ts) = ts_ns {
            if self.seen_outputs.contains(&ts) {
                self.stats.bump("vllm_outputs_seen_twice");
                return;
            }
            if self.seen_outputs.len() >= SEEN_OUTPUTS {
                self.seen_outputs.pop_front();
            }
            self.seen_outputs.push_back(ts);
        }
        if outputs.partial {
            self.stats.bump("vllm_outputs_partial");
        }
        let mut members = Vec::with_capacity(outputs.outputs.len());
        for out in outputs.outputs {
            let r = self.entry(&out.request_id);
            let mut bad_time = 0;
            for ev in &out.events {
                let Some(ns) = mono_ns(ev.timestamp) else {
                    bad_time += 1;
                    continue;
                };
                if r.events.contains(&(ev.kind, ns)) {
                    continue;
                }
                if r.events.len() < MAX_EVENTS {
                    r.events.push((ev.kind, ns));
                }
                match ev.kind {
                    EventKind::Queued => r.queued_ns = Some(r.queued_ns.map_or(ns, |q| q.min(ns))),
                    EventKind::Scheduled => {
                        r.scheduled_ns = Some(r.scheduled_ns.map_or(ns, |s| s.min(ns)))
                    }
                    EventKind::Preempted => r.preemptions += 1,
                }
            }
            let first = r.first_output_ns.is_none() && out.new_tokens > 0;
            if out.new_tokens > 0 && ts_ns.is_some() {
                r.first_output_ns = r.first_output_ns.or(ts_ns);
            }
            r.output_tokens += out.new_tokens as u64;
            if out.finish_reason.is_some() {
                r.finish_reason = out.finish_reason;
            }
            members.push(StepMember {
                request_id: out.request_id,
                phase: if first { "prefill" } else { "decode" },
            });
            self.stats.add("vllm_event_bad_timestamp", bad_time);
        }
        let (Some(end), Some(stats)) = (ts_ns, outputs.stats) else {
            return;
        };
        // vLLM steps back to back while requests run: the previous step's end is this one's
        // start. After an idle gap the start is unknown and reported as the end.
        let start = match self.last_step {
            Some((prev, true)) if prev <= end => prev,
            _ => end,
        };
        self.last_step = Some((end, stats.running.unwrap_or(0) > 0));
        steps.push(StepRecord {
            pid: tgid,
            engine: "vllm".into(),
            tid,
            start_mono_ns: start,
            end_mono_ns: end,
            duration_ms: (end - start) as f64 / 1e6,
            batch_tokens: None,
            sequences: members.len() as u64,
            prefilling: members.iter().filter(|m| m.phase == "prefill").count() as u64,
            requests: members,
            kv_cache_usage: stats.kv_cache_usage,
            running_requests: stats.running,
            waiting_requests: stats.waiting,
        });
    }

    /// Fills `record` (an HTTP request that just finished) from the engine request with its id,
    /// and forgets that engine request. Admission is attached only when it lies inside the HTTP
    /// request's lifetime and exactly one engine request matches.
    pub fn enrich(&mut self, record: &mut RequestRecord) {
        let mut keys: Vec<String> = Vec::with_capacity(3);
        if let Some(id) = &record.response_id {
            keys.push(id.clone());
        }
        if let Some(x) = &record.x_request_id {
            keys.push(format!("chatcmpl-{x}"));
            keys.push(format!("cmpl-{x}"));
        }
        let Some(ids) = keys.iter().find_map(|k| self.by_external.get(k)).cloned() else {
            return;
        };
        let inside = |r: &RequestState| {
            let first = r.queued_ns.or(r.scheduled_ns);
            first.is_none_or(|t| t >= record.arrival_mono_ns)
                && r.scheduled_ns.is_none_or(|t| t <= record.end_mono_ns)
        };
        let matching: Vec<&String> = ids
            .iter()
            .filter(|id| self.requests.get(*id).is_some_and(inside))
            .collect();
        let id = match matching.as_slice() {
            [one] => (*one).clone(),
            [] => {
                self.stats.bump("vllm_join_outside_request_time");
                return;
            }
            _ => {
                self.stats.bump("vllm_join_ambiguous");
                return;
            }
        };
        let Some(state) = self.remove(&id) else {
            return;
        };
        self.stats.bump("vllm_requests_joined");
        if record.prompt_tokens.is_none() {
            record.prompt_tokens = state.prompt_tokens;
        }
        let Some(admitted) = state.scheduled_ns else {
            return;
        };
        record.admitted_mono_ns = Some(admitted);
        record.queue_wait_ms = Some(admitted.saturating_sub(record.arrival_mono_ns) as f64 / 1e6);
        record.prefill_ms = record
            .first_token_mono_ns
            .filter(|t| *t >= admitted)
            .map(|t| (t - admitted) as f64 / 1e6);
        record.preemptions = Some(state.preemptions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::vllm::messages::{Event, Output};

    fn output(id: &str, kind: EventKind, ts: f64) -> IpcMessage {
        IpcMessage::Outputs(Outputs {
            timestamp: Some(ts + 0.5),
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
    fn clock_values_outside_any_clock_are_refused() {
        assert_eq!(mono_ns(1.5), Some(1_500_000_000));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e12] {
            assert_eq!(mono_ns(bad), None);
        }
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
                1,
                1,
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
        assert!(state.stats.get("vllm_requests_evicted_unjoined") > 0);
    }

    #[test]
    fn two_engine_requests_with_one_http_id_are_not_guessed_between() {
        let mut state = IpcState::default();
        let mut steps = Vec::new();
        // A client reused its X-Request-Id: two engine requests share the external id.
        state.apply(
            output("chatcmpl-x-aaaaaaaa", EventKind::Scheduled, 10.0),
            1,
            1,
            &mut steps,
        );
        state.apply(
            output("chatcmpl-x-bbbbbbbb", EventKind::Scheduled, 11.0),
            1,
            1,
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
        assert_eq!(state.stats.get("vllm_join_ambiguous"), 1);
        // A request whose lifetime holds only one of them gets that one.
        record.arrival_mono_ns = 10_500_000_000;
        state.enrich(&mut record);
        assert_eq!(record.admitted_mono_ns, Some(11_000_000_000));
    }
}
