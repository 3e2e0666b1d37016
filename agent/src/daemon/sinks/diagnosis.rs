//! The continuous diagnosis: what it remembers of every request, step, scrape, engine and GPU,
//! when it evaluates, and where its alarms go (metrics, OTLP log events, gRPC subscribers).
use std::sync::{Arc, Mutex};

use inferscope_model::{StepRecord, clock::monotonic_now_ns};
use tracing::{info, warn};

use crate::{
    capture::{DiscoveryChange, gpu::GpuSample},
    diagnose::{
        DeviceSample, EngineConfigSample, EngineSample, RequestSample, StepSample,
        history::History, watch::Watch,
    },
    export::{
        grpc::diagnosis_message,
        hub::{Hub, HubEvent},
        metrics::Metrics,
        otlp::DiagnosisEvents,
    },
    join::{EngineMetricsRecord, RequestTimeline},
    pipeline::Sink,
};

/// The continuous diagnosis: what it keeps, when it runs, where alarms go besides metrics.
pub(crate) struct Diagnosis {
    pub watch: Watch,
    pub history: Arc<Mutex<History>>,
    pub events: Option<DiagnosisEvents>,
    /// The cause last reported while the alarm is raised.
    pub reported_cause: Option<&'static str>,
}

pub(crate) struct DiagnosisSink {
    pub diagnosis: Diagnosis,
    pub metrics: Arc<Metrics>,
    pub hub: Arc<Hub>,
}

impl DiagnosisSink {
    fn remember(&self, add: impl FnOnce(&mut History)) {
        if let Ok(mut history) = self.diagnosis.history.lock() {
            add(&mut history);
        }
    }

    /// Runs the continuous diagnosis when due, and reports alarms.
    fn watch(&mut self, now: u64) {
        let d = &mut self.diagnosis;
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
}

impl Sink for DiagnosisSink {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        let sample = RequestSample::from(&timeline.request);
        self.remember(|h| h.push_request(sample));
    }

    fn on_step(&mut self, step: &StepRecord) {
        self.remember(|h| h.push_step(StepSample::from(step)));
    }

    fn on_engine_metrics(&mut self, record: &EngineMetricsRecord) {
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
            let sample = EngineConfigSample {
                mono_ns: monotonic_now_ns(),
                pid: p.tgid,
                engine: p.engine.to_owned(),
                settings: crate::engines::scheduler_config_of(p.tgid, p.engine),
            };
            self.remember(|h| h.push_config(sample));
        }
    }

    fn on_gpu(&mut self, samples: &[GpuSample]) {
        self.remember(|h| {
            for g in samples {
                h.push_device(DeviceSample {
                    mono_ns: g.mono_ns,
                    device: g.uuid.clone(),
                    outlier: !g.outliers.is_empty(),
                    outliers: g.outliers.clone(),
                });
            }
        });
    }

    fn on_tick(&mut self) {
        self.watch(monotonic_now_ns());
    }

    fn finish(&mut self) {
        if let Some(events) = &self.diagnosis.events {
            events.shutdown();
        }
    }
}
