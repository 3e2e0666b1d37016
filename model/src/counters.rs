//! The agent's own counters: every event a stage drops, truncates, fails to parse or just counts,
//! and the few values that go down as well as up (gauges), as one enum, so a counter is named
//! once (here) and every increment is checked by the compiler. Each stage keeps a [`Stats`] of
//! them (or, for the kernel's and the shim listener's atomics, a table to them); the pipeline
//! merges all stages' values into one snapshot, `Vec<(Counter, u64)>`, that the agent exports
//! (Prometheus `inferscope_agent_events_total{counter=…}` and `inferscope_agent_state{name=…}`
//! for gauges, OTLP metrics, `--counters FILE`, its closing log).

/// What a counter's value means to a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A running total of something that happened (records read, requests joined).
    Total,
    /// A running total of something lost, dropped, cut or failed: the book's "Losses, counted in
    /// requests" names each one and what to do about it.
    Loss,
    /// A value that goes down as well as up (open connections): exported as a gauge.
    Gauge,
}

macro_rules! counters {
    ($($variant:ident => $name:literal: $kind:ident,)*) => {
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

            pub const fn kind(self) -> Kind {
                match self {
                    $(Counter::$variant => Kind::$kind,)*
                }
            }
        }
    };
}

counters! {
    // Kernel: the eBPF programs' per-CPU counters (see [`kernel`]), and the programs this kernel
    // could not take.
    KernelRecordsEmitted => "kernel_records_emitted": Total,
    KernelRingbufFullDrops => "kernel_ringbuf_full_drops": Loss,
    KernelPayloadTruncated => "kernel_payload_truncated": Loss,
    KernelCopyFailed => "kernel_copy_failed": Loss,
    KernelInflightMapFull => "kernel_inflight_map_full": Loss,
    KernelSegments => "kernel_segments": Total,
    KernelSchedEvents => "kernel_sched_events": Total,
    KernelSchedReadFailed => "kernel_sched_read_failed": Loss,
    KernelConnsAccepted => "kernel_conns_accepted": Total,
    KernelUnknownFdSkipped => "kernel_unknown_fd_skipped": Total,
    KernelConnSockFromRead => "kernel_conn_sock_from_read": Total,
    KernelConnsDuplicated => "kernel_conns_duplicated": Total,
    KernelCompactWrites => "kernel_compact_writes": Loss,
    KernelSockStates => "kernel_sock_states": Total,
    KernelProcessesAdopted => "kernel_processes_adopted": Total,
    KernelGpuLaunches => "kernel_gpu_launches": Total,
    KernelGpuLaunchesSampledOut => "kernel_gpu_launches_sampled_out": Loss,
    KernelGpuNames => "kernel_gpu_names": Total,
    KernelGpuNameReadFailed => "kernel_gpu_name_read_failed": Loss,
    KernelTokenEvents => "kernel_token_events": Total,
    KernelTokenTemplateMisses => "kernel_token_template_misses": Total,
    TokenTemplatesInstalled => "token_templates_installed": Total,
    TokenTemplatesRefused => "token_templates_refused": Total,
    TokenEventsOutOfStep => "token_events_out_of_step": Loss,
    KernelTlsConnections => "kernel_tls_connections": Total,
    KernelTlsRecords => "kernel_tls_records": Total,
    KernelTlsTies => "kernel_tls_ties": Total,
    KernelTlsUntied => "kernel_tls_untied": Total,
    KernelTlsNested => "kernel_tls_nested": Loss,
    KernelChunksUnsent => "kernel_chunks_unsent": Loss,
    KernelRecordsUnsent => "kernel_records_unsent": Loss,
    KernelTokenBatches => "kernel_token_batches": Total,
    // Connections whose template slots were both held by live connections: captured in full.
    KernelTokenSlotsBusy => "kernel_token_slots_busy": Total,
    // TCP writes stamped at their return: their bytes were still queued then.
    KernelWritesStampedAtReturn => "kernel_writes_stamped_at_return": Total,
    TlsProbesAttached => "tls_probes_attached": Total,
    TlsConnectionsUndecoded => "tls_connections_undecoded": Loss,
    KernelTracepointsUnattached => "kernel_tracepoints_unattached": Loss,
    // Capture: the CUPTI shim's socket (`gpu` and `run --shim-socket`).
    ShimConnections => "shim_connections": Total,
    ShimConnectionsActive => "shim_connections_active": Gauge,
    ShimConnectionsIdleClosed => "shim_connections_idle_closed": Loss,
    ShimConnectionsOverBudget => "shim_connections_over_budget": Loss,
    ShimBufferedBytes => "shim_buffered_bytes": Gauge,
    ShimConnectionsRejected => "shim_connections_rejected": Loss,
    ShimBatches => "shim_batches": Total,
    ShimKernelsReceived => "shim_kernels_received": Total,
    ShimMemcpysReceived => "shim_memcpys_received": Total,
    ShimParseFailures => "shim_parse_failures": Loss,
    ShimBadFrames => "shim_bad_frames": Loss,
    ShimReadErrors => "shim_read_errors": Loss,
    ShimQueueDrops => "shim_queue_drops": Loss,
    ShimDroppedRecords => "shim_dropped_records": Loss,
    ShimCuptiDroppedRecords => "shim_cupti_dropped_records": Loss,
    // Capture: kernel records, chunked syscalls, scraping, user probes.
    CaptureChunkedSyscalls => "capture_chunked_syscalls": Total,
    CaptureChunksLost => "capture_chunks_lost": Loss,
    CaptureChunksOrphaned => "capture_chunks_orphaned": Loss,
    MetricsScrapeErrorsNoEngineMetrics => "metrics_scrape_errors_no_engine_metrics": Loss,
    MetricsScrapes => "metrics_scrapes": Total,
    MetricsScrapeErrorsConnect => "metrics_scrape_errors_connect": Loss,
    MetricsScrapeErrorsTimeout => "metrics_scrape_errors_timeout": Loss,
    MetricsScrapeErrorsIo => "metrics_scrape_errors_io": Loss,
    MetricsScrapeErrorsHttpStatus => "metrics_scrape_errors_http_status": Loss,
    MetricsScrapeErrorsBadResponse => "metrics_scrape_errors_bad_response": Loss,
    MetricsScrapeErrorsTooLarge => "metrics_scrape_errors_too_large": Loss,
    MetricsCommandsDropped => "metrics_commands_dropped": Loss,
    MetricsScrapesDroppedQueueFull => "metrics_scrapes_dropped_queue_full": Loss,
    MetricsTargetsOverLimit => "metrics_targets_over_limit": Loss,
    RecordBadLength => "record_bad_length": Loss,
    RecordShort => "record_short": Loss,
    RecordUnknownKind => "record_unknown_kind": Loss,
    RecordUnknownType => "record_unknown_type": Loss,
    UserProbeReadFailed => "user_probe_read_failed": Loss,
    UserProbeUnknownIndex => "user_probe_unknown_index": Loss,
    UserProbesAttachedLate => "user_probes_attached_late": Total,
    UserProbesDisabled => "user_probes_disabled": Loss,
    UserProbesNotAttached => "user_probes_not_attached": Loss,
    // Decode: HTTP, ZMTP and pickle framing and parse failures.
    BadChunkSize => "bad_chunk_size": Loss,
    BodyTooLarge => "body_too_large": Loss,
    FramingLost => "framing_lost": Loss,
    HeadLost => "head_lost": Loss,
    HeadTooLarge => "head_too_large": Loss,
    NotHttp => "not_http": Loss,
    SseEventTooLarge => "sse_event_too_large": Loss,
    PickleMemoError => "pickle_memo_error": Loss,
    PickleOverBudget => "pickle_over_budget": Loss,
    PickleStackError => "pickle_stack_error": Loss,
    PickleTooLong => "pickle_too_long": Loss,
    PickleTruncated => "pickle_truncated": Loss,
    PickleTypeError => "pickle_type_error": Loss,
    PickleUnsupportedOpcode => "pickle_unsupported_opcode": Loss,
    ZmtpDesync => "zmtp_desync": Loss,
    ZmtpNotZmtp => "zmtp_not_zmtp": Loss,
    ZmtpOldVersion => "zmtp_old_version": Loss,
    // Decode: HTTP/2 framing and HPACK, gRPC messages (decode::http2).
    H2Streams => "h2_streams": Total,
    H2NotHttp2 => "h2_not_http2": Loss,
    H2FramingLost => "h2_framing_lost": Loss,
    H2Resyncs => "h2_resyncs": Total,
    H2ResyncBytesSkipped => "h2_resync_bytes_skipped": Loss,
    H2FramesMalformed => "h2_frames_malformed": Loss,
    H2FramesUntracked => "h2_frames_untracked": Total,
    H2DataBytesLost => "h2_data_bytes_lost": Loss,
    H2HeaderBlocksTooLarge => "h2_header_blocks_too_large": Loss,
    H2HeaderBlocksLost => "h2_header_blocks_lost": Loss,
    H2HpackErrors => "h2_hpack_errors": Loss,
    H2HpackUnknownFields => "h2_hpack_unknown_fields": Loss,
    H2HpackResyncs => "h2_hpack_resyncs": Total,
    H2StreamsOverLimit => "h2_streams_over_limit": Loss,
    H2StreamIdsReused => "h2_stream_ids_reused": Loss,
    GrpcMessageFramingLost => "grpc_message_framing_lost": Loss,
    GrpcPairedMessagesDropped => "grpc_paired_messages_dropped": Loss,
    // Calls of a stream that carries one call per request message (KServe's ModelStreamInfer).
    GrpcStreamCalls => "grpc_stream_calls": Total,
    GrpcStreamResponsesUnmatched => "grpc_stream_responses_unmatched": Loss,
    GrpcStreamCallsEvicted => "grpc_stream_calls_evicted": Loss,
    GrpcStreamCallsUnended => "grpc_stream_calls_final_unseen": Total,
    GrpcStreamResyncs => "grpc_stream_resyncs": Total,
    // gRPC calls of an engine's own server whose request message names the engine request.
    RpcRequestIdsRead => "rpc_request_ids_read": Total,
    RpcRequestIdsUnread => "rpc_request_ids_unread": Loss,
    // Engines: what each engine plugin's IPC decoder and scheduler join saw or lost.
    SglangVersionFromPackage => "sglang_version_from_package": Total,
    SglangVersionUnsupported => "sglang_version_unsupported": Loss,
    VllmVersionFromPackage => "vllm_version_from_package": Total,
    // Disaggregated serving: prefill and decode legs of one request joined (join::disagg).
    DisaggLegsJoined => "disagg_legs_joined": Total,
    DisaggLegsUnjoined => "disagg_legs_unjoined": Total,
    DisaggPrefillLegsEvicted => "disagg_prefill_legs_evicted": Loss,
    DisaggProxyJoined => "disagg_proxy_records_joined": Total,
    DisaggProxyUnjoined => "disagg_proxy_records_unjoined": Loss,
    DisaggLegsWithoutProxy => "disagg_legs_without_proxy": Loss,
    DisaggDecodeLegsEvicted => "disagg_decode_legs_evicted": Loss,
    VllmVersionUnsupported => "vllm_version_unsupported": Loss,
    SglangIpcLayoutMismatch => "sglang_ipc_layout_mismatch": Loss,
    SglangIpcNotPickle => "sglang_ipc_not_pickle": Loss,
    SglangIpcFrameCut => "sglang_ipc_frame_cut": Loss,
    SglangIpcLayoutAssumed => "sglang_ipc_layout_assumed": Total,
    SglangIpcMessages => "sglang_ipc_messages": Total,
    SglangIpcSocketTableFull => "sglang_ipc_socket_table_full": Loss,
    SglangIpcUnsupportedVersion => "sglang_ipc_unsupported_version": Loss,
    SglangVersionPackageNotFound => "sglang_version_package_not_found": Loss,
    ZmtpFramesDropped => "zmtp_frames_dropped": Loss,
    ZmtpFramesIncomplete => "zmtp_frames_incomplete": Loss,
    ZmtpHuntSkipped => "zmtp_hunt_skipped": Loss,
    PickleTooDeep => "pickle_too_deep": Loss,
    PickleUnknownOpcode => "pickle_unknown_opcode": Loss,
    SglangSchedulerAmbiguous => "sglang_scheduler_ambiguous": Loss,
    SglangSchedulerFound => "sglang_scheduler_found": Total,
    SglangSchedulerNotFound => "sglang_scheduler_not_found": Loss,
    SglangAdmissionUnknown => "sglang_admission_unknown": Loss,
    SglangBadTimestamp => "sglang_bad_timestamp": Loss,
    SglangOutputs => "sglang_outputs": Total,
    SglangPreemptionsUnknownAborted => "sglang_preemptions_unknown_aborted": Loss,
    SglangRequestsAdded => "sglang_requests_added": Total,
    SglangRequestsEvictedUnjoined => "sglang_requests_evicted_unjoined": Loss,
    SglangRequestsJoined => "sglang_requests_joined": Total,
    SglangRequestsUnjoined => "sglang_requests_unjoined": Loss,
    SglangSteps => "sglang_steps": Total,
    SglangStepsUnstamped => "sglang_steps_unstamped": Loss,
    SglangStepsUntimed => "sglang_steps_untimed": Loss,
    VllmIpcBadMsgpack => "vllm_ipc_bad_msgpack": Loss,
    VllmIpcNotVllm => "vllm_ipc_not_vllm": Loss,
    VllmIpcTruncated => "vllm_ipc_truncated": Loss,
    VllmEngineCoreFound => "vllm_engine_core_found": Total,
    VllmIpcLayoutAssumed => "vllm_ipc_layout_assumed": Total,
    VllmIpcMessages => "vllm_ipc_messages": Total,
    VllmIpcReady => "vllm_ipc_ready": Total,
    VllmIpcSocketTableFull => "vllm_ipc_socket_table_full": Loss,
    VllmIpcUnsupportedVersion => "vllm_ipc_unsupported_version": Loss,
    VllmVersionPackageNotFound => "vllm_version_package_not_found": Loss,
    VllmEngineTableFull => "vllm_engine_table_full": Loss,
    VllmEventBadTimestamp => "vllm_event_bad_timestamp": Loss,
    VllmJoinAmbiguous => "vllm_join_ambiguous": Loss,
    VllmKvTransfersUnattributed => "vllm_kv_transfers_unattributed": Loss,
    VllmJoinOutsideRequestTime => "vllm_join_outside_request_time": Loss,
    VllmOutputsPartial => "vllm_outputs_partial": Loss,
    VllmOutputsSeenTwice => "vllm_outputs_seen_twice": Loss,
    VllmPreemptionsUnknownAborted => "vllm_preemptions_unknown_aborted": Loss,
    VllmRequestStepsUnknown => "vllm_request_steps_unknown": Loss,
    VllmRequestsAdded => "vllm_requests_added": Total,
    VllmRequestsEvictedUnjoined => "vllm_requests_evicted_unjoined": Loss,
    VllmRequestsJoined => "vllm_requests_joined": Total,
    VllmRequestsPartial => "vllm_requests_partial": Loss,
    VllmRequestsUnjoined => "vllm_requests_unjoined": Loss,
    VllmStepEnginesReset => "vllm_step_engines_reset": Loss,
    VllmIpcLayoutMismatch => "vllm_ipc_layout_mismatch": Loss,
    // Correlate: connections, requests, scheduler joins, timelines; requests lost or left incomplete.
    RequestsUnfinished => "requests_unfinished": Total,
    RecordsHeldForEngine => "records_held_for_engine": Total,
    RecordsHeldForEngineUntold => "records_held_for_engine_untold": Total,
    // Join: finished records waiting for what they still lack (engine word, decode leg, kernels).
    JoinRecordsReleasedEarly => "join_records_released_early": Loss,
    JoinRecordsWaiting => "join_records_waiting": Gauge,
    ClosesRecovered => "closes_recovered": Total,
    TokenEventsTakenAtExit => "token_events_taken_at_exit": Total,
    ArrivalWireUnknown => "arrival_wire_unknown": Loss,
    ConnectionGaps => "connection_gaps": Loss,
    ConnectionRecordsLost => "connection_records_lost": Loss,
    ConnectionRecordsOutOfOrder => "connection_records_out_of_order": Total,
    ConnectionResyncs => "connection_resyncs": Total,
    ConnectionsNeverHttp => "connections_never_http": Loss,
    RequestBodyJsonError => "request_body_json_error": Loss,
    RequestCompleteWithoutStart => "request_complete_without_start": Loss,
    RequestsAborted => "requests_aborted": Total,
    RequestsAfterServerShutdown => "requests_after_server_shutdown": Total,
    RequestsAnsweredAfterClientLeft => "requests_answered_after_client_left": Total,
    RequestsUnparsed => "requests_unparsed": Loss,
    RequestsUnparsedUnanswered => "requests_unparsed_unanswered": Loss,
    RequestsUnread => "requests_unread": Loss,
    RequestsWaitingOverLimit => "requests_waiting_over_limit": Loss,
    ResponseWithoutRequest => "response_without_request": Loss,
    ResyncBytesSkipped => "resync_bytes_skipped": Loss,
    SseEventsCut => "sse_events_cut": Loss,
    SseJsonError => "sse_json_error": Loss,
    RequestsIncomplete => "requests_incomplete": Loss,
    RequestsIncompleteAgentShutdown => "requests_incomplete_agent_shutdown": Loss,
    // A surge roll's handover (daemon::handover): requests the other agent on the node records.
    RequestsHandedOver => "requests_handed_over": Total,
    RequestsLeftToPreviousAgent => "requests_left_to_previous_agent": Total,
    RequestsIncompleteChunkFraming => "requests_incomplete_chunk_framing": Loss,
    RequestsIncompleteEventsLost => "requests_incomplete_events_lost": Loss,
    RequestsIncompleteHeadLost => "requests_incomplete_head_lost": Loss,
    RequestsIncompleteHeadTooLarge => "requests_incomplete_head_too_large": Loss,
    RequestsIncompleteNotHttp => "requests_incomplete_not_http": Loss,
    RequestsIncompleteHttp2Framing => "requests_incomplete_http2_framing": Loss,
    // h2c connections handed to the HTTP/2 decoder (their streams are counted in h2_streams).
    Http2Connections => "http2_connections": Total,
    RequestsIncompleteServerExited => "requests_incomplete_server_exited": Loss,
    RequestsIncompleteSseEventTooLarge => "requests_incomplete_sse_event_too_large": Loss,
    RequestsLost => "requests_lost": Loss,
    RequestsLostEventsLost => "requests_lost_events_lost": Loss,
    RequestsLostRequestNotCaptured => "requests_lost_request_not_captured": Loss,
    RequestsLostWaitingOverLimit => "requests_lost_waiting_over_limit": Loss,
    RequestsLostConnectionsOverLimit => "requests_lost_connections_over_limit": Loss,
    ArrivalSegmentsDropped => "arrival_segments_dropped": Loss,
    ConnectionsOpened => "connections_opened": Total,
    ConnectionsOverLimit => "connections_over_limit": Loss,
    PeerClosesDropped => "peer_closes_dropped": Loss,
    RequestsCutByServer => "requests_cut_by_server": Total,
    SchedRequestGone => "sched_request_gone": Loss,
    SchedStepEndWithoutBegin => "sched_step_end_without_begin": Loss,
    ResponseBodyJsonError => "response_body_json_error": Loss,
    SchedAdmitUnknownTask => "sched_admit_unknown_task": Loss,
    SchedDeferUnknownTask => "sched_defer_unknown_task": Loss,
    SchedJoinsOverLimit => "sched_joins_over_limit": Loss,
    SchedPostWithoutRequest => "sched_post_without_request": Loss,
    SchedReadsOverLimit => "sched_reads_over_limit": Loss,
    SchedRequeuesDropped => "sched_requeues_dropped": Loss,
    SchedSlotUnknown => "sched_slot_unknown": Loss,
    UserProbeThreadReadNoRequest => "user_probe_thread_read_no_request": Loss,
    UserProbeUnknownId => "user_probe_unknown_id": Loss,
    TimelineKernelsEvicted => "timeline_kernels_evicted": Loss,
    TimelineKernelsNotKept => "timeline_kernels_not_kept": Loss,
    TimelineStepsEvicted => "timeline_steps_evicted": Loss,
    // Pipeline: process attach, adoption and record routing.
    ConnectionsPreexisting => "connections_preexisting": Total,
    ConnectionsReroutedToIpc => "connections_rerouted_to_ipc": Total,
    HooksAttachedLate => "hooks_attached_late": Total,
    LateAttachOverLimit => "late_attach_over_limit": Loss,
    GpuLaunchRecords => "gpu_launch_records": Total,
    GpuLaunchNamesEvicted => "gpu_launch_names_evicted": Loss,
    GpuLaunchesEvicted => "gpu_launches_evicted": Total,
    GpuLaunchHooksAttached => "gpu_launch_hooks_attached": Total,
    GpuWorkersOverLimit => "gpu_workers_over_limit": Loss,
    GpuLaunchesNested => "gpu_launches_nested": Total,
    GpuKernelsUnnamed => "gpu_kernels_unnamed": Total,
    GpuLaunchProbesPaused => "gpu_launch_probes_paused": Loss,
    ProcessesAdoptedNotAttached => "processes_adopted_not_attached": Loss,
    ProcessesAdoptedOverLimit => "processes_adopted_over_limit": Loss,
    RecordUnexpectedKind => "record_unexpected_kind": Loss,
    RecordsBeforeAttach => "records_before_attach": Total,
    RecordsNotEngineIpc => "records_not_engine_ipc": Total,
    RecordsNotServerConnection => "records_not_server_connection": Total,
    RecordsUntracedProcess => "records_untraced_process": Loss,
    RingbufRecords => "ringbuf_records": Total,
    RingbufBytes => "ringbuf_bytes": Total,
    FdLookups => "fd_lookups": Total,
    MetricsScrapeRequestsHidden => "metrics_scrape_requests_hidden": Total,
    OpenConnections => "open_connections": Gauge,
    OpenRequests => "open_requests": Gauge,
    // Engine processes being traced (0 with an engine on the node: the agent is detached).
    EngineProcessesTraced => "engine_processes_traced": Gauge,
    // Identity: container and Kubernetes pod names.
    IdentityPodUnknown => "identity_pod_unknown": Loss,
    IdentityTableFull => "identity_table_full": Loss,
    KubeLists => "kube_lists": Total,
    KubeWatchEvents => "kube_watch_events": Total,
    KubeApiErrors => "kube_api_errors": Loss,
    KubeGarbage => "kube_garbage": Loss,
    KubePodsDropped => "kube_pods_dropped": Loss,
    KubeWatchExpired => "kube_watch_expired": Total,
    // Daemon (`run`): OTLP spans, the JSONL file, gRPC subscribers.
    OtlpSpansSubmitted => "otlp_spans_submitted": Total,
    OtlpSpansExported => "otlp_spans_exported": Total,
    OtlpSpansFailed => "otlp_spans_failed": Loss,
    OtlpExportCalls => "otlp_export_calls": Total,
    OtlpSpansPendingOrDropped => "otlp_spans_pending_or_dropped": Gauge,
    OtlpRequestsSampledOut => "otlp_requests_sampled_out": Total,
    RecordsWriteFailed => "records_write_failed": Loss,
    GrpcSubscriberRecordsLagged => "grpc_subscriber_records_lagged": Loss,
    GrpcSubscribers => "grpc_subscribers": Gauge,
}

/// The exported counter of each of the kernel's counters (indexed by the eBPF side's enum).
pub const fn kernel(c: inferscope_common::Counter) -> Counter {
    use inferscope_common::Counter as K;
    match c {
        K::RecordsEmitted => Counter::KernelRecordsEmitted,
        K::RingbufFull => Counter::KernelRingbufFullDrops,
        K::PayloadTruncated => Counter::KernelPayloadTruncated,
        K::CopyFailed => Counter::KernelCopyFailed,
        K::InflightMapFull => Counter::KernelInflightMapFull,
        K::Segments => Counter::KernelSegments,
        K::SchedEvents => Counter::KernelSchedEvents,
        K::SchedReadFailed => Counter::KernelSchedReadFailed,
        K::ConnsAccepted => Counter::KernelConnsAccepted,
        K::UnknownFdSkipped => Counter::KernelUnknownFdSkipped,
        K::SockFromRead => Counter::KernelConnSockFromRead,
        K::ConnsDuplicated => Counter::KernelConnsDuplicated,
        K::CompactWrites => Counter::KernelCompactWrites,
        K::SockStates => Counter::KernelSockStates,
        K::ProcessesAdopted => Counter::KernelProcessesAdopted,
        K::GpuLaunches => Counter::KernelGpuLaunches,
        K::GpuLaunchesSampledOut => Counter::KernelGpuLaunchesSampledOut,
        K::GpuNames => Counter::KernelGpuNames,
        K::GpuNameReadFailed => Counter::KernelGpuNameReadFailed,
        K::TokenEvents => Counter::KernelTokenEvents,
        K::TokenTemplateMisses => Counter::KernelTokenTemplateMisses,
        K::TlsConnections => Counter::KernelTlsConnections,
        K::TlsRecords => Counter::KernelTlsRecords,
        K::TlsTies => Counter::KernelTlsTies,
        K::TlsUntied => Counter::KernelTlsUntied,
        K::TlsNested => Counter::KernelTlsNested,
        K::ChunksUnsent => Counter::KernelChunksUnsent,
        K::RecordsUnsent => Counter::KernelRecordsUnsent,
        K::TokenBatches => Counter::KernelTokenBatches,
        K::TokenSlotsBusy => Counter::KernelTokenSlotsBusy,
        K::WritesStampedAtReturn => Counter::KernelWritesStampedAtReturn,
    }
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

    /// The counters this stage reports, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL
            .iter()
            .filter(|c| self.touched[**c as usize])
            .map(|c| (*c, self.counts[*c as usize]))
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
        assert!(reported.contains(&(Counter::RequestsLost, 3)));
        assert!(reported.contains(&(Counter::ZmtpDesync, 0)));
    }

    #[test]
    fn kernel_counters_keep_their_names_with_the_prefix() {
        let mut seen = std::collections::HashSet::new();
        for k in inferscope_common::Counter::ALL {
            let c = kernel(k);
            assert_eq!(c.name(), format!("kernel_{}", k.name()));
            assert!(seen.insert(c), "{c:?} twice");
        }
    }

    /// Every counter of a loss, drop or failure is named (in backquotes) on the book's page
    /// "Losses, counted in requests" (docs/src/losses.md), with what it counts and what to do.
    #[test]
    fn the_losses_page_names_every_loss_counter() {
        let page = include_str!("../../docs/src/losses.md");
        assert!(
            page.starts_with("# Losses, counted in requests\n"),
            "docs/src/losses.md is the losses page"
        );
        let missing: Vec<_> = Counter::ALL
            .iter()
            .filter(|c| c.kind() == Kind::Loss)
            .map(|c| c.name())
            .filter(|name| !page.contains(&format!("`{name}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/src/losses.md does not name: {missing:?}"
        );
    }
}
