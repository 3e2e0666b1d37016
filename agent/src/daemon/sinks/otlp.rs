//! OTLP traces: the requests the sampler keeps, one span tree each.
use std::sync::{Arc, atomic::Ordering};

use inferscope_model::Counter;

use crate::{
    capture::gpu::GpuSample,
    daemon::Sampler,
    export::otlp::{ExportCounters, TraceExporter},
    join::RequestTimeline,
    pipeline::Sink,
};

/// Without a trace exporter, only its counters (all 0) are exported.
pub(crate) struct OtlpSink {
    pub traces: Option<TraceExporter>,
    pub sampler: Sampler,
    pub export_counters: Arc<ExportCounters>,
    /// Requests the sampler left out.
    pub sampled_out: u64,
}

impl Sink for OtlpSink {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        let Some(traces) = self.traces.as_mut() else {
            return;
        };
        if self.sampler.keep(&timeline.request) {
            traces.export(timeline);
        } else {
            self.sampled_out += 1;
        }
    }

    fn on_gpu(&mut self, samples: &[GpuSample]) {
        if let Some(traces) = self.traces.as_mut() {
            traces.set_gpu_uuids(samples.iter().map(|g| g.uuid.clone()).collect());
        }
    }

    fn on_process_gone(&mut self, tgid: u32) {
        if let Some(traces) = self.traces.as_mut() {
            traces.forget_process(tgid);
        }
    }

    fn counters(&self) -> Vec<(Counter, u64)> {
        let c = &self.export_counters;
        vec![
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
        ]
    }

    fn finish(&mut self) {
        if let Some(traces) = self.traces.as_mut() {
            traces.shutdown();
        }
    }
}
