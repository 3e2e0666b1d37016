//! One request's progress from its first byte read to the end of its response.
use inferscope_decode::http::{BodySummary, RequestSummary, SseEvent, Timings, Usage};
use inferscope_model::{Counter, EndedBy, RequestRecord, clock::ns_to_ms, quantile::percentile};

use super::Stats;

/// Inter-token gaps kept per request; a longer stream keeps its first gaps and counts the rest.
pub(super) const MAX_GAPS: usize = 65536;

#[derive(Debug, Default)]
pub(super) struct RequestProgress {
    pub seq: u32,
    /// Requests read just before this one and dropped at the connection's waiting limit: their
    /// answers come before this one's, and are skipped (counted lost).
    pub dropped_before: u32,
    pub reader_tid: u32,
    pub read_ns: u64,
    pub wire_ns: Option<u64>,
    pub summary: Option<RequestSummary>,
    pub request_bytes: u64,
    pub status: Option<u16>,
    pub first_byte_ns: Option<u64>,
    pub first_token_ns: Option<u64>,
    pub last_token_ns: Option<u64>,
    pub output_chunks: u64,
    pub gaps_ns: Vec<u64>,
    pub gaps_dropped: u64,
    pub response_id: Option<String>,
    pub usage: Option<Usage>,
    pub timings: Option<Timings>,
    /// The response body's `kv_transfer_params` (a prefill server's hand-off).
    pub response_handoff: Option<inferscope_model::HandoffParams>,
    pub response_bytes: u64,
    pub truncated: bool,
    /// The engine's task id, from its scheduler hook on the thread that read the request.
    pub task_id: Option<i64>,
    /// When the engine's scheduler admitted the task (gave it a slot).
    pub admitted_ns: Option<u64>,
    pub prefill_steps: u64,
    pub decode_steps: u64,
    /// The engine's own first-token event, more exact than the first token written to the
    /// socket.
    pub engine_first_token_ns: Option<u64>,
    pub preemptions: u64,
    /// When the engine parked the task for want of a free slot.
    pub deferred_ns: Option<u64>,
    /// When a freed slot took the parked task back into the engine's queue.
    pub requeued_ns: Option<u64>,
    /// The engine slot (sequence) that served the request.
    pub slot: Option<u32>,
    /// When the engine produced the request's final result.
    pub engine_finished_ns: Option<u64>,
    /// When the request's slot became free again.
    pub slot_released_ns: Option<u64>,
    /// Its bytes did not parse as HTTP; it is reported only if the server answers.
    pub unparsed: bool,
    /// Why the agent could not follow the request to its end, if it could not.
    pub incomplete: Option<super::loss::Reason>,
    /// The last response write seen for it.
    pub last_write_ns: u64,
}

impl RequestProgress {
    pub(super) fn new(seq: u32, reader_tid: u32, read_ns: u64, wire_ns: Option<u64>) -> Self {
        Self {
            seq,
            reader_tid,
            read_ns,
            wire_ns,
            ..Default::default()
        }
    }

    pub(super) fn response_started(&self) -> bool {
        self.first_byte_ns.is_some()
    }

    /// The last moment the request was seen to progress: where an incomplete record ends.
    pub(super) fn last_io_ns(&self) -> u64 {
        self.last_write_ns
            .max(self.last_token_ns.unwrap_or(0))
            .max(self.summary.as_ref().map_or(0, |s| s.ts_ns))
            .max(self.read_ns)
    }

    pub(super) fn on_content(&mut self, ts_ns: u64) {
        if let Some(last) = self.last_token_ns {
            if self.gaps_ns.len() < MAX_GAPS {
                self.gaps_ns.push(ts_ns.saturating_sub(last));
            } else {
                self.gaps_dropped += 1;
            }
        } else {
            self.first_token_ns = Some(ts_ns);
        }
        self.last_token_ns = Some(ts_ns);
        self.output_chunks += 1;
    }

    pub(super) fn on_sse(&mut self, event: &SseEvent) {
        // An event whose bytes the capture cut (behind a filling ring buffer) counts as output:
        // servers send their first event (role, often with text) when the first token is out,
        // and nearly all later ones carry tokens, so TTFT and the token gaps stay measured
        // (the record says `capture_truncated`) instead of vanishing with the text.
        if event.content || event.lost {
            self.on_content(event.ts_ns);
        }
        if self.response_id.is_none() {
            self.response_id.clone_from(&event.id);
        }
        if event.usage.is_some() {
            self.usage.clone_from(&event.usage);
        }
        if event.timings.is_some() {
            self.timings.clone_from(&event.timings);
        }
    }

    /// The agent's id for this request: `<pid>-<connection>-<sequence on the connection>`.
    pub(super) fn request_id(&self, base: RecordContext<'_>) -> String {
        format!("{}-{}-{}", base.pid, base.connection_id, self.seq)
    }

    /// A non-streaming response body: ids and counts, no content.
    pub(super) fn on_body(&mut self, body: BodySummary, stats: &mut Stats) {
        if body.json_error {
            stats.bump(Counter::ResponseBodyJsonError);
        }
        if self.response_id.is_none() {
            self.response_id = body.id;
        }
        self.usage = body.usage.or(self.usage.take());
        self.timings = body.timings.or(self.timings.take());
        self.response_handoff = body.kv_transfer_params.or(self.response_handoff.take());
    }

    pub(super) fn arrival_ns(&self) -> u64 {
        self.wire_ns.map_or(self.read_ns, |w| w.min(self.read_ns))
    }

    pub(super) fn into_record(
        mut self,
        base: RecordContext<'_>,
        end_ns: u64,
        ended_by: EndedBy,
    ) -> RequestRecord {
        let arrival = self.arrival_ns();
        let ms = |from: u64, to: u64| ns_to_ms(to.saturating_sub(from));
        let mut summary = self.summary.take().unwrap_or_default();
        let hints = inferscope_model::DisaggHints {
            request: summary.kv_transfer_params.take().map(|p| *p),
            response: self.response_handoff.take(),
        };
        let completion_tokens = self.usage.as_ref().and_then(|u| u.completion_tokens);
        let prompt_tokens = self.usage.as_ref().and_then(|u| u.prompt_tokens);
        let cached_tokens = self.usage.as_ref().and_then(|u| u.cached_tokens);
        let tpot_ms = self.tpot_ms(completion_tokens);
        let prefill_ms = self.prefill_ms();
        let mut gaps: Vec<f64> = self.gaps_ns.iter().map(|&g| ns_to_ms(g)).collect();
        gaps.sort_unstable_by(f64::total_cmp);
        // Left at their defaults: what the join adds later (the engine's IPC stamps and steps,
        // the engine metrics at arrival, the process's identity, the P/D stitch) and what only
        // HTTP/2 and gRPC records carry.
        RequestRecord {
            request_id: self.request_id(base),
            response_id: self.response_id,
            x_request_id: summary.x_request_id,
            traceparent: summary.traceparent,
            pid: base.pid,
            engine: base.engine.to_string(),
            method: summary.method,
            path: summary.path,
            status: self.status,
            model: summary.model,
            stream: summary.stream,
            max_tokens: summary.max_tokens,
            prompt_bytes: summary.prompt_bytes,
            arrival_mono_ns: arrival,
            arrival_unix_ns: base.unix_offset_ns.saturating_add_signed(arrival as i64),
            arrival_read_mono_ns: self.read_ns,
            arrival_wire_mono_ns: self.wire_ns,
            read_delay_ms: self.wire_ns.map(|w| ms(w, self.read_ns)),
            request_complete_mono_ns: (summary.ts_ns != 0).then_some(summary.ts_ns),
            first_byte_mono_ns: self.first_byte_ns,
            first_token_mono_ns: self.first_token_ns,
            last_token_mono_ns: self.last_token_ns,
            end_mono_ns: end_ns,
            ttft_ms: self.first_token_ns.map(|t| ms(arrival, t)),
            engine_task_id: self.task_id,
            admitted_mono_ns: self.admitted_ns,
            queue_wait_ms: self.admitted_ns.map(|a| ms(arrival, a)),
            prefill_ms,
            first_token_handoff_ms: match (
                self.admitted_ns,
                self.engine_first_token_ns,
                self.first_token_ns,
            ) {
                (Some(_), Some(engine), Some(wire)) => Some(ms(engine, wire)),
                _ => None,
            },
            engine_slot: self.slot,
            deferred_mono_ns: self.deferred_ns,
            requeued_mono_ns: self.requeued_ns,
            engine_first_token_mono_ns: self.engine_first_token_ns,
            engine_finished_mono_ns: self.engine_finished_ns,
            slot_released_mono_ns: self.slot_released_ns,
            prefill_steps: self.admitted_ns.map(|_| self.prefill_steps),
            decode_steps: self.admitted_ns.map(|_| self.decode_steps),
            // Counted from preempt probes; llama.cpp never preempts.
            preemptions: self.admitted_ns.map(|_| self.preemptions),
            tpot_ms,
            itl_p50_ms: percentile(&gaps, 0.5),
            itl_p99_ms: percentile(&gaps, 0.99),
            itl_max_ms: gaps.last().copied(),
            e2e_ms: ms(arrival, end_ns),
            output_chunks: self.output_chunks,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            engine_prompt_ms: self.timings.as_ref().and_then(|t| t.prompt_ms),
            engine_predicted_ms: self.timings.as_ref().and_then(|t| t.predicted_ms),
            request_bytes: self.request_bytes,
            response_bytes: self.response_bytes,
            aborted: ended_by == EndedBy::Client,
            ended_by,
            connection_preexisting: base.preexisting,
            tls: base.tls,
            request_unparsed: self.unparsed,
            incomplete: self.incomplete.map(|r| r.as_str().to_owned()),
            capture_truncated: self.truncated
                || summary.body_truncated
                || self.gaps_dropped > 0
                || (base.last_loss_ns != 0 && base.last_loss_ns >= arrival),
            connection_id: base.connection_id,
            seq_on_connection: self.seq,
            reader_tid: self.reader_tid,
            disagg_hints: (!hints.is_empty()).then(|| Box::new(hints)),
            ..RequestRecord::default()
        }
    }

    /// Time per output token, over tokens where the engine reports them (one SSE event may
    /// carry several), else over events.
    fn tpot_ms(&self, completion_tokens: Option<u64>) -> Option<f64> {
        let tokens = completion_tokens.unwrap_or(self.output_chunks);
        match (self.first_token_ns, self.last_token_ns) {
            (Some(first), Some(last)) if tokens > 1 => {
                Some(ns_to_ms(last.saturating_sub(first)) / (tokens - 1) as f64)
            }
            _ => None,
        }
    }

    /// Admission to the first token (the engine's, else the wire's); not streamed, no token is
    /// seen leaving, but the engine's own prefill time is.
    fn prefill_ms(&self) -> Option<f64> {
        match (
            self.admitted_ns,
            self.engine_first_token_ns.or(self.first_token_ns),
        ) {
            (Some(a), Some(t)) => Some(ns_to_ms(t.saturating_sub(a))),
            (Some(_), None) => self.timings.as_ref().and_then(|t| t.prompt_ms),
            _ => None,
        }
    }
}

/// What a record needs from its connection and the agent.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecordContext<'a> {
    pub pid: u32,
    pub engine: &'a str,
    pub connection_id: u64,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC, in ns.
    pub unix_offset_ns: u64,
    /// When capture last lost records (ring buffer full), 0 if never: a request alive then may
    /// miss events.
    pub last_loss_ns: u64,
    /// The connection predates the agent.
    pub preexisting: bool,
    /// The connection is TLS (plaintext from the TLS library probes).
    pub tls: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_latencies_from_token_times() {
        let mut p = RequestProgress::new(0, 11, 1_000_000, Some(900_000));
        p.first_byte_ns = Some(2_000_000);
        for t in [10_000_000u64, 12_000_000, 14_000_000, 20_000_000] {
            p.on_content(t);
        }
        let ctx = RecordContext {
            pid: 1,
            engine: "llamacpp",
            connection_id: 3,
            unix_offset_ns: 1_000,
            last_loss_ns: 0,
            preexisting: false,
            tls: false,
        };
        let r = p.into_record(ctx, 21_000_000, EndedBy::Complete);
        assert_eq!(r.arrival_mono_ns, 900_000);
        assert_eq!(r.ttft_ms, Some(9.1));
        assert_eq!(r.tpot_ms, Some(10.0 / 3.0));
        assert_eq!(r.itl_p50_ms, Some(2.0));
        assert_eq!(r.itl_max_ms, Some(6.0));
        assert_eq!(r.output_chunks, 4);
        assert_eq!(r.e2e_ms, 20.1);
        assert_eq!(r.request_id, "1-3-0");
        assert_eq!(r.read_delay_ms, Some(0.1));
        assert!(!r.capture_truncated);
    }

    #[test]
    fn a_non_streaming_request_takes_prefill_from_the_engines_timings() {
        let mut p = RequestProgress::new(0, 11, 1_000_000, None);
        p.admitted_ns = Some(3_000_000);
        p.timings = Some(Timings {
            prompt_ms: Some(4.5),
            ..Timings::default()
        });
        let ctx = RecordContext {
            pid: 1,
            engine: "llamacpp",
            connection_id: 3,
            unix_offset_ns: 0,
            last_loss_ns: 0,
            preexisting: false,
            tls: false,
        };
        let r = p.into_record(ctx, 9_000_000, EndedBy::Complete);
        assert_eq!((r.queue_wait_ms, r.prefill_ms), (Some(2.0), Some(4.5)));
        assert_eq!(r.ttft_ms, None);
    }

    #[test]
    fn a_capture_loss_during_the_request_marks_it_truncated() {
        let ctx = |last_loss_ns| RecordContext {
            pid: 1,
            engine: "llamacpp",
            connection_id: 3,
            unix_offset_ns: 0,
            last_loss_ns,
            preexisting: false,
            tls: false,
        };
        let p = || RequestProgress::new(0, 11, 1_000, None);
        assert!(
            p().into_record(ctx(2_000), 3_000, EndedBy::Client)
                .capture_truncated
        );
        assert!(
            !p().into_record(ctx(500), 3_000, EndedBy::Client)
                .capture_truncated
        );
    }
}
