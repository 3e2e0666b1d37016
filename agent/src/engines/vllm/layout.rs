//! Where vLLM V1 puts each field, per version. `EngineCoreRequest`, `EngineCoreOutput` and
//! `EngineCoreOutputs` are msgspec structs with `array_like=True`: on the wire they are msgpack
//! arrays, fields by position, trailing defaults omitted. Positions drift between versions, so
//! each supported version is pinned here, read from that version's vllm/v1/engine/__init__.py.
//! `EngineCoreEvent` (no array_like) and `SchedulerStats` (a dataclass) are msgpack maps keyed by
//! field name, so they need no positions.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    /// `major.minor` this layout was read from.
    pub version: &'static str,
    /// EngineCoreRequest
    pub req_request_id: u32,
    pub req_prompt_token_ids: u32,
    /// Wall-clock seconds (time.time()) when the API server took the request.
    pub req_arrival_time: u32,
    pub req_external_req_id: u32,
    /// EngineCoreOutput
    pub out_request_id: u32,
    pub out_new_token_ids: u32,
    pub out_finish_reason: u32,
    pub out_events: u32,
    /// The most fields an EngineCoreOutput has in this version (more means another layout).
    pub out_fields: u32,
    /// EngineCoreOutputs
    /// The data-parallel rank of the engine core that sent it.
    pub outs_engine_index: u32,
    pub outs_outputs: u32,
    pub outs_scheduler_stats: u32,
    pub outs_timestamp: u32,
    pub outs_finished_requests: u32,
    pub outs_fields: u32,
    /// The most fields an EngineCoreRequest has.
    pub req_fields: u32,
}

/// vLLM 0.33 (0.33.0 wheel): EngineCoreRequest has 22 fields (request_id, prompt_token_ids,
/// mm_features, sampling_params, pooling_params, arrival_time, lora_request, cache_salt,
/// data_parallel_rank, prompt_embeds, prompt_is_token_ids, client_index, current_wave, priority,
/// trace_headers, resumable, external_req_id, ...); EngineCoreOutput 19 (request_id,
/// new_token_ids, new_logprobs, new_prompt_logprobs_tensors, pooling_output, finish_reason,
/// stop_reason, events, ...); EngineCoreOutputs 9 (engine_index, outputs, scheduler_stats,
/// timestamp, utility_output, finished_requests, ...). msgspec 0.22 writes every field of an
/// array_like struct here, defaults included.
pub(super) const V0_33: Layout = Layout {
    version: "0.33",
    req_request_id: 0,
    req_prompt_token_ids: 1,
    req_arrival_time: 5,
    req_external_req_id: 16,
    req_fields: 22,
    out_request_id: 0,
    out_new_token_ids: 1,
    out_finish_reason: 5,
    out_events: 7,
    out_fields: 19,
    outs_engine_index: 0,
    outs_outputs: 1,
    outs_scheduler_stats: 2,
    outs_timestamp: 3,
    outs_finished_requests: 5,
    outs_fields: 9,
};

static LAYOUTS: &[Layout] = &[V0_33];

/// The versions with a pinned layout, for messages.
pub(super) const SUPPORTED: &str = "0.33.x";

/// The newest pinned layout: used, with strict shape checks, when the engine's version was not
/// seen (the agent attached after the engine's start-up handshake).
pub(super) const NEWEST: Layout = V0_33;

/// The layout for a reported `vllm_version` ("0.33.0", "0.33.1rc1+cu128"), if it is pinned.
pub(super) fn for_version(version: &str) -> Option<&'static Layout> {
    let mut parts = version.split('.');
    let major = parts.next()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let key = format!("{major}.{minor}");
    LAYOUTS.iter().find(|l| l.version == key)
}

/// vLLM's FinishReason (an IntEnum, sent as its int).
pub(super) fn finish_reason(code: i64) -> Option<&'static str> {
    ["stop", "length", "abort", "error", "repetition"]
        .get(usize::try_from(code).ok()?)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_pinned_layouts() {
        assert_eq!(for_version("0.33.0"), Some(&V0_33));
        assert_eq!(for_version("0.33.2rc1+cu128"), Some(&V0_33));
        assert_eq!(for_version("0.32.0"), None);
        assert_eq!(for_version("0.330.0"), None);
        assert_eq!(for_version("garbage"), None);
        assert_eq!(finish_reason(1), Some("length"));
        assert_eq!(finish_reason(9), None);
    }
}
