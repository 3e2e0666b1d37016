//! The agent's own counters: every event a stage drops, truncates, fails to parse or just counts,
//! as one enum, so a counter is named once (here) and every increment is checked by the compiler.
//! Each stage keeps a [`Stats`] of them; the pipeline merges all stages' counters with the kernel's
//! and the exporters' into the one list the agent exports (Prometheus
//! `inferscope_agent_events_total{counter=…}`, OTLP metrics, `--counters-file`, its closing log).

macro_rules! counters {
    ($($variant:ident => $name:literal,)*) => {
        /// One of the agent's counters; [`Counter::name`] is its exported name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Counter {
            $($variant,)*
        }

        impl Counter {
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)*];

            /// The exported name (snake_case, stable: dashboards and alerts use it).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)*
                }
            }
        }
    };
}

counters! {
    // Capture: kernel records, chunked syscalls, scraping, user probes.
    CaptureChunkedSyscalls => "capture_chunked_syscalls",
    CaptureChunksLost => "capture_chunks_lost",
    CaptureChunksOrphaned => "capture_chunks_orphaned",
    MetricsScrapeErrorsNoEngineMetrics => "metrics_scrape_errors_no_engine_metrics",
    MetricsScrapes => "metrics_scrapes",
    MetricsScrapeErrorsConnect => "metrics_scrape_errors_connect",
    MetricsScrapeErrorsTimeout => "metrics_scrape_errors_timeout",
    MetricsScrapeErrorsIo => "metrics_scrape_errors_io",
    MetricsScrapeErrorsHttpStatus => "metrics_scrape_errors_http_status",
    MetricsScrapeErrorsBadResponse => "metrics_scrape_errors_bad_response",
    MetricsScrapeErrorsTooLarge => "metrics_scrape_errors_too_large",
    MetricsCommandsDropped => "metrics_commands_dropped",
    MetricsScrapesDroppedQueueFull => "metrics_scrapes_dropped_queue_full",
    MetricsTargetsOverLimit => "metrics_targets_over_limit",
    RecordBadLength => "record_bad_length",
    RecordShort => "record_short",
    RecordUnknownKind => "record_unknown_kind",
    RecordUnknownType => "record_unknown_type",
    UserProbeReadFailed => "user_probe_read_failed",
    UserProbeUnknownIndex => "user_probe_unknown_index",
    UserProbesAttachedLate => "user_probes_attached_late",
    UserProbesDisabled => "user_probes_disabled",
    UserProbesNotAttached => "user_probes_not_attached",
    // Decode: HTTP, ZMTP and pickle framing and parse failures.
    BadChunkSize => "bad_chunk_size",
    BodyTooLarge => "body_too_large",
    FramingLost => "framing_lost",
    HeadLost => "head_lost",
    HeadTooLarge => "head_too_large",
    NotHttp => "not_http",
    SseEventTooLarge => "sse_event_too_large",
    PickleMemoError => "pickle_memo_error",
    PickleOverBudget => "pickle_over_budget",
    PickleStackError => "pickle_stack_error",
    PickleTooLong => "pickle_too_long",
    PickleTruncated => "pickle_truncated",
    PickleTypeError => "pickle_type_error",
    PickleUnsupportedOpcode => "pickle_unsupported_opcode",
    ZmtpDesync => "zmtp_desync",
    ZmtpNotZmtp => "zmtp_not_zmtp",
    ZmtpOldVersion => "zmtp_old_version",
    // Engines: what each engine plugin's IPC decoder and scheduler join saw or lost.
    SglangVersionFromPackage => "sglang_version_from_package",
    SglangVersionUnsupported => "sglang_version_unsupported",
    VllmVersionFromPackage => "vllm_version_from_package",
    VllmVersionUnsupported => "vllm_version_unsupported",
    SglangIpcLayoutMismatch => "sglang_ipc_layout_mismatch",
    SglangIpcNotPickle => "sglang_ipc_not_pickle",
    SglangIpcFrameCut => "sglang_ipc_frame_cut",
    SglangIpcLayoutAssumed => "sglang_ipc_layout_assumed",
    SglangIpcMessages => "sglang_ipc_messages",
    SglangIpcSocketTableFull => "sglang_ipc_socket_table_full",
    SglangIpcUnsupportedVersion => "sglang_ipc_unsupported_version",
    SglangVersionPackageNotFound => "sglang_version_package_not_found",
    ZmtpFramesDropped => "zmtp_frames_dropped",
    ZmtpFramesIncomplete => "zmtp_frames_incomplete",
    ZmtpHuntSkipped => "zmtp_hunt_skipped",
    PickleTooDeep => "pickle_too_deep",
    PickleUnknownOpcode => "pickle_unknown_opcode",
    SglangSchedulerAmbiguous => "sglang_scheduler_ambiguous",
    SglangSchedulerFound => "sglang_scheduler_found",
    SglangSchedulerNotFound => "sglang_scheduler_not_found",
    SglangAdmissionUnknown => "sglang_admission_unknown",
    SglangBadTimestamp => "sglang_bad_timestamp",
    SglangOutputs => "sglang_outputs",
    SglangPreemptionsUnknownAborted => "sglang_preemptions_unknown_aborted",
    SglangRequestsAdded => "sglang_requests_added",
    SglangRequestsEvictedUnjoined => "sglang_requests_evicted_unjoined",
    SglangRequestsJoined => "sglang_requests_joined",
    SglangRequestsUnjoined => "sglang_requests_unjoined",
    SglangSteps => "sglang_steps",
    SglangStepsUnstamped => "sglang_steps_unstamped",
    SglangStepsUntimed => "sglang_steps_untimed",
    VllmIpcBadMsgpack => "vllm_ipc_bad_msgpack",
    VllmIpcNotVllm => "vllm_ipc_not_vllm",
    VllmIpcTruncated => "vllm_ipc_truncated",
    VllmEngineCoreFound => "vllm_engine_core_found",
    VllmIpcLayoutAssumed => "vllm_ipc_layout_assumed",
    VllmIpcMessages => "vllm_ipc_messages",
    VllmIpcReady => "vllm_ipc_ready",
    VllmIpcSocketTableFull => "vllm_ipc_socket_table_full",
    VllmIpcUnsupportedVersion => "vllm_ipc_unsupported_version",
    VllmVersionPackageNotFound => "vllm_version_package_not_found",
    VllmEngineTableFull => "vllm_engine_table_full",
    VllmEventBadTimestamp => "vllm_event_bad_timestamp",
    VllmJoinAmbiguous => "vllm_join_ambiguous",
    VllmJoinOutsideRequestTime => "vllm_join_outside_request_time",
    VllmOutputsPartial => "vllm_outputs_partial",
    VllmOutputsSeenTwice => "vllm_outputs_seen_twice",
    VllmPreemptionsUnknownAborted => "vllm_preemptions_unknown_aborted",
    VllmRequestStepsUnknown => "vllm_request_steps_unknown",
    VllmRequestsAdded => "vllm_requests_added",
    VllmRequestsEvictedUnjoined => "vllm_requests_evicted_unjoined",
    VllmRequestsJoined => "vllm_requests_joined",
    VllmRequestsUnjoined => "vllm_requests_unjoined",
    VllmStepEnginesReset => "vllm_step_engines_reset",
    VllmIpcLayoutMismatch => "vllm_ipc_layout_mismatch",
    // Correlate: connections, requests, scheduler joins, timelines; requests lost or left incomplete.
    RequestsUnfinished => "requests_unfinished",
    ArrivalWireUnknown => "arrival_wire_unknown",
    ConnectionGaps => "connection_gaps",
    ConnectionRecordsLost => "connection_records_lost",
    ConnectionRecordsOutOfOrder => "connection_records_out_of_order",
    ConnectionResyncs => "connection_resyncs",
    ConnectionsNeverHttp => "connections_never_http",
    RequestBodyJsonError => "request_body_json_error",
    RequestCompleteWithoutStart => "request_complete_without_start",
    RequestsAborted => "requests_aborted",
    RequestsAfterServerShutdown => "requests_after_server_shutdown",
    RequestsAnsweredAfterClientLeft => "requests_answered_after_client_left",
    RequestsUnparsed => "requests_unparsed",
    RequestsUnparsedUnanswered => "requests_unparsed_unanswered",
    RequestsUnread => "requests_unread",
    RequestsWaitingOverLimit => "requests_waiting_over_limit",
    ResponseWithoutRequest => "response_without_request",
    ResyncBytesSkipped => "resync_bytes_skipped",
    SseEventsCut => "sse_events_cut",
    SseJsonError => "sse_json_error",
    RequestsIncomplete => "requests_incomplete",
    RequestsIncompleteAgentShutdown => "requests_incomplete_agent_shutdown",
    RequestsIncompleteChunkFraming => "requests_incomplete_chunk_framing",
    RequestsIncompleteEventsLost => "requests_incomplete_events_lost",
    RequestsIncompleteHeadLost => "requests_incomplete_head_lost",
    RequestsIncompleteHeadTooLarge => "requests_incomplete_head_too_large",
    RequestsIncompleteNotHttp => "requests_incomplete_not_http",
    RequestsIncompleteServerExited => "requests_incomplete_server_exited",
    RequestsIncompleteSseEventTooLarge => "requests_incomplete_sse_event_too_large",
    RequestsLost => "requests_lost",
    RequestsLostEventsLost => "requests_lost_events_lost",
    RequestsLostRequestNotCaptured => "requests_lost_request_not_captured",
    ArrivalSegmentsDropped => "arrival_segments_dropped",
    ConnectionsOpened => "connections_opened",
    ConnectionsOverLimit => "connections_over_limit",
    PeerClosesDropped => "peer_closes_dropped",
    RequestsCutByServer => "requests_cut_by_server",
    SchedRequestGone => "sched_request_gone",
    SchedStepEndWithoutBegin => "sched_step_end_without_begin",
    ResponseBodyJsonError => "response_body_json_error",
    SchedAdmitUnknownTask => "sched_admit_unknown_task",
    SchedDeferUnknownTask => "sched_defer_unknown_task",
    SchedJoinsOverLimit => "sched_joins_over_limit",
    SchedPostWithoutRequest => "sched_post_without_request",
    SchedReadsOverLimit => "sched_reads_over_limit",
    SchedRequeuesDropped => "sched_requeues_dropped",
    SchedSlotUnknown => "sched_slot_unknown",
    UserProbeThreadReadNoRequest => "user_probe_thread_read_no_request",
    UserProbeUnknownId => "user_probe_unknown_id",
    TimelineClosedEarly => "timeline_closed_early",
    TimelineKernelsEvicted => "timeline_kernels_evicted",
    TimelineKernelsNotKept => "timeline_kernels_not_kept",
    TimelineStepsEvicted => "timeline_steps_evicted",
    // Pipeline: process attach, adoption and record routing.
    ConnectionsPreexisting => "connections_preexisting",
    ConnectionsReroutedToIpc => "connections_rerouted_to_ipc",
    HooksAttachedLate => "hooks_attached_late",
    LateAttachOverLimit => "late_attach_over_limit",
    ProcessesAdoptedNotAttached => "processes_adopted_not_attached",
    ProcessesAdoptedOverLimit => "processes_adopted_over_limit",
    RecordUnexpectedKind => "record_unexpected_kind",
    RecordsBeforeAttach => "records_before_attach",
    RecordsNotEngineIpc => "records_not_engine_ipc",
    RecordsNotServerConnection => "records_not_server_connection",
    RecordsUntracedProcess => "records_untraced_process",
}

const COUNT: usize = Counter::ALL.len();

/// One stage's counters: a fixed array, no allocation per event.
#[derive(Debug, Clone)]
pub struct Stats {
    counts: [u64; COUNT],
    /// Counters this stage has added to (even 0), and so reports.
    touched: [bool; COUNT],
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            counts: [0; COUNT],
            touched: [false; COUNT],
        }
    }
}

impl Stats {
    pub fn bump(&mut self, counter: Counter) {
        self.add(counter, 1);
    }

    pub fn add(&mut self, counter: Counter, n: u64) {
        let i = counter as usize;
        self.counts[i] = self.counts[i].saturating_add(n);
        self.touched[i] = true;
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.counts[counter as usize]
    }

    /// The counters this stage reports, in declaration order, with their exported names.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Counter::ALL
            .iter()
            .filter(|c| self.touched[**c as usize])
            .map(|c| (c.name(), self.counts[*c as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for c in Counter::ALL {
            let name = c.name();
            assert!(seen.insert(name), "{name} twice");
            assert!(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
        }
    }

    #[test]
    fn stats_report_what_was_touched() {
        let mut s = Stats::default();
        s.bump(Counter::RequestsLost);
        s.add(Counter::RequestsLost, 2);
        s.add(Counter::ZmtpDesync, 0);
        assert_eq!(s.get(Counter::RequestsLost), 3);
        let reported: Vec<_> = s.iter().collect();
        assert_eq!(reported.len(), 2);
        assert!(reported.contains(&("requests_lost", 3)));
        assert!(reported.contains(&("zmtp_desync", 0)));
    }
}
