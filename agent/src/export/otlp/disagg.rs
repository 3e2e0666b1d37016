//! One trace per disaggregated request: the prefill leg's and the decode leg's request spans
//! are children of one `disaggregated_request` span, whose trace and span ids are derived from
//! the legs' shared `disagg.id` (so each leg, exported on its own when it ends, names the same
//! parent without waiting for the other). The decode leg, which ends last and knows both,
//! exports that parent span, from P's arrival to D's end. A `traceparent` the proxy sent wins:
//! the legs are then already in the caller's trace.
use std::cell::Cell;

use inferscope_model::{DisaggInfo, DisaggRole, RequestRecord, disagg::fnv1a};
use opentelemetry::{
    Context, KeyValue,
    trace::{
        Span, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
        Tracer,
    },
};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer};

thread_local! {
    /// Ids the next span built on this thread takes (the SDK 0.33 takes a span's ids only
    /// from its provider's generator).
    static NEXT_IDS: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// The SDK's random ids, except for the one span [`parent_span`] builds.
#[derive(Debug, Default)]
pub(crate) struct DisaggIds(RandomIdGenerator);

impl IdGenerator for DisaggIds {
    fn new_trace_id(&self) -> TraceId {
        match NEXT_IDS.with(Cell::get) {
            Some((trace, _)) => trace,
            None => self.0.new_trace_id(),
        }
    }

    fn new_span_id(&self) -> SpanId {
        match NEXT_IDS.with(Cell::get) {
            Some((_, span)) => span,
            None => self.0.new_span_id(),
        }
    }
}

/// The parent span's ids for one disaggregated request, from its `disagg.id`.
pub(crate) fn ids(disagg_id: &str) -> (TraceId, SpanId) {
    let hi = fnv1a(disagg_id.as_bytes(), 0);
    let lo = fnv1a(b"trace", hi);
    let span = fnv1a(b"span", lo).max(1);
    (
        TraceId::from(((u128::from(hi) << 64) | u128::from(lo)).max(1)),
        SpanId::from(span),
    )
}

/// The leg's parent: the disaggregated request's span, where the record is a leg with an id.
pub(crate) fn parent_context(record: &RequestRecord) -> Option<Context> {
    let id = record.disagg.as_deref()?.id.as_deref()?;
    let (trace, span) = ids(id);
    let sc = SpanContext::new(
        trace,
        span,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    Some(Context::new().with_remote_span_context(sc))
}

/// Exports the disaggregated request's own span with the decode leg that joined its prefill
/// leg; `at` turns a monotonic time into the export's clock. Returns the spans exported.
pub(crate) fn export_parent(
    tracer: &SdkTracer,
    record: &RequestRecord,
    at: &dyn Fn(u64) -> std::time::SystemTime,
) -> u64 {
    let Some(
        info @ DisaggInfo {
            id: Some(id),
            role: Some(DisaggRole::Decode),
            prefill_arrival_mono_ns: Some(start),
            ..
        },
    ) = record.disagg.as_deref()
    else {
        return 0;
    };
    NEXT_IDS.with(|c| c.set(Some(ids(id))));
    let mut span = tracer
        .span_builder("disaggregated_request")
        .with_kind(SpanKind::Server)
        .with_start_time(at(*start))
        .with_attributes(attributes(info))
        .start_with_context(tracer, &Context::new());
    NEXT_IDS.with(|c| c.set(None));
    span.end_with_timestamp(at(record.end_mono_ns.max(*start)));
    1
}

fn attributes(info: &DisaggInfo) -> Vec<KeyValue> {
    let mut out = vec![KeyValue::new(
        "inferscope.disagg.id",
        info.id.clone().unwrap_or_default(),
    )];
    if let Some(scheme) = info.scheme {
        out.push(KeyValue::new("inferscope.disagg.scheme", scheme));
    }
    if let Some(source) = info.kv_transfer_source {
        out.push(KeyValue::new(
            "inferscope.disagg.kv_transfer_source",
            source,
        ));
    }
    for (name, v) in [
        (
            "inferscope.disagg.prefill_queue_wait_ms",
            info.prefill_queue_wait_ms,
        ),
        ("inferscope.disagg.prefill_ms", info.prefill_ms),
        ("inferscope.disagg.handoff_ms", info.handoff_ms),
        (
            "inferscope.disagg.kv_transfer_wait_ms",
            info.kv_transfer_wait_ms,
        ),
        ("inferscope.disagg.kv_transfer_ms", info.kv_transfer_ms),
        (
            "inferscope.disagg.first_decode_step_ms",
            info.first_decode_step_ms,
        ),
        ("inferscope.disagg.ttft_ms", info.ttft_ms),
    ] {
        if let Some(v) = v {
            out.push(KeyValue::new(name, v));
        }
    }
    out
}

/// On a decode leg: when its scheduler queued it and first scheduled it (the wait for the
/// remote KV cache).
pub(crate) fn kv_wait(record: &RequestRecord) -> Option<(u64, u64)> {
    let info = record.disagg.as_deref()?;
    if info.role != Some(DisaggRole::Decode) || info.kv_transfer_wait_ms.is_none() {
        return None;
    }
    Some((record.engine_queued_mono_ns?, record.admitted_mono_ns?))
}

/// The attributes a leg's own request span carries.
pub(crate) fn leg_attributes(record: &RequestRecord) -> Vec<KeyValue> {
    let Some(info) = record.disagg.as_deref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(id) = &info.id {
        out.push(KeyValue::new("inferscope.disagg.id", id.clone()));
    }
    if let Some(role) = info.role {
        out.push(KeyValue::new("inferscope.disagg.role", role.as_str()));
    }
    if let Some(peer) = &info.peer_request_id {
        out.push(KeyValue::new(
            "inferscope.disagg.peer_request_id",
            peer.clone(),
        ));
    }
    if let Some(why) = info.unjoined {
        out.push(KeyValue::new("inferscope.disagg.unjoined", why));
    }
    // The proxy's record: its own hops, around the servers' phases the parent span carries.
    if info.role == Some(DisaggRole::Proxy) {
        if let Some(p) = &info.prefill_request_id {
            out.push(KeyValue::new(
                "inferscope.disagg.prefill_request_id",
                p.clone(),
            ));
        }
        for (name, v) in [
            (
                "inferscope.disagg.proxy_to_prefill_ms",
                info.proxy_to_prefill_ms,
            ),
            ("inferscope.disagg.handoff_ms", info.handoff_ms),
            ("inferscope.disagg.relay_ms", info.relay_ms),
            ("inferscope.disagg.client_ttft_ms", info.client_ttft_ms),
            ("inferscope.disagg.ttft_ms", info.ttft_ms),
        ] {
            if let Some(v) = v {
                out.push(KeyValue::new(name, v));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_legs_name_one_parent() {
        let (t1, s1) = ids("00aa11bb22cc33dd");
        let (t2, s2) = ids("00aa11bb22cc33dd");
        let (t3, _) = ids("00aa11bb22cc33de");
        assert_eq!((t1, s1), (t2, s2));
        assert_ne!(t1, t3);
        assert_ne!(t1, TraceId::INVALID);
        assert_ne!(s1, SpanId::INVALID);
    }
}
