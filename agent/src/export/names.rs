//! Names and attributes the exporters share: OpenTelemetry GenAI semantic conventions
//! (`gen_ai.*`) where they exist, `inferscope.*` for the rest. Only sizes, counts, ids and times:
//! prompt and completion text never reach an exporter (the agent never keeps them).
use inferscope_model::RequestRecord;
use opentelemetry::KeyValue;

use crate::join::timeline::RequestTimeline;

/// `gen_ai.operation.name` from the endpoint, where it is one of the OpenAI-compatible ones.
pub(crate) fn operation_name(path: &str) -> Option<&'static str> {
    let path = path.split('?').next().unwrap_or(path);
    match path {
        "/v1/chat/completions" | "/chat/completions" => Some("chat"),
        "/v1/completions" | "/completions" | "/completion" => Some("text_completion"),
        "/v1/embeddings" | "/embeddings" | "/embedding" => Some("embeddings"),
        _ => None,
    }
}

/// GenAI convention `{operation} {model}` where known, else HTTP's `{method} {path}`.
pub(crate) fn span_name(request: &RequestRecord) -> String {
    match (operation_name(&request.path), request.model.as_deref()) {
        (Some(op), Some(model)) => format!("{op} {model}"),
        (Some(op), None) => op.to_string(),
        _ => format!("{} {}", request.method, request.path),
    }
}

/// Kernel names can be kilobytes of template arguments: keep the head.
pub(crate) fn kernel_span_name(name: &str) -> String {
    const MAX: usize = 128;
    if name.len() <= MAX {
        return name.to_string();
    }
    let mut end = MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

pub(crate) fn request_attributes(timeline: &RequestTimeline) -> Vec<KeyValue> {
    let r = &timeline.request;
    let mut a = vec![
        KeyValue::new("http.request.method", r.method.clone()),
        KeyValue::new("url.path", r.path.clone()),
        KeyValue::new("inferscope.request_id", r.request_id.clone()),
        KeyValue::new("inferscope.engine", r.engine.clone()),
        KeyValue::new("inferscope.e2e_ms", r.e2e_ms),
        KeyValue::new("inferscope.output_chunks", r.output_chunks as i64),
        KeyValue::new("inferscope.request_bytes", r.request_bytes as i64),
        KeyValue::new("inferscope.response_bytes", r.response_bytes as i64),
        KeyValue::new("inferscope.aborted", r.aborted),
        KeyValue::new("inferscope.ended_by", r.ended_by.as_str()),
        KeyValue::new("inferscope.capture_truncated", r.capture_truncated),
        KeyValue::new("url.scheme", if r.tls { "https" } else { "http" }),
        KeyValue::new(
            "network.protocol.version",
            if r.http2.is_some() { "2" } else { "1.1" },
        ),
    ];
    http2_attributes(r, &mut a);
    if let Some(reason) = &r.incomplete {
        a.push(KeyValue::new("inferscope.incomplete", reason.clone()));
    }
    if let Some(op) = operation_name(&r.path) {
        a.push(KeyValue::new("gen_ai.operation.name", op));
    }
    if !r.engine_unknown.is_empty() {
        a.push(KeyValue::new(
            "inferscope.engine_unknown",
            r.engine_unknown.join(","),
        ));
    }
    optional_attributes(r, &mut a);
    if let Some(stream) = r.stream {
        a.push(KeyValue::new("inferscope.stream", stream));
    }
    if r.admitted_mono_ns.is_some() {
        a.push(KeyValue::new(
            "inferscope.deferred",
            r.deferred_mono_ns.is_some(),
        ));
    }
    if !timeline.unknown.is_empty() {
        a.push(KeyValue::new(
            "inferscope.unknown",
            timeline.unknown.join(","),
        ));
    }
    a
}

/// An HTTP/2 stream's own attributes (gRPC's status among them).
fn http2_attributes(r: &RequestRecord, a: &mut Vec<KeyValue>) {
    if let Some(h2) = &r.http2 {
        a.push(KeyValue::new(
            "inferscope.http2.stream_id",
            i64::from(h2.stream_id),
        ));
        a.push(KeyValue::new("inferscope.http2.stream_end", h2.stream_end));
        if let Some(status) = h2.grpc_status {
            a.push(KeyValue::new("rpc.grpc.status_code", i64::from(status)));
        }
        if let Some(content_type) = &h2.content_type {
            a.push(KeyValue::new(
                "inferscope.http2.content_type",
                content_type.clone(),
            ));
        }
    }
}

/// The attributes a request has only when its record holds them (model, ids, token counts,
/// the scheduler layer's phases).
fn optional_attributes(r: &RequestRecord, a: &mut Vec<KeyValue>) {
    let mut opt_str = |key: &'static str, v: &Option<String>| {
        if let Some(v) = v {
            a.push(KeyValue::new(key, v.clone()));
        }
    };
    opt_str("gen_ai.request.model", &r.model);
    opt_str("gen_ai.response.id", &r.response_id);
    opt_str("inferscope.x_request_id", &r.x_request_id);
    opt_str("inferscope.rpc.request_id", &r.rpc_request_id);
    let mut opt_i = |key: &'static str, v: Option<u64>| {
        if let Some(v) = v {
            a.push(KeyValue::new(key, v as i64));
        }
    };
    opt_i("http.response.status_code", r.status.map(u64::from));
    opt_i("gen_ai.request.max_tokens", r.max_tokens);
    opt_i("gen_ai.usage.input_tokens", r.prompt_tokens);
    opt_i("gen_ai.usage.output_tokens", r.completion_tokens);
    opt_i("inferscope.prompt_bytes", r.prompt_bytes);
    opt_i("inferscope.preemptions", r.preemptions);
    opt_i("gen_ai.usage.cache_read.input_tokens", r.cached_tokens);
    opt_i(
        "inferscope.prefill_tokens_computed",
        r.prefill_tokens_computed(),
    );
    opt_i("inferscope.prefill_steps", r.prefill_steps);
    opt_i("inferscope.decode_steps", r.decode_steps);
    opt_i(
        "inferscope.engine_task_id",
        r.engine_task_id.map(|v| v as u64),
    );
    opt_i("inferscope.engine_slot", r.engine_slot.map(u64::from));
    let mut opt_f = |key: &'static str, v: Option<f64>| {
        if let Some(v) = v {
            a.push(KeyValue::new(key, v));
        }
    };
    opt_f("inferscope.ttft_ms", r.ttft_ms);
    opt_f("inferscope.queue_wait_ms", r.queue_wait_ms);
    opt_f("inferscope.prefill_ms", r.prefill_ms);
    opt_f(
        "inferscope.first_token_handoff_ms",
        r.first_token_handoff_ms,
    );
    opt_f("inferscope.tpot_ms", r.tpot_ms);
    opt_f("inferscope.itl_p99_ms", r.itl_p99_ms);
    opt_f("inferscope.read_delay_ms", r.read_delay_ms);
}

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_genai_conventions() {
        let mut r = RequestRecord {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            model: Some("smollm2".into()),
            ..Default::default()
        };
        assert_eq!(span_name(&r), "chat smollm2");
        r.path = "/health".into();
        r.method = "GET".into();
        assert_eq!(span_name(&r), "GET /health");
        assert_eq!(
            operation_name("/v1/completions?x=1"),
            Some("text_completion")
        );
    }

    #[test]
    fn long_kernel_names_are_cut_on_a_char_boundary() {
        let name = "é".repeat(100);
        let cut = kernel_span_name(&name);
        assert!(cut.len() <= 128 + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
