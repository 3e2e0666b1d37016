//! Request timelines as OTLP traces: one SERVER span per request with `queue`, `prefill` and
//! `decode` children, engine steps as span events on the phase they belong to, and (behind a
//! switch) one span per GPU kernel. A `traceparent` the caller sent makes the request span a
//! child of the caller's span, so a gateway's trace continues into the engine.
use std::{
    collections::HashMap,
    sync::{Arc, atomic::Ordering},
    time::{Duration, SystemTime},
};

use inferscope_model::{RequestRecord, StepRecord};
use opentelemetry::{
    Context, KeyValue,
    propagation::TextMapPropagator,
    trace::{Span, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _},
};
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider},
};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use super::{
    OtlpConfig, OtlpError,
    counting::{CountingExporter, ExportCounters},
};
use crate::{export::names, identity::ProcessIdentity, join::timeline::RequestTimeline};

/// Engine processes with a tracer at once (each has its own resource and batch queue).
const MAX_PROCESSES: usize = 64;

pub(crate) struct TraceExporter {
    config: OtlpConfig,
    runtime: tokio::runtime::Handle,
    /// Per engine process: its provider and tracer, and the identity its resource names.
    providers: FxHashMap<u32, (SdkTracerProvider, SdkTracer, Option<ProcessIdentity>)>,
    counters: Arc<ExportCounters>,
    host: String,
    /// The host's GPUs (NVML), named on every engine resource created after they are known.
    gpu_uuids: Vec<String>,
    propagator: TraceContextPropagator,
}

impl TraceExporter {
    pub(crate) fn new(
        config: OtlpConfig,
        runtime: tokio::runtime::Handle,
        counters: Arc<ExportCounters>,
    ) -> Self {
        Self {
            config,
            runtime,
            providers: FxHashMap::default(),
            counters,
            host: names::host_name(),
            gpu_uuids: Vec::new(),
            propagator: TraceContextPropagator::new(),
        }
    }

    /// Each engine process is its own OTLP resource (service, process, host, GPUs), so backends
    /// show its spans under the engine rather than under the agent.
    fn tracer_for(
        &mut self,
        pid: u32,
        engine: &str,
        identity: Option<&ProcessIdentity>,
    ) -> Result<&SdkTracer, OtlpError> {
        // The pod became known after the first requests (the API answered late): a resource
        // is fixed per provider, so the process gets a new one that names its pod.
        if self
            .providers
            .get(&pid)
            .is_some_and(|(_, _, known)| known.as_ref() != identity)
        {
            self.forget_process(pid);
        }
        if !self.providers.contains_key(&pid) {
            if self.providers.len() >= MAX_PROCESSES {
                return Err(OtlpError::TooManyProcesses(MAX_PROCESSES));
            }
            let _runtime = self.runtime.enter();
            let exporter = self.config.span_exporter()?;
            let exporter = CountingExporter::new(exporter, self.counters.clone());
            let batch = BatchConfigBuilder::default()
                .with_max_queue_size(self.config.queue_spans)
                .with_scheduled_delay(Duration::from_millis(500))
                .build();
            let processor = BatchSpanProcessor::builder(exporter)
                .with_batch_config(batch)
                .build();
            let resource = Resource::builder()
                .with_service_name(
                    self.config
                        .service_name
                        .clone()
                        .unwrap_or_else(|| engine.to_string()),
                )
                .with_attributes(process_attributes(
                    pid,
                    engine,
                    &self.host,
                    &self.gpu_uuids,
                    identity,
                ))
                .build();
            let provider = SdkTracerProvider::builder()
                .with_span_processor(processor)
                .with_resource(resource)
                .with_max_events_per_span(self.config.max_events_per_span)
                .with_id_generator(super::disagg::DisaggIds::default())
                .build();
            let tracer = provider.tracer("inferscope");
            info!(
                pid,
                engine, "exporting this process's requests as OTLP traces"
            );
            self.providers
                .insert(pid, (provider, tracer, identity.cloned()));
        }
        self.providers
            .get(&pid)
            .map(|(_, tracer, _)| tracer)
            .ok_or(OtlpError::TooManyProcesses(MAX_PROCESSES))
    }

    pub(crate) fn set_gpu_uuids(&mut self, uuids: Vec<String>) {
        self.gpu_uuids = uuids;
    }

    /// The engine process exited: flush and drop its tracer off the pipeline thread.
    pub(crate) fn forget_process(&mut self, pid: u32) {
        if let Some((provider, _, _)) = self.providers.remove(&pid) {
            std::thread::spawn(move || {
                let _ = provider.shutdown();
            });
        }
    }

    pub(crate) fn shutdown(&mut self) {
        for (_, (provider, _, _)) in self.providers.drain() {
            if let Err(e) = provider.shutdown() {
                warn!("flushing OTLP spans at exit failed: {e}");
            }
        }
    }

    pub(crate) fn export(&mut self, timeline: &RequestTimeline) {
        let request = &timeline.request;
        let parent = match (&request.traceparent, super::disagg::parent_context(request)) {
            // A disaggregated request's legs share one parent span, unless the proxy sent a
            // trace of its own to both.
            (None, Some(disagg)) => disagg,
            _ => self.parent_context(request.traceparent.as_deref()),
        };
        let tracer = match self.tracer_for(request.pid, &request.engine, request.identity.as_ref())
        {
            Ok(tracer) => tracer.clone(),
            Err(e) => {
                warn!("cannot export spans for pid {}: {e}", request.pid);
                return;
            }
        };
        let offset = request
            .arrival_unix_ns
            .saturating_sub(request.arrival_mono_ns);
        let at = |mono: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(mono + offset);

        let mut spans = 0u64;
        if request.traceparent.is_none() {
            spans += super::disagg::export_parent(&tracer, request, &at);
        }
        let mut attributes = names::request_attributes(timeline);
        attributes.extend(super::disagg::leg_attributes(request));
        let root = tracer
            .span_builder(names::span_name(request))
            .with_kind(SpanKind::Server)
            .with_start_time(at(request.arrival_mono_ns))
            .with_attributes(attributes)
            .start_with_context(&tracer, &parent);
        spans += 1;
        let root_cx = parent.with_span(root);
        if let Some(why) = error_status(request) {
            root_cx.span().set_status(Status::error(why));
        }
        for (name, start, stop) in phases(request) {
            spans += self.phase_span(&tracer, &root_cx, timeline, name, (start, stop), &at);
        }
        let end = request.end_mono_ns;
        root_cx
            .span()
            .end_with_timestamp(at(end.max(request.arrival_mono_ns)));
        self.counters.submitted.fetch_add(spans, Ordering::Relaxed);
    }

    /// One phase's span under the request's (`span` from `start` to `stop`): the queue's
    /// deferral events; prefill's and decode's steps, GPU figures and (with kernel spans) the
    /// kernels. How many spans it made.
    fn phase_span(
        &self,
        tracer: &SdkTracer,
        root_cx: &Context,
        timeline: &RequestTimeline,
        name: &'static str,
        (start, stop): (u64, u64),
        at: &dyn Fn(u64) -> SystemTime,
    ) -> u64 {
        let request = &timeline.request;
        let mut span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(at(start))
            .start_with_context(tracer, root_cx);
        let mut spans = 1;
        if name == "queue" {
            // Where the engine parked the request for want of a slot, and took it back.
            for (event, ts) in [
                ("deferred", request.deferred_mono_ns),
                ("requeued", request.requeued_mono_ns),
            ] {
                if let Some(ts) = ts {
                    span.add_event_with_timestamp(event, at(ts), Vec::new());
                }
            }
        }
        let phase = match name {
            "prefill" => "prefill",
            "decode" => "decode",
            _ => {
                span.end_with_timestamp(at(stop.max(start)));
                return spans;
            }
        };
        for step in steps_in_phase(&timeline.steps, &request.request_id, phase) {
            span.add_event_with_timestamp("step", at(step.start_mono_ns), step_attributes(step));
        }
        let gpu = if phase == "prefill" {
            &timeline.prefill_gpu
        } else {
            &timeline.decode_gpu
        };
        if let Some(gpu) = gpu {
            span.set_attribute(KeyValue::new("inferscope.gpu.kernels", gpu.kernels as i64));
            span.set_attribute(KeyValue::new("inferscope.gpu.busy_ms", gpu.busy_ms));
            span.set_attribute(KeyValue::new(
                "inferscope.gpu.tensor_core_share",
                gpu.tensor_core_share,
            ));
        }
        if self.config.kernel_spans {
            let phase_cx = root_cx.with_span(span);
            spans += self.kernel_spans(tracer, &phase_cx, timeline, phase, at);
            phase_cx.span().end_with_timestamp(at(stop.max(start)));
        } else {
            span.end_with_timestamp(at(stop.max(start)));
        }
        spans
    }

    fn kernel_spans(
        &self,
        tracer: &SdkTracer,
        phase_cx: &Context,
        timeline: &RequestTimeline,
        phase: &str,
        at: &dyn Fn(u64) -> SystemTime,
    ) -> u64 {
        let mut n = 0;
        for step in steps_in_phase(&timeline.steps, &timeline.request.request_id, phase) {
            for k in timeline.kernels_of(step) {
                let mut span = tracer
                    .span_builder(names::kernel_span_name(&k.name))
                    .with_kind(SpanKind::Internal)
                    .with_start_time(at(k.start_mono_ns))
                    .with_attributes(vec![
                        KeyValue::new("inferscope.gpu.device", k.device_id as i64),
                        KeyValue::new("inferscope.gpu.stream", k.stream_id as i64),
                        KeyValue::new("inferscope.kernel.tensor_core", k.tensor_core),
                        KeyValue::new("inferscope.kernel.graph_id", k.graph_id as i64),
                        KeyValue::new(
                            "inferscope.kernel.grid",
                            format!("{}x{}x{}", k.grid[0], k.grid[1], k.grid[2]),
                        ),
                        KeyValue::new(
                            "inferscope.kernel.block",
                            format!("{}x{}x{}", k.block[0], k.block[1], k.block[2]),
                        ),
                    ])
                    .start_with_context(tracer, phase_cx);
                span.end_with_timestamp(at(k.end_mono_ns.max(k.start_mono_ns)));
                n += 1;
            }
        }
        n
    }

    fn parent_context(&self, traceparent: Option<&str>) -> Context {
        let Some(traceparent) = traceparent else {
            return Context::new();
        };
        let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
        // An invalid header yields an empty context: the request span starts a new trace.
        self.propagator
            .extract_with_context(&Context::new(), &carrier)
    }
}

/// Why the request's span is an error, if it is one.
fn error_status(request: &RequestRecord) -> Option<&'static str> {
    let server_closed = request.ended_by == crate::correlate::EndedBy::Server;
    if request.aborted {
        Some("client aborted")
    } else if server_closed {
        Some("server closed the connection before the response ended")
    } else if request.status.is_some_and(|s| s >= 500) {
        Some("server error")
    } else {
        None
    }
}

/// The request's phases as spans under its own: queue, prefill and decode where the scheduler
/// layer saw its admission (prefill ends at the engine's own first token when a hook saw it;
/// the socket write follows within decode), else time to first token and decode; a
/// disaggregated decode leg's wait for the prefill server's KV cache, inside its queue.
fn phases(request: &RequestRecord) -> Vec<(&'static str, u64, u64)> {
    let end = request.end_mono_ns;
    let first_token = request
        .engine_first_token_mono_ns
        .or(request.first_token_mono_ns);
    let mut phases: Vec<(&'static str, u64, u64)> = Vec::new();
    match (request.admitted_mono_ns, first_token) {
        (Some(admitted), Some(first)) => {
            phases.push(("queue", request.arrival_mono_ns, admitted));
            phases.push(("prefill", admitted, first));
            phases.push(("decode", first, end));
        }
        (Some(admitted), None) => {
            phases.push(("queue", request.arrival_mono_ns, admitted));
            phases.push(("prefill", admitted, end));
        }
        // Without the scheduler layer the split is unknown: one span says so.
        (None, Some(first)) => {
            phases.push(("time_to_first_token", request.arrival_mono_ns, first));
            phases.push(("decode", first, end));
        }
        (None, None) => {}
    }
    if let Some((queued, admitted)) = super::disagg::kv_wait(request) {
        phases.push(("kv_transfer_wait", queued, admitted));
    }
    phases
}

fn steps_in_phase<'a>(
    steps: &'a [StepRecord],
    request_id: &'a str,
    phase: &'a str,
) -> impl Iterator<Item = &'a StepRecord> + 'a {
    steps.iter().filter(move |s| {
        s.requests
            .iter()
            .any(|m| m.request_id == request_id && m.phase == phase)
    })
}

fn step_attributes(step: &StepRecord) -> Vec<KeyValue> {
    let mut attrs = vec![
        KeyValue::new("inferscope.step.duration_ms", step.duration_ms),
        KeyValue::new("inferscope.step.batch_requests", step.requests.len() as i64),
    ];
    if let Some(tokens) = step.batch_tokens {
        attrs.push(KeyValue::new("inferscope.step.batch_tokens", tokens as i64));
    }
    attrs
}

fn process_attributes(
    pid: u32,
    engine: &str,
    host: &str,
    gpus: &[String],
    identity: Option<&ProcessIdentity>,
) -> Vec<KeyValue> {
    let mut attrs = vec![
        KeyValue::new("host.name", host.to_string()),
        KeyValue::new("process.pid", pid as i64),
        KeyValue::new("inferscope.engine", engine.to_string()),
    ];
    if let Some(identity) = identity {
        attrs.extend(
            identity
                .attributes()
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v)),
        );
    }
    if !gpus.is_empty() {
        attrs.push(KeyValue::new("inferscope.host.gpu_uuids", gpus.join(",")));
    }
    if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        attrs.push(KeyValue::new(
            "process.executable.name",
            comm.trim().to_string(),
        ));
    }
    attrs
}
