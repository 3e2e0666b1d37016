//! What SGLang's IPC says about each request, accumulated from decoded messages and joined to
//! HTTP records by rid. One message is usually seen twice (written by one traced process, read
//! by another) and SGLang's counts are cumulative, so every update is idempotent: counts keep
//! their maximum, times their first value.
use std::collections::VecDeque;

use inferscope_model::{
    Counter, RequestRecord, Stats, StepMember, StepRecord, StepRef,
    clock::{mono_seconds_to_ns, ns_to_ms},
};
use rustc_hash::FxHashMap;

use super::messages::{AddRequest, IpcMessage, Output};

/// Requests remembered at once; the oldest is forgotten (counted) beyond this.
const MAX_REQUESTS: usize = 16_384;

/// What one outputs message's requests tell of its step, beside their membership.
#[derive(Default)]
struct Batch {
    /// Requests whose prefill ended in it, and the span of their admissions to prefill ends.
    prefilling: Vec<String>,
    start: u64,
    end: u64,
    prefilled: u64,
    /// Tokens the step computed (None once one member's share is unknown).
    tokens: Option<u64>,
    /// Stamps that were no time.
    bad_time: u64,
}
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct RequestState {
    pub prompt_tokens: Option<u64>,
    /// When the scheduler queued it (wait_queue_entry_time).
    pub queued_ns: Option<u64>,
    /// When the scheduler first put it in a batch to run (forward_entry_time): admission.
    pub admitted_ns: Option<u64>,
    pub prefill_finished_ns: Option<u64>,
    pub retractions: u64,
    /// Its retraction count as of its last output that brought tokens: a count above it on an
    /// output with one more token is a re-prefill (with overlap scheduling SGLang first sends
    /// the retracted request once with no new token).
    pub retractions_at_token: u64,
    pub output_tokens: u64,
    pub cached_tokens: Option<u64>,
    pub finish_reason: Option<&'static str>,
    pub aborted: bool,
    /// Outputs seen (a request with none never ran).
    pub outputs: u64,
    /// The timed step of its first prefill (the only SGLang step whose bounds are known).
    pub prefill_step: Option<StepRef>,
    /// Joined to its HTTP record already. Kept, so that outputs after it (its client left
    /// before the end; SGLang runs it one more step to abort it) are a running request's, not
    /// a new one's first prefill; a new request with its rid starts afresh.
    pub joined: bool,
}

/// Output batches remembered, to know a batch's other sightings (one batch is written by the
/// scheduler, read by the detokenizer, forwarded as BatchStrOutput and read again).
const RECENT_BATCHES: usize = 256;

/// Where and how a decoded message was seen.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Sighting {
    pub tgid: u32,
    pub tid: u32,
    /// The scheduler process that ran the step's kernels, where known.
    pub kernel_pid: Option<u32>,
    /// The capture time of the syscall that completed the message (its entry); None where
    /// the bytes came without one.
    pub at: Option<u64>,
    /// The outputs are of the class only the scheduler sends (BatchTokenIDOutput), not the
    /// detokenizer's forward (BatchStrOutput, which multi-tokenizer mode splits per worker).
    pub scheduler_class: bool,
}

/// A batch's step, worked out at its first sighting, waiting for a sighting with a capture
/// time to give its end.
#[derive(Debug, Clone)]
struct PendingStep {
    members: Vec<StepMember>,
    prefilling: u64,
    tokens: Option<u64>,
}

#[derive(Debug, Default)]
pub(super) struct IpcState {
    requests: FxHashMap<String, RequestState>,
    order: VecDeque<String>,
    /// Recent batches by fingerprint: their step while it waits for a capture time, None
    /// once it is out.
    batches: FxHashMap<u64, Option<PendingStep>>,
    batch_order: VecDeque<u64>,
    /// The scheduler's own outputs (BatchTokenIDOutput) have been seen: from then on the
    /// detokenizer's forwards of them make no steps.
    scheduler_outputs_seen: bool,
    pub stats: Stats,
}

/// What a batch looks like on every sighting: per request its rid and cumulative counts
/// (times are left out: the detokenizer re-bases them by its own clock offset).
fn fingerprint(outputs: &[Output]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    for o in outputs {
        (
            &o.rid,
            o.completion_tokens,
            o.retractions,
            o.finish_reason,
            o.prefill_finished.is_some(),
        )
            .hash(&mut h);
    }
    h.finish()
}

impl IpcState {
    #[cfg(test)]
    pub(super) fn request(&self, rid: &str) -> Option<&RequestState> {
        self.requests.get(rid)
    }

    fn entry(&mut self, rid: &str) -> &mut RequestState {
        if !self.requests.contains_key(rid) {
            if self.requests.len() >= MAX_REQUESTS {
                while let Some(old) = self.order.pop_front() {
                    if let Some(gone) = self.requests.remove(&old) {
                        if !gone.joined {
                            self.stats.bump(Counter::SglangRequestsEvictedUnjoined);
                        }
                        break;
                    }
                }
            }
            if self.order.len() >= 2 * MAX_REQUESTS {
                let requests = &self.requests;
                self.order.retain(|id| requests.contains_key(id));
            }
            self.order.push_back(rid.to_owned());
        }
        self.requests.entry(rid.to_owned()).or_default()
    }

    /// Applies one decoded message.
    pub(super) fn apply(
        &mut self,
        message: IpcMessage,
        seen: Sighting,
        steps: &mut Vec<StepRecord>,
    ) {
        match message {
            IpcMessage::Add(adds) => adds.into_iter().for_each(|a| self.on_add(a)),
            IpcMessage::Abort { rid: Some(rid), .. } => {
                if let Some(r) = self.requests.get_mut(&rid) {
                    r.aborted = true;
                }
            }
            IpcMessage::Abort { rid: None, .. } | IpcMessage::Other => {}
            IpcMessage::Outputs { outputs, .. } => self.on_outputs(outputs, seen, steps),
        }
    }

    fn on_add(&mut self, add: AddRequest) {
        self.stats.bump(Counter::SglangRequestsAdded);
        let r = self.entry(&add.rid);
        if r.joined {
            // Its rid reused by a new request.
            *r = RequestState::default();
        }
        r.prompt_tokens = add.prompt_tokens.or(r.prompt_tokens);
    }

    /// One batched output is one scheduler step, listing the requests that sent output in it
    /// (SGLang leaves out a request whose prefill chunk did not finish and, between its
    /// reports, one not streamed). A step in which requests finished their first prefill is
    /// timed by SGLang's own clocks: from their forward entry to their prefill end. Any other
    /// step ends at the capture stamp of the batch's first sighting: the scheduler's send
    /// where the scheduler is traced (it comes first), else the first traced read of it (the
    /// TokenizerManager's, with `--port`), later by the IPC hops. SGLang gives no start for it
    /// (`start_from` "unknown", the start is the end).
    fn on_outputs(&mut self, outputs: Vec<Output>, seen: Sighting, steps: &mut Vec<StepRecord>) {
        self.stats.bump(Counter::SglangOutputs);
        if outputs.is_empty() {
            // An idle batch's (data-parallel attention): no request, no step.
            return;
        }
        let key = fingerprint(&outputs);
        let first_sighting = !self.batches.contains_key(&key);
        self.scheduler_outputs_seen |= seen.scheduler_class;
        // Where the scheduler's outputs are seen, the detokenizer's forwards only repeat them
        // (or, split per tokenizer worker, parts of them).
        let may_step = seen.scheduler_class || !self.scheduler_outputs_seen;
        let mut batch = Batch {
            start: u64::MAX,
            tokens: Some(0),
            ..Batch::default()
        };
        let mut members = Vec::with_capacity(outputs.len());
        for out in outputs {
            if let Some(member) = self.on_output(out, first_sighting, &mut batch) {
                members.push(member);
            }
        }
        let Batch {
            prefilling,
            start,
            end,
            prefilled,
            tokens,
            bad_time,
        } = batch;
        self.stats.add(Counter::SglangBadTimestamp, bad_time);
        let pending = if first_sighting {
            let step = PendingStep {
                prefilling: members.iter().filter(|m| m.phase == "prefill").count() as u64,
                members,
                tokens,
            };
            if prefilled > 0 && start <= end {
                self.push_timed(&prefilling, (start, end), step, seen, steps);
                None
            } else if !may_step {
                None
            } else {
                match seen.at {
                    Some(at) => {
                        self.push_untimed(step, at, seen, steps);
                        None
                    }
                    None => Some(step),
                }
            }
        } else {
            if !may_step {
                return;
            }
            let Some(Some(step)) = self.batches.get_mut(&key).map(Option::take) else {
                return;
            };
            match seen.at {
                Some(at) => {
                    self.push_untimed(step, at, seen, steps);
                    None
                }
                None => Some(step),
            }
        };
        self.remember(key, pending);
    }

    /// One request's output in a batch: its times, tokens, retractions and finish; with the
    /// batch's first sighting, its membership of the step and its share of the step's tokens.
    fn on_output(
        &mut self,
        out: Output,
        first_sighting: bool,
        batch: &mut Batch,
    ) -> Option<StepMember> {
        let r = self.entry(&out.rid);
        let (had_output, before_tokens, before_retractions) =
            (r.outputs > 0, r.output_tokens, r.retractions_at_token);
        r.outputs += 1;
        let mut first = |slot: &mut Option<u64>, t: Option<f64>| match t.map(mono_seconds_to_ns) {
            Some(Some(ns)) => {
                let new = slot.is_none();
                *slot = Some(slot.map_or(ns, |s| s.min(ns)));
                new
            }
            Some(None) => {
                batch.bad_time += 1;
                false
            }
            None => false,
        };
        first(&mut r.queued_ns, out.wait_queue_entry);
        first(&mut r.admitted_ns, out.forward_entry);
        let new_prefill = first(&mut r.prefill_finished_ns, out.prefill_finished);
        r.prompt_tokens = r.prompt_tokens.or(out.prompt_tokens);
        r.output_tokens = r.output_tokens.max(out.completion_tokens.unwrap_or(0));
        r.retractions = r.retractions.max(out.retractions.unwrap_or(0));
        if out.cached_tokens.is_some() {
            r.cached_tokens = r.cached_tokens.max(out.cached_tokens);
        }
        if out.finish_reason.is_some() {
            r.finish_reason = out.finish_reason;
            r.aborted |= out.finish_reason == Some("abort");
        }
        if new_prefill && let (Some(a), Some(p)) = (r.admitted_ns, r.prefill_finished_ns) {
            batch.prefilled += 1;
            batch.start = batch.start.min(a);
            batch.end = batch.end.max(p);
            batch.prefilling.push(out.rid.clone());
        }
        if !first_sighting {
            return None;
        }
        // Its share of the batch, from the counts it reported before this output.
        let completion = out.completion_tokens;
        let gained = completion
            .filter(|_| had_output)
            .map(|c| c.saturating_sub(before_tokens));
        // Its first token: a first prefill (with SGLang's times, when they first show a
        // prefill end; without, its first output holding one token).
        let first_prefill =
            new_prefill || (out.prefill_finished.is_none() && !had_output && completion == Some(1));
        // Retracted since its last tokens and one token more: the step re-prefilled it.
        let reprefill = !first_prefill
            && had_output
            && out.retractions.unwrap_or(0) > before_retractions
            && gained == Some(1);
        if !had_output || gained.is_some_and(|g| g > 0) {
            r.retractions_at_token = out.retractions.unwrap_or(0).max(before_retractions);
        }
        let share = if first_prefill {
            // The prompt its prefill computed (all its chunks): what the cache did not hold.
            let prompt = out.prompt_tokens.or(r.prompt_tokens);
            prompt
                .zip(out.cached_tokens)
                .map(|(p, c)| p.saturating_sub(c))
        } else if reprefill {
            // What it recomputed depends on the cache after its retraction: unknown.
            None
        } else {
            gained
        };
        batch.tokens = batch.tokens.zip(share).map(|(t, s)| t.saturating_add(s));
        Some(StepMember {
            request_id: out.rid,
            phase: if first_prefill || reprefill {
                "prefill"
            } else {
                "decode"
            },
        })
    }

    /// Keeps `key`'s batch (and its step while it waits for a capture time), forgetting the
    /// oldest beyond [`RECENT_BATCHES`]: a step never given one is counted.
    fn remember(&mut self, key: u64, pending: Option<PendingStep>) {
        if self.batches.insert(key, pending).is_some() {
            return;
        }
        self.batch_order.push_back(key);
        while self.batch_order.len() > RECENT_BATCHES {
            if let Some(old) = self.batch_order.pop_front()
                && let Some(Some(_)) = self.batches.remove(&old)
            {
                self.stats.bump(Counter::SglangStepsUnstamped);
            }
        }
    }

    /// A step in which requests finished their first prefill, bounded by their times.
    fn push_timed(
        &mut self,
        prefilling: &[String],
        (start, end): (u64, u64),
        step: PendingStep,
        seen: Sighting,
        steps: &mut Vec<StepRecord>,
    ) {
        self.stats.bump(Counter::SglangSteps);
        let at = StepRef {
            pid: seen.tgid,
            end_mono_ns: end,
            phase: "prefill",
        };
        for rid in prefilling {
            if let Some(r) = self.requests.get_mut(rid) {
                r.prefill_step = Some(at);
            }
        }
        steps.push(step_record(step, seen, start, end, "forward_entry"));
    }

    /// A step SGLang's outputs do not time: it ends at `at` (see [`Self::on_outputs`]), its
    /// start is unknown (reported as the end, as vLLM's after an idle gap).
    fn push_untimed(
        &mut self,
        step: PendingStep,
        at: u64,
        seen: Sighting,
        steps: &mut Vec<StepRecord>,
    ) {
        self.stats.bump(Counter::SglangSteps);
        self.stats.bump(Counter::SglangStepsUntimed);
        steps.push(step_record(step, seen, at, at, "unknown"));
    }

    /// Fills `record` (an HTTP request that just finished) from the SGLang request that served
    /// it: SGLang's response id is the rid (from the body's `rid`, else a uuid it made; a gRPC
    /// call's rid is the request id its message named), and the request must have been
    /// admitted inside the HTTP request's lifetime.
    pub(super) fn enrich(&mut self, record: &mut RequestRecord) {
        let served = record.first_token_mono_ns.is_some();
        let inside = |r: &RequestState| {
            r.queued_ns.is_none_or(|t| t >= record.arrival_mono_ns)
                && r.admitted_ns.is_none_or(|t| t <= record.end_mono_ns)
        };
        let rid = [
            record.response_id.as_deref(),
            record.x_request_id.as_deref(),
            record.rpc_request_id.as_deref(),
        ]
        .into_iter()
        .flatten()
        .find(|id| {
            self.requests
                .get(*id)
                .is_some_and(|r| !r.joined && inside(r))
        })
        .map(str::to_owned);
        let joined = rid.and_then(|rid| self.requests.get_mut(&rid)).map(|r| {
            r.joined = true;
            r.clone()
        });
        // A gRPC call of a method that names no engine request (a health check, model
        // info) is not an inference the scheduler could have joined.
        let names_a_request = record.http2.is_none() || record.rpc_request_id.is_some();
        let Some(state) = joined else {
            if served && names_a_request {
                self.stats.bump(Counter::SglangRequestsUnjoined);
                record.engine_unknown = vec!["admitted_mono_ns", "prompt_tokens", "preemptions"];
            }
            return;
        };
        self.stats.bump(Counter::SglangRequestsJoined);
        join_steps(record, &state);
        if record.prompt_tokens.is_none() {
            record.prompt_tokens = state.prompt_tokens;
            if state.prompt_tokens.is_none() {
                record.engine_unknown.push("prompt_tokens");
            }
        }
        if record.completion_tokens.is_none() && state.outputs > 0 {
            record.completion_tokens = Some(state.output_tokens);
        }
        record.cached_tokens = state.cached_tokens.or(record.cached_tokens);
        let aborted = record.aborted || state.aborted;
        // SGLang ships the retraction count with each output: an aborted request may have
        // been retracted after its last one.
        record.preemptions = if aborted {
            self.stats.bump(Counter::SglangPreemptionsUnknownAborted);
            record.engine_unknown.push("preemptions");
            None
        } else {
            Some(state.retractions)
        };
        let Some(admitted) = state.admitted_ns else {
            if served {
                // Times ship only with --enable-metrics.
                self.stats.bump(Counter::SglangAdmissionUnknown);
                record.engine_unknown.push("admitted_mono_ns");
            }
            return;
        };
        record.set_admitted(admitted);
    }
}

/// Lists on `record` the one SGLang step whose bounds are known that it took part in: its first
/// prefill (from its forward entry to its prefill end, which spans every chunk of a chunked
/// prefill). Its other steps are step records too, naming it by rid, but end at the
/// scheduler's send with no start, so no kernels join them; and a request gets no output for
/// a prefill chunk nor, when it is not streamed, for a decode step: its step counts are
/// unknown.
fn join_steps(record: &mut RequestRecord, state: &RequestState) {
    if state.outputs == 0 {
        return;
    }
    record.engine_unknown.push("prefill_steps");
    record.engine_unknown.push("decode_steps");
    record.engine_steps = state.prefill_step.into_iter().collect();
}

/// The step record of a batch SGLang ran from `start` to `end` (`start_from`: where the start
/// came from). SGLang's outputs carry no KV use or queue lengths per batch.
fn step_record(
    step: PendingStep,
    seen: Sighting,
    start: u64,
    end: u64,
    start_from: &'static str,
) -> StepRecord {
    StepRecord {
        pid: seen.tgid,
        engine: "sglang".into(),
        tid: seen.tid,
        start_mono_ns: start,
        end_mono_ns: end,
        duration_ms: ns_to_ms(end.saturating_sub(start)),
        batch_tokens: step.tokens,
        sequences: step.members.len() as u64,
        prefilling: step.prefilling,
        requests: step.members,
        start_from: Some(start_from),
        kernel_pid: seen.kernel_pid.filter(|&p| p != seen.tgid),
        ..StepRecord::default()
    }
}
