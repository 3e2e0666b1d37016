//! The daemon's pipeline observer: hands closed request timelines to every exporter.
use std::sync::{Arc, Mutex, atomic::Ordering};

use inferscope_model::{Counter, PerProcess, StepRecord, clock::monotonic_now_ns};
use tracing::{info, warn};

use super::{gpu::GpuInputs, handover::Gate, sampler::Sampler};
use crate::{
    capture::DiscoveryChange,
    diagnose::{
        DeviceSample, EngineConfigSample, EngineSample, RequestSample, StepSample,
        history::History, watch::Watch,
    },
    export::{
        grpc::diagnosis_message,
        hub::{Hub, HubEvent},
        jsonl::JsonlWriter,
        metrics::Metrics,
        otlp::{DiagnosisEvents, ExportCounters, TraceExporter},
    },
    join::{EngineMetricsRecord, KernelRecord, RequestTimeline},
    pipeline::Sink,
};

/// A successor agent waiting for the previous one to exit (daemon::handover): it polls the
/// previous agent's socket and, once nobody listens there, takes the sockets over.
pub(crate) struct Standby {
    /// The previous agent's sockets (the gRPC API's, the shim's): it has exited once nobody
    /// listens on any of them.
    pub sockets: Vec<std::path::PathBuf>,
    /// The shim socket to listen on after the takeover.
    pub shim_socket: Option<std::path::PathBuf>,
    /// Binds what else the previous agent held (the gRPC API); logs its own failures.
    pub take_over: Box<dyn FnOnce() + Send>,
    pub last_poll: Option<std::time::Instant>,
}

/// The continuous diagnosis: what it keeps, when it runs, where alarms go besides metrics.
pub(crate) struct Diagnosis {
    pub watch: Watch,
    pub history: Arc<Mutex<History>>,
    pub events: Option<DiagnosisEvents>,
    /// The cause last reported while the alarm is raised.
    pub reported_cause: Option<&'static str>,
}

/// Where closed timelines go.
pub(crate) struct Outputs {
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    pub traces: Option<TraceExporter>,
    pub export_counters: Arc<ExportCounters>,
    pub sampler: Sampler,
    pub records: Option<JsonlWriter>,
}

pub(crate) struct DaemonObserver {
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    pub traces: Option<TraceExporter>,
    pub export_counters: Arc<ExportCounters>,
    pub sampler: Sampler,
    pub records: Option<JsonlWriter>,
    pub sampled_out: u64,
    gpu: GpuInputs,
    diagnosis: Option<Diagnosis>,
    /// The last full list handed to the exporters (pipeline's and the daemon's own counters).
    counters: Vec<(Counter, u64)>,
    /// Which requests are this agent's when another agent shares the node (a surge roll).
    gate: Gate,
    standby: Option<Standby>,
    health: Option<Arc<crate::export::health::Health>>,
}

impl DaemonObserver {
    pub(crate) fn new(outputs: Outputs, gpu: GpuInputs, diagnosis: Option<Diagnosis>) -> Self {
        Self {
            hub: outputs.hub,
            metrics: outputs.metrics,
            traces: outputs.traces,
            export_counters: outputs.export_counters,
            sampler: outputs.sampler,
            records: outputs.records,
            sampled_out: 0,
            gpu,
            diagnosis,
            counters: Vec::new(),
            gate: Gate::sole(),
            standby: None,
            health: None,
        }
    }

    /// Runs beside another agent: see daemon::handover.
    pub(crate) fn with_handover(mut self, gate: Gate, standby: Option<Standby>) -> Self {
        self.gate = gate;
        self.standby = standby;
        self
    }

    /// The capture loop's passes, for the kubelet's probes.
    pub(crate) fn with_health(mut self, health: Arc<crate::export::health::Health>) -> Self {
        self.health = Some(health);
        self
    }

    pub(crate) fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The successor's poll: once the previous agent's socket is free, take over.
    fn poll_standby(&mut self) {
        let Some(standby) = self.standby.as_mut() else {
            return;
        };
        if standby
            .last_poll
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(200))
        {
            return;
        }
        standby.last_poll = Some(std::time::Instant::now());
        if standby
            .sockets
            .iter()
            .any(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
        {
            return;
        }
        let Some(standby) = self.standby.take() else {
            return;
        };
        let cut = self.gate.took_over();
        info!(
            cut_mono_ns = cut,
            "the previous agent has exited: taking over (recording requests read from the cut on)"
        );
        if let Some(path) = &standby.shim_socket
            && let Err(e) = self.gpu.listen(path)
        {
            warn!("GPU kernel records are off after the takeover: {e}");
        }
        (standby.take_over)();
    }

    fn remember(&self, add: impl FnOnce(&mut History)) {
        if let Some(d) = &self.diagnosis
            && let Ok(mut history) = d.history.lock()
        {
            add(&mut history);
        }
    }

    /// Runs the continuous diagnosis when due, and reports alarms.
    fn watch(&mut self, now: u64) {
        let Some(d) = self.diagnosis.as_mut() else {
            return;
        };
        // Runs on every pass of the loop: touch the shared history only when an evaluation is due.
        if !d.watch.due(now) {
            return;
        }
        let verdict = {
            let Ok(mut history) = d.history.lock() else {
                return;
            };
            history.expire(now);
            d.watch.tick(&history, now)
        };
        let Some(v) = verdict else {
            return;
        };
        let phase = serde_json::to_value(v.diagnosis.dominant_phase)
            .ok()
            .and_then(|p| p.as_str().map(str::to_string))
            .unwrap_or_default();
        self.metrics
            .set_diagnosis(v.diagnosis.cause.as_str(), &phase, v.active);
        // Report when the alarm is raised or cleared, and when its cause changes while raised
        // (the first evaluation may see only part of an incident's requests finished).
        let cause = v.diagnosis.cause.as_str();
        let cause_changed = v.active && d.reported_cause != Some(cause);
        d.reported_cause = v.active.then_some(cause);
        if !v.changed && !cause_changed {
            return;
        }
        let message = diagnosis_message(&v.diagnosis);
        if v.active {
            warn!(
                cause = v.diagnosis.cause.as_str(),
                phase = phase.as_str(),
                "P99 TTFT regressed: {}",
                v.diagnosis.summary
            );
        } else {
            info!(
                "P99 TTFT is back within {}× its baseline",
                d.watch.config.ratio
            );
        }
        if let Some(events) = &d.events {
            events.emit(&v.diagnosis, v.active, &message.report);
        }
        self.hub.publish(HubEvent::Diagnosis(Arc::new(message)));
    }

    fn publish(&mut self, timeline: RequestTimeline) {
        if self.diagnosis.is_some() {
            let sample = RequestSample::from(&timeline.request);
            self.remember(|h| h.push_request(sample));
        }
        self.metrics.record_request(&timeline);
        if let Some(traces) = self.traces.as_mut() {
            if self.sampler.keep(&timeline.request) {
                traces.export(&timeline);
            } else {
                self.sampled_out += 1;
            }
        }
        if let Some(w) = self.records.as_mut() {
            w.write_or_report(&timeline.request, "a record");
        }
        self.hub.publish_request(timeline);
    }

    /// Every counter, as last exported (see [`Observer::on_counters`]).
    pub(crate) fn counters(&self) -> &[(Counter, u64)] {
        &self.counters
    }

    pub(crate) fn finish(&mut self) {
        if let Some(traces) = self.traces.as_mut() {
            traces.shutdown();
        }
        if let Some(events) = self.diagnosis.as_ref().and_then(|d| d.events.as_ref()) {
            events.shutdown();
        }
    }
}

/// An engine process the pipeline forgot: its gauges and its tracer go.
impl PerProcess for DaemonObserver {
    fn process_gone(&mut self, tgid: u32) {
        self.metrics.forget_process(tgid);
        if let Some(traces) = self.traces.as_mut() {
            traces.forget_process(tgid);
        }
    }
}

impl Sink for DaemonObserver {
    fn on_timeline(&mut self, timeline: RequestTimeline) {
        if self.gate.admits(&timeline.request) {
            self.publish(timeline);
        }
    }

    fn on_step(&mut self, step: &StepRecord) {
        if !self.gate.admits_step(step) {
            return;
        }
        self.metrics.record_step(step);
        self.remember(|h| h.push_step(StepSample::from(step)));
        if self.hub.has_subscribers() {
            self.hub.publish(HubEvent::Step(Arc::new(step.clone())));
        }
    }

    fn on_kernel(&mut self, kernel: &KernelRecord) {
        if self.hub.has_subscribers() {
            self.hub.publish(HubEvent::Kernel(Arc::new(kernel.clone())));
        }
    }

    fn on_engine_metrics(&mut self, record: EngineMetricsRecord) {
        self.metrics.record_engine_metrics(&record);
        self.remember(|h| {
            h.push_engine(EngineSample {
                mono_ns: record.mono_ns,
                kv_cache_usage: record.kv_cache_usage,
                requests_waiting: record.requests_waiting,
                requests_running: record.requests_running,
                preemptions_total: record.preemptions_total,
            })
        });
    }

    fn on_discovery(&mut self, change: &DiscoveryChange) {
        for p in &change.added {
            info!(pid = p.tgid, engine = p.engine, ports = ?p.ports, "attached");
            let sample = EngineConfigSample {
                mono_ns: monotonic_now_ns(),
                pid: p.tgid,
                engine: p.engine.to_owned(),
                settings: crate::engines::scheduler_config_of(p.tgid, p.engine),
            };
            self.remember(|h| h.push_config(sample));
        }
    }

    fn on_process_gone(&mut self, tgid: u32) {
        PerProcess::process_gone(self, tgid);
    }

    fn on_tick(&mut self) {
        if let Some(health) = &self.health {
            health.pass();
        }
        self.poll_standby();
        let now = monotonic_now_ns();
        let subscribers = self.hub.has_subscribers();
        if let Some(samples) = self.gpu.samples_due() {
            if let Some(traces) = self.traces.as_mut() {
                traces.set_gpu_uuids(samples.iter().map(|g| g.uuid.clone()).collect());
            }
            self.remember(|h| {
                for g in &samples {
                    h.push_device(DeviceSample {
                        mono_ns: g.mono_ns,
                        device: g.uuid.clone(),
                        outlier: !g.outliers.is_empty(),
                        outliers: g.outliers.clone(),
                    });
                }
            });
            for g in &samples {
                self.metrics.record_gpu(g);
                if subscribers {
                    self.hub
                        .publish(HubEvent::Gpu(Arc::new(crate::export::proto_conv::gpu(g))));
                }
            }
        }
        self.watch(now);
    }

    fn on_counters(&mut self, mut counters: Vec<(Counter, u64)>) {
        counters.extend(self.gpu.counters());
        counters.extend(self.gate.counters());
        let c = &self.export_counters;
        counters.extend([
            (
                Counter::OtlpSpansSubmitted,
                c.submitted.load(Ordering::Relaxed),
            ),
            (
                Counter::OtlpSpansExported,
                c.exported.load(Ordering::Relaxed),
            ),
            (Counter::OtlpSpansFailed, c.failed.load(Ordering::Relaxed)),
            (Counter::OtlpExportCalls, c.calls.load(Ordering::Relaxed)),
            (Counter::OtlpSpansPendingOrDropped, c.unaccounted()),
            (Counter::OtlpRequestsSampledOut, self.sampled_out),
        ]);
        if let Some(w) = &self.records {
            counters.push((Counter::RecordsWriteFailed, w.failed));
        }
        counters.extend([
            (
                Counter::GrpcSubscriberRecordsLagged,
                self.hub.subscriber_lagged.load(Ordering::Relaxed),
            ),
            (
                Counter::GrpcSubscribers,
                self.hub.subscribers.load(Ordering::Relaxed),
            ),
        ]);
        self.gate.adjust_losses(&mut counters);
        self.metrics.set_agent_counters(&counters);
        self.counters = counters;
    }
}
