//! Agent records → the gRPC API's protobuf messages.
use inferscope_model::{StepRecord, clock::ns_to_ms};
use inferscope_proto::v1::{agent as pb, shim};

use crate::{
    capture::gpu::GpuSample,
    join::timeline::{GpuPhase, KernelRecord, RequestTimeline, union_ns},
};

pub(crate) fn kernel(k: &KernelRecord) -> shim::Kernel {
    shim::Kernel {
        name: k.name.clone(),
        device_id: k.device_id,
        context_id: k.context_id,
        stream_id: k.stream_id,
        correlation_id: k.correlation_id,
        launch_tid: k.launch_tid,
        launch_mono_ns: k.launch_mono_ns,
        start_mono_ns: k.start_mono_ns,
        end_mono_ns: k.end_mono_ns,
        grid_x: k.grid[0],
        grid_y: k.grid[1],
        grid_z: k.grid[2],
        block_x: k.block[0],
        block_y: k.block[1],
        block_z: k.block[2],
        static_shared_bytes: k.static_shared_bytes,
        dynamic_shared_bytes: k.dynamic_shared_bytes,
        graph_id: k.graph_id,
        graph_node_id: k.graph_node_id,
        tensor_core: k.tensor_core,
        launch_api: k.launch_api.clone(),
    }
}

pub(crate) fn gpu(g: &GpuSample) -> pb::GpuSample {
    pb::GpuSample {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        mono_ns: g.mono_ns,
        gpu_util_pct: g.gpu_util_pct.map(f64::from),
        mem_util_pct: g.mem_util_pct.map(f64::from),
        memory_used_bytes: g.mem_used_bytes,
        memory_total_bytes: g.mem_total_bytes,
        sm_clock_mhz: g.sm_clock_mhz,
        power_w: g.power_w,
        throttle_reasons: g.throttle_reasons.clone(),
        tensor_util_pct: g.tensor_util_pct,
        dram_bw_util_pct: g.dram_bw_util_pct,
        sm_occupancy_pct: g.sm_occupancy_pct,
        outliers: g.outliers.clone(),
    }
}

pub(crate) fn request(t: &RequestTimeline) -> pb::Request {
    let r = &t.request;
    let identity = |field: fn(&inferscope_model::ProcessIdentity) -> &Option<String>| {
        r.identity.as_ref().and_then(|i| field(i).clone())
    };
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
        first_token_handoff_ms: r.first_token_handoff_ms,
        cached_tokens: r.cached_tokens,
        engine_slot: r.engine_slot,
        deferred_mono_ns: r.deferred_mono_ns,
        requeued_mono_ns: r.requeued_mono_ns,
        engine_first_token_mono_ns: r.engine_first_token_mono_ns,
        engine_finished_mono_ns: r.engine_finished_mono_ns,
        container_id: identity(|i| &i.container_id),
        k8s_pod_name: identity(|i| &i.k8s_pod_name),
        k8s_namespace_name: identity(|i| &i.k8s_namespace_name),
        k8s_pod_uid: identity(|i| &i.k8s_pod_uid),
        k8s_container_name: identity(|i| &i.k8s_container_name),
        k8s_node_name: identity(|i| &i.k8s_node_name),
        k8s_deployment_name: identity(|i| &i.k8s_deployment_name),
        ended_by: r.ended_by.as_str().to_owned(),
        connection_preexisting: r.connection_preexisting,
        tls: r.tls,
        rpc_request_id: r.rpc_request_id.clone(),
        http2: r.http2.as_deref().map(|h| pb::Http2Stream {
            stream_id: h.stream_id,
            content_type: h.content_type.clone(),
            grpc_status: h.grpc_status,
            request_messages: h.request_messages,
            request_message_bytes: h.request_message_bytes,
            response_messages: h.response_messages,
            response_message_bytes: h.response_message_bytes,
            stream_end: h.stream_end.to_owned(),
            error_code: h.error_code,
        }),
        request_unparsed: r.request_unparsed,
        incomplete: r.incomplete.clone(),
        engine_unknown: r.engine_unknown.iter().map(|s| s.to_string()).collect(),
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

pub(crate) fn step(s: &StepRecord) -> pb::Step {
    pb::Step {
        pid: s.pid,
        engine: s.engine.clone(),
        tid: s.tid,
        start_mono_ns: s.start_mono_ns,
        end_mono_ns: s.end_mono_ns,
        batch_tokens: s.batch_tokens,
        sequences: s.sequences,
        prefilling: s.prefilling,
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
        launches: s.gpu_launches.as_ref().map(step_launches),
    }
}

fn step_launches(l: &inferscope_model::StepLaunches) -> pb::StepLaunches {
    let counts = |list: &[inferscope_model::NamedCount]| {
        list.iter()
            .map(|c| pb::NamedCount {
                name: c.name.clone(),
                launches: c.launches,
            })
            .collect()
    };
    pb::StepLaunches {
        source: l.source.to_owned(),
        kernel_launches: l.kernel_launches,
        graph_launches: l.graph_launches,
        named_launches: l.named_launches,
        before_first_launch_ms: l.before_first_launch_ms,
        before_first_launch_share: l.before_first_launch_share,
        max_launch_gap_us: l.max_launch_gap_us,
        mean_launch_gap_us: l.mean_launch_gap_us,
        after_last_launch_ms: l.after_last_launch_ms,
        kernels: counts(&l.kernels),
        graphs: counts(&l.graphs),
        sampled: l.sampled,
        sources: l.sources.as_ref().map(|s| pb::LaunchSources {
            both: s.both,
            uprobe_only: s.uprobe_only,
            shim_only: s.shim_only,
            named_by_shim: s.named_by_shim,
        }),
        graph_kernels: l
            .graph_kernels
            .iter()
            .map(|g| pb::GraphKernels {
                graph: g.graph.clone(),
                nodes: g.nodes,
                kernels: counts(&g.kernels),
            })
            .collect(),
    }
}

/// One request with its steps and kernels, each step annotated with its own GPU work.
pub(crate) fn timeline(t: &RequestTimeline) -> pb::RequestTimeline {
    let steps = t
        .steps
        .iter()
        .map(|s| {
            let mut p = step(s);
            let mut intervals: Vec<(u64, u64)> = Vec::new();
            for k in t.kernels_of(s) {
                p.kernels += 1;
                intervals.push((k.start_mono_ns, k.end_mono_ns));
            }
            p.gpu_busy_ms = busy_ms(&mut intervals);
            p
        })
        .collect();
    pb::RequestTimeline {
        request: Some(request(t)),
        steps,
        kernels: t.kernels.iter().map(kernel).collect(),
    }
}

fn busy_ms(intervals: &mut [(u64, u64)]) -> f64 {
    ns_to_ms(union_ns(intervals))
}
