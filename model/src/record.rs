//! The per-request record: what `inferscope record` writes, one JSON object per finished request.
//! Sizes, counts, ids and times only — never prompt or completion text.
use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    /// The agent's id: `<pid>-<connection>-<sequence on the connection>`.
    pub request_id: String,
    /// The stream's own id (`chatcmpl-…`), from the response.
    pub response_id: Option<String>,
    pub x_request_id: Option<String>,
    /// The request id a gRPC call's request message named, where its engine's server reads
    /// one there (vLLM's `GenerateRequest.request_id`).
    pub rpc_request_id: Option<String>,
    pub traceparent: Option<String>,
    pub pid: u32,
    pub engine: String,
    pub method: String,
    pub path: String,
    pub status: Option<u16>,
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub max_tokens: Option<u64>,
    /// Bytes of prompt text in the body (the text itself is never kept).
    pub prompt_bytes: Option<u64>,

    /// Earliest known arrival: the first TCP segment of the request, else the server's read.
    pub arrival_mono_ns: u64,
    pub arrival_unix_ns: u64,
    /// When the server read the request's first bytes.
    pub arrival_read_mono_ns: u64,
    /// When the request's first TCP segment reached the socket, where the kernel saw it.
    pub arrival_wire_mono_ns: Option<u64>,
    /// Read time minus wire arrival: how long the request sat in the socket buffer.
    pub read_delay_ms: Option<f64>,
    pub request_complete_mono_ns: Option<u64>,
    pub first_byte_mono_ns: Option<u64>,
    pub first_token_mono_ns: Option<u64>,
    pub last_token_mono_ns: Option<u64>,
    pub end_mono_ns: u64,

    pub ttft_ms: Option<f64>,
    /// The engine's own task id (scheduler hooks).
    pub engine_task_id: Option<i64>,
    /// When the engine's scheduler admitted the request (scheduler hooks).
    pub admitted_mono_ns: Option<u64>,
    /// Arrival → admission: time spent waiting for a slot.
    pub queue_wait_ms: Option<f64>,
    /// Admission → first token (the engine's, where a hook sees it, else the socket's).
    pub prefill_ms: Option<f64>,
    /// The engine's first token → its write to the socket (the HTTP thread's hand-off), where
    /// both are seen: queue wait + prefill + hand-off = TTFT.
    pub first_token_handoff_ms: Option<f64>,
    /// The engine slot (sequence) that served the request.
    pub engine_slot: Option<u32>,
    /// When the engine parked the request for want of a free slot (it then waited in the
    /// engine's deferred list, not its queue).
    pub deferred_mono_ns: Option<u64>,
    /// When a freed slot took the parked request back.
    pub requeued_mono_ns: Option<u64>,
    /// The engine's own first-token, final-result and slot-release times.
    pub engine_first_token_mono_ns: Option<u64>,
    /// When the engine's scheduler queued the request, and when the engine built the first
    /// output carrying a token for it, on its own clock (vLLM's IPC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_queued_mono_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_first_output_mono_ns: Option<u64>,
    /// The engine's KV connector's own time for the transfer of this request's remote KV
    /// cache (vLLM: the duration its connector, e.g. NIXL, reported for it in the scheduler
    /// stats), where the request waited for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_kv_transfer_ms: Option<f64>,
    pub engine_finished_mono_ns: Option<u64>,
    pub slot_released_mono_ns: Option<u64>,
    /// Engine steps the request took part in before / after its first token.
    pub prefill_steps: Option<u64>,
    pub decode_steps: Option<u64>,
    /// Times the engine evicted the request to free KV memory (0 for engines without
    /// preemption, such as llama.cpp, once admission is observed).
    pub preemptions: Option<u64>,
    pub tpot_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub itl_max_ms: Option<f64>,
    pub e2e_ms: f64,

    /// SSE events that carried generated content.
    pub output_chunks: u64,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Prompt tokens the engine served from its prefix cache: SGLang's IPC, or the response's
    /// `usage.prompt_tokens_details.cached_tokens` (vLLM, SGLang, llama.cpp; llama.cpp's
    /// `timings.cache_n` where usage lacks it).
    pub cached_tokens: Option<u64>,
    /// The engine's own prefill and decode times, where its final chunk reports them.
    pub engine_prompt_ms: Option<f64>,
    pub engine_predicted_ms: Option<f64>,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// The client went away before the response ended (`ended_by` is `client`).
    pub aborted: bool,
    /// Who ended the request: the response completed, or the client or the server cut it.
    pub ended_by: EndedBy,
    /// The connection was open before the agent attached (found in /proc, not seen accepted):
    /// its first request may have started earlier, and its arrivals join by address.
    pub connection_preexisting: bool,
    /// The connection was TLS (HTTPS): its bytes were read where the TLS library hands over
    /// plaintext, not on the socket.
    pub tls: bool,
    /// The server answered bytes that did not parse as an HTTP request (method, path and body
    /// fields are empty; status and sizes are the answer's).
    pub request_unparsed: bool,
    /// Set when the agent could not follow the request to its end, naming why (`events_lost`,
    /// `chunk_framing`, `head_too_large`, `agent_shutdown`, ...): the fields it has are right,
    /// the ones after the loss are missing. Never set for a client that went away (`aborted`).
    pub incomplete: Option<String>,
    /// Some bytes of this request or response were not captured; fields may be missing.
    pub capture_truncated: bool,

    pub connection_id: u64,
    pub seq_on_connection: u32,
    /// Thread that read the request (joins to the engine's scheduler events).
    pub reader_tid: u32,

    /// Engine metrics (`--metrics`) the request found on arrival: KV cache in use (0..1) and
    /// the engine's waiting queue from the last scrape before the arrival (else the first
    /// after it), and when that scrape was taken relative to the arrival (ms, positive = after).
    /// Empty without a scrape within two scrape intervals of the arrival.
    pub kv_cache_usage_at_arrival: Option<f64>,
    pub requests_waiting_at_arrival: Option<f64>,
    pub engine_metrics_offset_ms: Option<f64>,

    /// Engine-side fields (by record field name) the engine served this request with but the
    /// agent could not learn, e.g. `preemptions` of an aborted vLLM request (vLLM reports a
    /// preemption only with the request's next output) or `prompt_tokens` of a new-request IPC
    /// message that was not captured. Empty when nothing is missing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub engine_unknown: Vec<&'static str>,
    /// The engine steps this request took part in, where the engine's own module joins them
    /// (vLLM: its steps list engine request ids, not the agent's): each step's process, end and
    /// the request's phase in it, sorted by end. The timeline joins steps through these rather
    /// than by the agent's id in the step's members. Not written to the record (the counts are
    /// `prefill_steps` / `decode_steps`).
    #[serde(skip)]
    pub engine_steps: Vec<StepRef>,
    /// What the bodies said about a prefill/decode hand-off (digested; never written).
    #[serde(skip)]
    pub disagg_hints: Option<Box<super::DisaggHints>>,
    /// The disaggregated-serving view of this leg, where it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagg: Option<Box<super::DisaggInfo>>,
    /// The HTTP/2 stream this request was, with its gRPC fields; absent for HTTP/1.x.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http2: Option<Box<Http2Info>>,
    /// The engine process's container and Kubernetes pod (`container_id`, `k8s_pod_name`,
    /// `k8s_namespace_name`, …), where known; absent for a process on the host.
    #[serde(flatten)]
    pub identity: Option<super::ProcessIdentity>,
}

impl RequestRecord {
    /// Prompt tokens the engine computed in prefill: the prompt less what its prefix cache
    /// served, where both are known.
    pub fn prefill_tokens_computed(&self) -> Option<u64> {
        Some(self.prompt_tokens?.saturating_sub(self.cached_tokens?))
    }

    /// Stamps the engine's admission of the request and the two phases it bounds: the queue
    /// wait since arrival, and prefill up to the first token (where that came after it).
    pub fn set_admitted(&mut self, admitted_mono_ns: u64) {
        self.admitted_mono_ns = Some(admitted_mono_ns);
        self.queue_wait_ms = Some(crate::clock::ns_to_ms(
            admitted_mono_ns.saturating_sub(self.arrival_mono_ns),
        ));
        self.prefill_ms = self
            .first_token_mono_ns
            .filter(|t| *t >= admitted_mono_ns)
            .map(|t| crate::clock::ns_to_ms(t - admitted_mono_ns));
    }
}

/// What an HTTP/2 (h2c) stream adds to its record: its id, content-type, gRPC status and the
/// messages each way (sizes and counts only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Http2Info {
    pub stream_id: u32,
    /// `unknown` where the header referred to an HPACK table entry the agent never saw.
    pub content_type: Option<String>,
    /// From the trailers (or a trailers-only response); absent when the stream carried none.
    pub grpc_status: Option<u32>,
    /// gRPC messages (length-prefixed) whose end was seen, and their summed lengths.
    pub request_messages: u32,
    pub request_message_bytes: u64,
    pub response_messages: u32,
    pub response_message_bytes: u64,
    /// How the stream ended on the wire: `end_stream`, `rst_stream`, `goaway`, `closed` (the
    /// connection closed with it open), `id_reused`. For one call of a stream that carries many
    /// (Triton's `ModelStreamInfer`): `final_response` or `error_response` (the call's own end),
    /// `evicted` (too many calls open), else the stream's end that cut it.
    pub stream_end: &'static str,
    /// The error code of the RST_STREAM or GOAWAY that ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<u32>,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// The response ended as its framing says (length, last chunk, or a close-delimited body).
    #[default]
    Complete,
    /// The client closed or reset the connection before the response ended.
    Client,
    /// The server closed the connection (or exited) before the response ended.
    Server,
    /// The agent stopped before the end was seen.
    Unknown,
}

impl EndedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            EndedBy::Complete => "complete",
            EndedBy::Client => "client",
            EndedBy::Server => "server",
            EndedBy::Unknown => "unknown",
        }
    }
}

/// One engine step (a forward pass over the current batch), from the scheduler hooks.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepRecord {
    pub pid: u32,
    pub engine: String,
    /// The engine thread that ran the step.
    pub tid: u32,
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
    pub duration_ms: f64,
    /// Tokens in the batch, where the engine's ABI exposes it.
    pub batch_tokens: Option<u64>,
    /// Sequences (requests) in the batch, counted in full even where `requests` is cut short.
    pub sequences: u64,
    /// How many of them were prefilling (the rest were decoding).
    pub prefilling: u64,
    /// Requests in flight in the engine during the step (admitted, response not finished).
    /// From vLLM's IPC: the requests that produced tokens in the step, by engine request id.
    pub requests: Vec<StepMember>,
    /// KV cache in use after the step, 0..1 (vLLM's scheduler stats).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage: Option<f64>,
    /// Requests running / waiting in the engine after the step (vLLM's scheduler stats).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running_requests: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_requests: Option<u64>,
    /// How `start_mono_ns` is known, where it is not a hook's own stamp (vLLM's IPC):
    /// `scheduled` (a SCHEDULED or PREEMPTED event of the step: the scheduler's own clock at the
    /// step's schedule()), `previous_step` (the previous step's end: steps run back to back, so
    /// the engine's work between steps counts in), `unknown` (after an idle gap: the end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_from: Option<&'static str>,
    /// The process that launched the step's GPU kernels, where not `pid` (vLLM: the step is
    /// seen on the API server's IPC, its kernels run in the EngineCore process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_pid: Option<u32>,
    /// Where the step's kernels may start, where earlier than `start_mono_ns` (vLLM after an
    /// idle gap: the start is unknown, but the engine ran nothing since its previous step).
    #[serde(skip)]
    pub kernels_from_ns: Option<u64>,
    /// The GPU launches the step made (launch uprobes), where the process's CUDA library is
    /// probed; merged with the CUPTI shim's kernel records where the shim runs too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_launches: Option<super::StepLaunches>,
    /// The step's own launch records behind `gpu_launches`, kept only until the shim's kernel
    /// records of the step can have arrived and been merged (see correlate::launch_merge).
    #[serde(skip)]
    pub launch_list: Option<std::sync::Arc<[super::LaunchRecord]>>,
}

impl StepRecord {
    /// The process whose kernels ran in this step.
    pub fn gpu_pid(&self) -> u32 {
        self.kernel_pid.unwrap_or(self.pid)
    }

    /// The first launch time of the step's kernels.
    pub fn kernels_from(&self) -> u64 {
        self.kernels_from_ns
            .map_or(self.start_mono_ns, |t| t.min(self.start_mono_ns))
    }
}

/// One engine step named by its process and end, with a request's phase in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRef {
    pub pid: u32,
    pub end_mono_ns: u64,
    pub phase: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepMember {
    pub request_id: String,
    /// "prefill" before the request's first token, "decode" after.
    pub phase: &'static str,
}
