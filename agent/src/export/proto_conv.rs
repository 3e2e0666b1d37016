//! Agent records → the gRPC API's protobuf messages.
use inferscope_proto::v1::agent as pb;

use crate::correlate::{
    StepRecord,
    timeline::{GpuPhase, RequestTimeline, union_ns},
};

pub fn request(t: &RequestTimeline) -> pb::Request {
    let r = &t.request;
    pb::Request {
        request_id: r.request_id.clone(),
        response_id: r.response_id.clone().unwrap_or_default(),
        x_request_id: r.x_request_id.clone().unwrap_or_default(),
        traceparent: r.traceparent.clone().unwrap_or_default(),
        pid: r.pid,
        engine: r.engine.clone(),
        method: r.method.clone(),
        path: r.path.clone(),
        status: r.status.map(u32::from).unwrap_or_default(),
        model: r.model.clone().unwrap_or_default(),
        stream: r.stream.unwrap_or_default(),
        arrival_mono_ns: r.arrival_mono_ns,
        arrival_unix_ns: r.arrival_unix_ns,
        admitted_mono_ns: r.admitted_mono_ns.unwrap_or_default(),
        first_token_mono_ns: r.first_token_mono_ns.unwrap_or_default(),
        end_mono_ns: r.end_mono_ns,
        ttft_ms: r.ttft_ms,
        queue_wait_ms: r.queue_wait_ms,
        prefill_ms: r.prefill_ms,
        tpot_ms: r.tpot_ms,
        e2e_ms: r.e2e_ms,
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.completion_tokens,
        preemptions: r.preemptions,
        output_chunks: r.output_chunks,
        aborted: r.aborted,
        capture_truncated: r.capture_truncated,
        prefill_gpu: t.prefill_gpu.as_ref().map(gpu_phase),
        decode_gpu: t.decode_gpu.as_ref().map(gpu_phase),
        unknown: t.unknown.iter().map(|s| s.to_string()).collect(),
        prompt_bytes: r.prompt_bytes,
        engine_task_id: r.engine_task_id.and_then(|v| u64::try_from(v).ok()),
        record_json: serde_json::to_string(r).unwrap_or_default(),
    }
}

fn gpu_phase(g: &GpuPhase) -> pb::GpuPhase {
    pb::GpuPhase {
        kernels: g.kernels,
        busy_ms: g.busy_ms,
        tensor_core_share: g.tensor_core_share,
        devices: g.devices.clone(),
    }
}

pub fn step(s: &StepRecord) -> pb::Step {
    pb::Step {
        pid: s.pid,
        engine: s.engine.clone(),
        tid: s.tid,
        start_mono_ns: s.start_mono_ns,
        end_mono_ns: s.end_mono_ns,
        batch_tokens: s.batch_tokens,
        members: s
            .requests
            .iter()
            .map(|m| pb::StepMember {
                request_id: m.request_id.clone(),
                phase: m.phase.to_string(),
            })
            .collect(),
        kernels: 0,
        gpu_busy_ms: 0.0,
    }
}

/// One request with its steps and kernels, each step annotated with its own GPU work.
pub fn timeline(t: &RequestTimeline) -> pb::RequestTimeline {
    let steps = t
        .steps
        .iter()
        .map(|s| {
            let mut p = step(s);
            let mut intervals: Vec<(u64, u64)> = Vec::new();
            for k in t.kernels.iter().filter(|k| {
                k.pid == s.pid
                    && k.kernel.launch_mono_ns >= s.start_mono_ns
                    && k.kernel.launch_mono_ns <= s.end_mono_ns
            }) {
                p.kernels += 1;
                intervals.push((k.kernel.start_mono_ns, k.kernel.end_mono_ns));
            }
            p.gpu_busy_ms = busy_ms(&mut intervals);
            p
        })
        .collect();
    pb::RequestTimeline {
        request: Some(request(t)),
        steps,
        kernels: t.kernels.iter().map(|k| k.kernel.clone()).collect(),
    }
}

fn busy_ms(intervals: &mut [(u64, u64)]) -> f64 {
    union_ns(intervals) as f64 / 1e6
}
