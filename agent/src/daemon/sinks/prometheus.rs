//! The Prometheus endpoint's metrics: requests by outcome, steps, engine metrics, GPUs, and
//! every counter of the agent.
use std::sync::Arc;

use inferscope_model::{Counter, StepRecord};

use crate::{
    capture::gpu::GpuSample,
    export::metrics::Metrics,
    join::{EngineMetricsRecord, RequestTimeline},
    pipeline::Sink,
};

pub(crate) struct PrometheusSink(pub Arc<Metrics>);

impl Sink for PrometheusSink {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        self.0.record_request(timeline);
    }

    fn on_step(&mut self, step: &StepRecord) {
        self.0.record_step(step);
    }

    fn on_engine_metrics(&mut self, record: &EngineMetricsRecord) {
        self.0.record_engine_metrics(record);
    }

    fn on_gpu(&mut self, samples: &[GpuSample]) {
        for sample in samples {
            self.0.record_gpu(sample);
        }
    }

    fn on_process_gone(&mut self, tgid: u32) {
        self.0.forget_process(tgid);
    }

    fn on_counters(&mut self, counters: &[(Counter, u64)]) {
        self.0.set_agent_counters(counters);
    }
}
