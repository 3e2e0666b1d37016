//! The daemon's sink: the fan-out of what the pipeline hands on to every exporter (each one
//! [`Sink`], in `sinks/`), behind the gate a surge roll shares the node by, with the daemon's
//! own time-driven work (the kubelet's health, the successor's takeover, GPU samples).
use std::sync::Arc;

use inferscope_model::{Counter, LaunchRecord, StepRecord};
use tracing::{info, warn};

use super::{
    gpu::GpuInputs,
    handover::Gate,
    sampler::Sampler,
    sinks::{Diagnosis, DiagnosisSink, GrpcSink, JsonlSink, OtlpSink, PrometheusSink},
};
use crate::{
    capture::{DiscoveryChange, gpu::GpuSample},
    export::{
        hub::Hub,
        jsonl::JsonlWriter,
        metrics::Metrics,
        otlp::{ExportCounters, TraceExporter},
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

/// Where closed timelines go.
pub(crate) struct Outputs {
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    pub traces: Option<TraceExporter>,
    pub export_counters: Arc<ExportCounters>,
    pub sampler: Sampler,
    pub records: Option<JsonlWriter>,
}

impl Outputs {
    /// One sink per output, in the order each request reaches them (the continuous
    /// diagnosis's history first, the gRPC hub, which keeps the timeline, last).
    fn sinks(self, diagnosis: Option<Diagnosis>) -> Vec<Box<dyn Sink>> {
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        if let Some(diagnosis) = diagnosis {
            sinks.push(Box::new(DiagnosisSink {
                diagnosis,
                metrics: Arc::clone(&self.metrics),
                hub: Arc::clone(&self.hub),
            }));
        }
        sinks.push(Box::new(PrometheusSink(self.metrics)));
        // Its counters are exported with or without a trace exporter.
        sinks.push(Box::new(OtlpSink {
            traces: self.traces,
            sampler: self.sampler,
            export_counters: self.export_counters,
            sampled_out: 0,
        }));
        if let Some(writer) = self.records {
            sinks.push(Box::new(JsonlSink(writer)));
        }
        sinks.push(Box::new(GrpcSink(self.hub)));
        sinks
    }
}

pub(crate) struct FanOut {
    sinks: Vec<Box<dyn Sink>>,
    gpu: GpuInputs,
    /// The last full list handed to the sinks (pipeline's, the daemon's and the sinks' own).
    counters: Vec<(Counter, u64)>,
    /// Which requests are this agent's when another agent shares the node (a surge roll).
    gate: Gate,
    standby: Option<Standby>,
    health: Option<Arc<crate::export::health::Health>>,
}

impl FanOut {
    pub(crate) fn new(outputs: Outputs, gpu: GpuInputs, diagnosis: Option<Diagnosis>) -> Self {
        Self {
            sinks: outputs.sinks(diagnosis),
            gpu,
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

    /// Every counter, as last exported (see [`Sink::on_counters`]).
    pub(crate) fn counters(&self) -> &[(Counter, u64)] {
        &self.counters
    }

    /// Records `--records` could not write.
    pub(crate) fn records_failed(&self) -> u64 {
        self.sinks
            .iter()
            .flat_map(|s| s.counters())
            .filter(|(c, _)| *c == Counter::RecordsWriteFailed)
            .map(|(_, v)| v)
            .sum()
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

    fn each(&mut self, mut hand: impl FnMut(&mut dyn Sink)) {
        for sink in &mut self.sinks {
            hand(sink.as_mut());
        }
    }
}

impl Sink for FanOut {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        if self.gate.admits(&timeline.request) {
            self.each(|s| s.on_timeline(timeline));
        }
    }

    fn on_step(&mut self, step: &StepRecord) {
        if self.gate.admits_step(step) {
            self.each(|s| s.on_step(step));
        }
    }

    fn on_kernel(&mut self, kernel: &KernelRecord) {
        self.each(|s| s.on_kernel(kernel));
    }

    fn on_launch(&mut self, launch: &LaunchRecord) {
        self.each(|s| s.on_launch(launch));
    }

    fn on_engine_metrics(&mut self, record: &EngineMetricsRecord) {
        self.each(|s| s.on_engine_metrics(record));
    }

    fn on_gpu(&mut self, samples: &[GpuSample]) {
        self.each(|s| s.on_gpu(samples));
    }

    fn on_discovery(&mut self, change: &DiscoveryChange) {
        for p in &change.added {
            info!(pid = p.tgid, engine = p.engine, ports = ?p.ports, "attached");
        }
        self.each(|s| s.on_discovery(change));
    }

    /// An engine process the pipeline forgot: its gauges and its tracer go.
    fn on_process_gone(&mut self, tgid: u32) {
        self.each(|s| s.on_process_gone(tgid));
    }

    fn on_tick(&mut self) {
        if let Some(health) = &self.health {
            health.pass();
        }
        self.poll_standby();
        if let Some(samples) = self.gpu.samples_due() {
            self.on_gpu(&samples);
        }
        self.each(|s| s.on_tick());
    }

    /// The pipeline's counters, with the daemon's and every sink's, handed to every sink.
    fn on_counters(&mut self, pipeline: &[(Counter, u64)]) {
        let mut all = pipeline.to_vec();
        all.extend(self.gpu.counters());
        all.extend(self.gate.counters());
        for sink in &self.sinks {
            all.extend(sink.counters());
        }
        self.gate.adjust_losses(&mut all);
        self.each(|s| s.on_counters(&all));
        self.counters = all;
    }

    fn finish(&mut self) {
        self.each(|s| s.finish());
    }
}
