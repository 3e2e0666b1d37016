//! The agent's metrics, recorded once and exposed twice: in Prometheus text at `/metrics`
//! (prometheus-client) and over OTLP (the OpenTelemetry SDK), under the GenAI semantic-convention
//! names where they exist (`gen_ai.server.*`) and `inferscope.*` for the rest.
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, atomic::AtomicU64},
};

use inferscope_model::{Counter as AgentCounter, CounterKind, EndedBy, StepRecord};
use opentelemetry::{
    KeyValue,
    metrics::{Counter as OtelCounter, Histogram as OtelHistogram, Meter},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::{
    capture::gpu::GpuSample,
    join::{EngineMetricsRecord, RequestTimeline},
};

/// 1 ms to 60 s (issue 46's bar for fleet P99s read from Prometheus), finer where interactive
/// serving's P99s sit: bounds at most x1.5 apart from 100 ms to 60 s, x2.5 below.
const TTFT_BUCKETS: [f64; 28] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1.0,
    1.5, 2.0, 2.5, 3.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];
/// 1 ms to 1 s (and 2.5 s for stalls), bounds at most x1.5 apart from 5 ms up: decode steps of
/// small and large models alike.
const TPOT_BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
const TOKEN_BUCKETS: [f64; 12] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
];

/// Distinct `model` label values per engine; the model name comes from request bodies, so an
/// unbounded set would let clients grow the agent's memory. Further values become "other".
const MAX_MODELS_PER_ENGINE: usize = 32;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    engine: String,
    model: String,
    #[prometheus(flatten)]
    pod: PodLabels,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    engine: String,
    model: String,
    outcome: String,
    #[prometheus(flatten)]
    pod: PodLabels,
}

/// `namespace`, `pod`, `container` (Kubernetes' own label names) where the engine runs in a
/// pod the API described; no labels at all otherwise. Pods on one node bound their values.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
struct PodLabels {
    namespace: Option<String>,
    pod: Option<String>,
    container: Option<String>,
}

impl PodLabels {
    fn of(identity: Option<&inferscope_model::ProcessIdentity>) -> Self {
        identity.map_or_else(PodLabels::default, |i| PodLabels {
            namespace: i.k8s_namespace_name.clone(),
            pod: i.k8s_pod_name.clone(),
            container: i.k8s_container_name.clone(),
        })
    }

    fn otel(&self) -> Vec<KeyValue> {
        [
            ("k8s.namespace.name", &self.namespace),
            ("k8s.pod.name", &self.pod),
            ("k8s.container.name", &self.container),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| KeyValue::new(k, v.clone())))
        .collect()
    }
}

impl prometheus_client::encoding::EncodeLabelSet for PodLabels {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        let labels: Vec<(&str, &str)> = [
            ("namespace", &self.namespace),
            ("pod", &self.pod),
            ("container", &self.container),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect();
        labels.encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineLabels {
    engine: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabels {
    counter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    uuid: String,
    metric: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabels {
    engine: String,
    pid: String,
}

/// The newest engine-reported gauges per process, for the OTLP observable instruments.
type EngineSnapshot = Arc<Mutex<BTreeMap<(String, u32), [Option<f64>; 3]>>>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DiagnosisLabels {
    cause: String,
    dominant_phase: String,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn ttft_histogram() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}
fn tpot_histogram() -> Histogram {
    Histogram::new(TPOT_BUCKETS)
}
fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}
fn token_histogram() -> Histogram {
    Histogram::new(TOKEN_BUCKETS)
}

struct OtelInstruments {
    ttft: OtelHistogram<f64>,
    tpot: OtelHistogram<f64>,
    duration: OtelHistogram<f64>,
    queue_wait: OtelHistogram<f64>,
    prefill: OtelHistogram<f64>,
    prompt_tokens: OtelHistogram<u64>,
    prompt_tokens_cached: OtelHistogram<u64>,
    prefill_tokens_computed: OtelHistogram<u64>,
    step_duration: OtelHistogram<f64>,
    requests: OtelCounter<u64>,
    admitted: OtelCounter<u64>,
    preemptions: OtelCounter<u64>,
}

impl OtelInstruments {
    /// One finished request into the OTLP instruments (the Prometheus ones' twins).
    fn record_request(
        &self,
        r: &inferscope_model::RequestRecord,
        outcome: &'static str,
        attrs: &[KeyValue],
    ) {
        let secs = |ms: f64| ms / 1000.0;
        self.duration.record(secs(r.e2e_ms), attrs);
        if let Some(ttft) = r.ttft_ms {
            self.ttft.record(secs(ttft), attrs);
        }
        if let Some(tpot) = r.tpot_ms {
            self.tpot.record(secs(tpot), attrs);
        }
        if let Some(q) = r.queue_wait_ms {
            self.queue_wait.record(secs(q), attrs);
        }
        if let Some(p) = r.prefill_ms {
            self.prefill.record(secs(p), attrs);
        }
        if let Some(tokens) = r.prompt_tokens {
            self.prompt_tokens.record(tokens, attrs);
        }
        if let Some(tokens) = r.cached_tokens {
            self.prompt_tokens_cached.record(tokens, attrs);
        }
        if let Some(tokens) = r.prefill_tokens_computed() {
            self.prefill_tokens_computed.record(tokens, attrs);
        }
        let mut outcome_attrs = attrs.to_vec();
        outcome_attrs.push(KeyValue::new("inferscope.outcome", outcome));
        self.requests.add(1, &outcome_attrs);
        if r.admitted_mono_ns.is_some() {
            self.admitted.add(1, &attrs[..1]);
        }
        if let Some(p) = r.preemptions.filter(|p| *p > 0) {
            self.preemptions.add(p, &attrs[..1]);
        }
    }
}

pub(crate) struct Metrics {
    registry: Registry,
    ttft: HistFamily<RequestLabels>,
    tpot: HistFamily<RequestLabels>,
    itl_p99: HistFamily<RequestLabels>,
    duration: HistFamily<RequestLabels>,
    queue_wait: HistFamily<RequestLabels>,
    prefill: HistFamily<RequestLabels>,
    prompt_tokens: HistFamily<RequestLabels>,
    prompt_tokens_cached: HistFamily<RequestLabels>,
    prefill_tokens_computed: HistFamily<RequestLabels>,
    step_duration: HistFamily<EngineLabels>,
    requests: Family<OutcomeLabels, Counter>,
    admitted: Family<EngineLabels, Counter>,
    preemptions: Family<EngineLabels, Counter>,
    agent_events: Family<CounterLabels, Counter>,
    /// The loss counters of `agent_events` again, on their own (what the dashboard and the
    /// "losses rising" alert watch).
    agent_losses: Family<CounterLabels, Counter>,
    agent_state: Family<StateLabels, Gauge>,
    agent_seen: Mutex<BTreeMap<AgentCounter, u64>>,
    gpu: Family<GpuLabels, Gauge<f64, AtomicU64>>,
    kv_cache_usage: Family<ProcessLabels, Gauge<f64, AtomicU64>>,
    requests_running: Family<ProcessLabels, Gauge<f64, AtomicU64>>,
    requests_waiting: Family<ProcessLabels, Gauge<f64, AtomicU64>>,
    kv_transfers: Family<ProcessLabels, Gauge<f64, AtomicU64>>,
    kv_transfer_seconds: Family<ProcessLabels, Gauge<f64, AtomicU64>>,
    engine_snapshot: EngineSnapshot,
    /// (engine, pid) of every process with a gauge above, to remove them when it goes.
    process_series: Mutex<BTreeSet<(String, u32)>>,
    diagnosis: Family<DiagnosisLabels, Gauge>,
    /// The agent process's own CPU time and resident memory, read at each scrape.
    process: ProcessGauges,
    models: Mutex<BTreeMap<String, Vec<String>>>,
    otel: Option<OtelInstruments>,
    /// Snapshot of the agent's own counters for the OTLP observable instrument.
    otel_agent_snapshot: Arc<Mutex<Vec<(AgentCounter, u64)>>>,
}

impl Metrics {
    /// `meter`: record into OTLP too (when an OTLP endpoint is configured).
    pub(crate) fn new(meter: Option<Meter>) -> Self {
        let mut registry = Registry::default();
        let ttft: HistFamily<RequestLabels> = Family::new_with_constructor(ttft_histogram);
        let tpot: HistFamily<RequestLabels> = Family::new_with_constructor(tpot_histogram);
        let itl_p99: HistFamily<RequestLabels> = Family::new_with_constructor(tpot_histogram);
        let duration: HistFamily<RequestLabels> = Family::new_with_constructor(duration_histogram);
        let queue_wait: HistFamily<RequestLabels> = Family::new_with_constructor(ttft_histogram);
        let prefill: HistFamily<RequestLabels> = Family::new_with_constructor(ttft_histogram);
        let prompt_tokens: HistFamily<RequestLabels> =
            Family::new_with_constructor(token_histogram);
        let prompt_tokens_cached: HistFamily<RequestLabels> =
            Family::new_with_constructor(token_histogram);
        let prefill_tokens_computed: HistFamily<RequestLabels> =
            Family::new_with_constructor(token_histogram);
        let step_duration: HistFamily<EngineLabels> = Family::new_with_constructor(tpot_histogram);
        registry.register_with_unit(
            "gen_ai_server_time_to_first_token",
            "Time to first token: request arrival to the first generated token on the wire",
            Unit::Seconds,
            ttft.clone(),
        );
        registry.register_with_unit(
            "gen_ai_server_time_per_output_token",
            "Time per output token after the first (decode), per request",
            Unit::Seconds,
            tpot.clone(),
        );
        registry.register_with_unit(
            "inferscope_itl_p99",
            "Inter-token latency: each request's 99th percentile gap between output chunks",
            Unit::Seconds,
            itl_p99.clone(),
        );
        registry.register_with_unit(
            "gen_ai_server_request_duration",
            "Request arrival to the end of the response",
            Unit::Seconds,
            duration.clone(),
        );
        registry.register_with_unit(
            "inferscope_queue_wait",
            "Request arrival to admission by the engine's scheduler",
            Unit::Seconds,
            queue_wait.clone(),
        );
        registry.register_with_unit(
            "inferscope_prefill",
            "Admission to the first token",
            Unit::Seconds,
            prefill.clone(),
        );
        registry.register(
            "inferscope_prompt_tokens",
            "Prompt tokens per request, where the engine reports them",
            prompt_tokens.clone(),
        );
        registry.register(
            "inferscope_prompt_tokens_cached",
            "Prompt tokens per request the engine served from its prefix cache, where it says",
            prompt_tokens_cached.clone(),
        );
        registry.register(
            "inferscope_prefill_tokens_computed",
            "Prompt tokens per request the engine computed in prefill (prompt minus cached)",
            prefill_tokens_computed.clone(),
        );
        registry.register_with_unit(
            "inferscope_engine_step_duration",
            "Duration of one engine step (a forward pass over the batch)",
            Unit::Seconds,
            step_duration.clone(),
        );
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "inferscope_requests",
            "Finished requests by outcome (ok, error, aborted by the client, server_closed before the response ended, incomplete: followed only in part); counted when each one ends. Answered requests with no record at all: inferscope_agent_events_total{counter=\"requests_lost\"}",
            requests.clone(),
        );
        let admitted = Family::<EngineLabels, Counter>::default();
        registry.register(
            "inferscope_requests_admitted",
            "Requests whose admission by the scheduler was observed; compare its rate with inferscope_requests_total",
            admitted.clone(),
        );
        let preemptions = Family::<EngineLabels, Counter>::default();
        registry.register(
            "inferscope_preemptions",
            "Times requests were preempted (evicted from KV memory) by the engine",
            preemptions.clone(),
        );
        let agent_events = Family::<CounterLabels, Counter>::default();
        registry.register(
            "inferscope_agent_events",
            "The agent's own counters: captured records, drops, truncations, parse failures, exporter outcomes",
            agent_events.clone(),
        );
        let agent_losses = Family::<CounterLabels, Counter>::default();
        registry.register(
            "inferscope_agent_losses",
            "The agent's loss counters (inferscope_agent_events_total of every counter the docs' losses table names): records, requests and fields dropped, cut or not parsed",
            agent_losses.clone(),
        );
        let agent_state = Family::<StateLabels, Gauge>::default();
        registry.register(
            "inferscope_agent_state",
            "The agent's current levels: open connections, gRPC subscribers, OTLP spans not yet exported (queued, or dropped when the queue was full)",
            agent_state.clone(),
        );
        let gpu = Family::<GpuLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "inferscope_gpu",
            "Per-GPU NVML and GPM samples, one series per metric",
            gpu.clone(),
        );
        let kv_cache_usage = Family::<ProcessLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "inferscope_engine_kv_cache_usage_ratio",
            "KV cache in use (0..1) as the engine's own /metrics reports it",
            kv_cache_usage.clone(),
        );
        let requests_running = Family::<ProcessLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "inferscope_engine_requests_running",
            "Requests the engine reports as running (its own /metrics)",
            requests_running.clone(),
        );
        let requests_waiting = Family::<ProcessLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "inferscope_engine_requests_waiting",
            "Requests the engine reports as waiting for admission (its own /metrics)",
            requests_waiting.clone(),
        );
        let kv_transfers = Family::<ProcessLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "inferscope_engine_kv_transfers",
            "KV-cache transfers the engine's KV connector finished since the engine started (its own /metrics, e.g. vllm:nixl_xfer_time_seconds_count)",
            kv_transfers.clone(),
        );
        let kv_transfer_seconds = Family::<ProcessLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "inferscope_engine_kv_transfer_seconds",
            "Seconds those transfers took by the connector's own measure (e.g. vllm:nixl_xfer_time_seconds_sum)",
            kv_transfer_seconds.clone(),
        );
        let diagnosis = Family::<DiagnosisLabels, Gauge>::default();
        registry.register(
            "inferscope_diagnosis_info",
            "1 while the continuous diagnosis sees a TTFT regression, labelled with its cause",
            diagnosis.clone(),
        );
        let process = ProcessGauges::default();
        registry.register_with_unit(
            "process_cpu",
            "CPU time (user and system) the agent process has used",
            Unit::Seconds,
            process.cpu_seconds.clone(),
        );
        registry.register_with_unit(
            "process_resident_memory",
            "Resident memory of the agent process",
            Unit::Bytes,
            process.resident_bytes.clone(),
        );
        let otel_agent_snapshot: Arc<Mutex<Vec<(AgentCounter, u64)>>> = Arc::default();
        let engine_snapshot = EngineSnapshot::default();
        let otel = meter.map(|m| {
            otel_engine_gauges(&m, engine_snapshot.clone());
            otel_instruments(&m, otel_agent_snapshot.clone())
        });
        Self {
            registry,
            ttft,
            tpot,
            itl_p99,
            duration,
            queue_wait,
            prefill,
            prompt_tokens,
            prompt_tokens_cached,
            prefill_tokens_computed,
            step_duration,
            requests,
            admitted,
            preemptions,
            agent_events,
            agent_losses,
            agent_state,
            agent_seen: Mutex::default(),
            gpu,
            kv_cache_usage,
            requests_running,
            requests_waiting,
            kv_transfers,
            kv_transfer_seconds,
            engine_snapshot,
            process_series: Mutex::default(),
            diagnosis,
            process,
            models: Mutex::default(),
            otel,
            otel_agent_snapshot,
        }
    }

    fn model_label(&self, engine: &str, model: Option<&str>) -> String {
        let model = model.unwrap_or("unknown");
        let Ok(mut models) = self.models.lock() else {
            return "other".into();
        };
        let seen = models.entry(engine.to_string()).or_default();
        if seen.iter().any(|m| m == model) {
            return model.to_string();
        }
        if seen.len() < MAX_MODELS_PER_ENGINE {
            seen.push(model.to_string());
            return model.to_string();
        }
        "other".into()
    }

    pub(crate) fn record_request(&self, timeline: &RequestTimeline) {
        let r = &timeline.request;
        let labels = RequestLabels {
            engine: r.engine.clone(),
            model: self.model_label(&r.engine, r.model.as_deref()),
            pod: PodLabels::of(r.identity.as_ref()),
        };
        let outcome = if r.aborted {
            "aborted"
        } else if r.incomplete.is_some() {
            "incomplete"
        } else if r.ended_by == EndedBy::Server {
            "server_closed"
        } else if r.status.is_some_and(|s| s >= 400) {
            "error"
        } else {
            "ok"
        };
        self.requests
            .get_or_create(&OutcomeLabels {
                engine: labels.engine.clone(),
                model: labels.model.clone(),
                outcome: outcome.into(),
                pod: labels.pod.clone(),
            })
            .inc();
        let engine = EngineLabels {
            engine: r.engine.clone(),
        };
        let secs = |ms: f64| ms / 1000.0;
        self.duration.get_or_create(&labels).observe(secs(r.e2e_ms));
        if let Some(ttft) = r.ttft_ms {
            self.ttft.get_or_create(&labels).observe(secs(ttft));
        }
        if let Some(tpot) = r.tpot_ms {
            self.tpot.get_or_create(&labels).observe(secs(tpot));
        }
        if let Some(itl) = r.itl_p99_ms {
            self.itl_p99.get_or_create(&labels).observe(secs(itl));
        }
        if let Some(q) = r.queue_wait_ms {
            self.queue_wait.get_or_create(&labels).observe(secs(q));
        }
        if let Some(p) = r.prefill_ms {
            self.prefill.get_or_create(&labels).observe(secs(p));
        }
        if let Some(tokens) = r.prompt_tokens {
            self.prompt_tokens
                .get_or_create(&labels)
                .observe(tokens as f64);
        }
        if let Some(tokens) = r.cached_tokens {
            self.prompt_tokens_cached
                .get_or_create(&labels)
                .observe(tokens as f64);
        }
        if let Some(tokens) = r.prefill_tokens_computed() {
            self.prefill_tokens_computed
                .get_or_create(&labels)
                .observe(tokens as f64);
        }
        if r.admitted_mono_ns.is_some() {
            self.admitted.get_or_create(&engine).inc();
        }
        // Created at 0 with the engine's first request, so a rate is 0, not absent, until the
        // first preemption.
        let preemptions = self.preemptions.get_or_create(&engine);
        if let Some(p) = r.preemptions.filter(|p| *p > 0) {
            preemptions.inc_by(p);
        }
        drop(preemptions);
        if let Some(o) = &self.otel {
            let mut attrs = vec![
                KeyValue::new("inferscope.engine", labels.engine.clone()),
                KeyValue::new("gen_ai.request.model", labels.model.clone()),
            ];
            attrs.extend(labels.pod.otel());
            o.record_request(r, outcome, &attrs);
        }
    }

    pub(crate) fn record_step(&self, step: &StepRecord) {
        // Engines whose steps carry KV use (vLLM IPC) update the gauge per step.
        if let Some(kv) = step.kv_cache_usage {
            self.note_process(&step.engine, step.pid);
            self.kv_cache_usage
                .get_or_create(&ProcessLabels {
                    engine: step.engine.clone(),
                    pid: step.pid.to_string(),
                })
                .set(kv);
        }
        // A step whose start is unknown (vLLM after an idle gap, SGLang's untimed batches)
        // has no duration: its zero would only skew the histogram.
        if step.start_from == Some("unknown") {
            return;
        }
        let secs = step.duration_ms / 1000.0;
        self.step_duration
            .get_or_create(&EngineLabels {
                engine: step.engine.clone(),
            })
            .observe(secs);
        if let Some(o) = &self.otel {
            o.step_duration.record(
                secs,
                &[KeyValue::new("inferscope.engine", step.engine.clone())],
            );
        }
    }

    /// The agent's counters are cumulative totals kept elsewhere; export their increments.
    /// Gauges ([`CounterKind::Gauge`]) are set to their value.
    pub(crate) fn set_agent_counters(&self, counters: &[(AgentCounter, u64)]) {
        if let Ok(mut seen) = self.agent_seen.lock() {
            for &(counter, value) in counters {
                if counter.kind() == CounterKind::Gauge {
                    self.agent_state
                        .get_or_create(&StateLabels {
                            name: counter.name().to_owned(),
                        })
                        .set(i64::try_from(value).unwrap_or(i64::MAX));
                    continue;
                }
                let before = seen.entry(counter).or_insert(0);
                // Every counter has a series from the first report on, at 0 until it moves:
                // an alert on its increase then sees the first loss too.
                let labels = CounterLabels {
                    counter: counter.name().to_owned(),
                };
                let loss = (counter.kind() == CounterKind::Loss)
                    .then(|| self.agent_losses.get_or_create(&labels));
                let series = self.agent_events.get_or_create(&labels);
                if value > *before {
                    series.inc_by(value - *before);
                    if let Some(loss) = &loss {
                        loss.inc_by(value - *before);
                    }
                }
                *before = (*before).max(value);
            }
        }
        if let Ok(mut snapshot) = self.otel_agent_snapshot.lock() {
            *snapshot = counters
                .iter()
                .filter(|(counter, _)| counter.kind() != CounterKind::Gauge)
                .copied()
                .collect();
        }
    }

    /// Gauges the engine reports about itself (scraped from its /metrics).
    pub(crate) fn record_engine_metrics(&self, m: &EngineMetricsRecord) {
        self.note_process(&m.engine, m.pid);
        let labels = ProcessLabels {
            engine: m.engine.clone(),
            pid: m.pid.to_string(),
        };
        for (family, value) in [
            (&self.kv_cache_usage, m.kv_cache_usage),
            (&self.requests_running, m.requests_running),
            (&self.requests_waiting, m.requests_waiting),
            (&self.kv_transfers, m.kv_transfers_total),
            (&self.kv_transfer_seconds, m.kv_transfer_seconds_total),
        ] {
            if let Some(v) = value {
                family.get_or_create(&labels).set(v);
            }
        }
        if let Ok(mut snapshot) = self.engine_snapshot.lock() {
            snapshot.insert(
                (m.engine.clone(), m.pid),
                [m.kv_cache_usage, m.requests_running, m.requests_waiting],
            );
        }
    }

    /// Process `pid` of `engine` has gauges ([`Self::forget_process`] removes them).
    fn note_process(&self, engine: &str, pid: u32) {
        if let Ok(mut series) = self.process_series.lock()
            && !series.contains(&(engine.to_string(), pid))
        {
            series.insert((engine.to_string(), pid));
        }
    }

    /// The engine process is gone: its gauges go, under every engine name it had.
    pub(crate) fn forget_process(&self, pid: u32) {
        let engines: Vec<String> = match self.process_series.lock() {
            Ok(mut series) => {
                let gone: Vec<(String, u32)> =
                    series.iter().filter(|(_, p)| *p == pid).cloned().collect();
                for key in &gone {
                    series.remove(key);
                }
                gone.into_iter().map(|(engine, _)| engine).collect()
            }
            Err(_) => Vec::new(),
        };
        for engine in engines {
            if let Ok(mut snapshot) = self.engine_snapshot.lock() {
                snapshot.remove(&(engine.clone(), pid));
            }
            let labels = ProcessLabels {
                engine,
                pid: pid.to_string(),
            };
            for family in [
                &self.kv_cache_usage,
                &self.requests_running,
                &self.requests_waiting,
                &self.kv_transfers,
                &self.kv_transfer_seconds,
            ] {
                family.remove(&labels);
            }
        }
    }

    /// One NVML sample: every metric it carries as a series of `inferscope_gpu`.
    pub(crate) fn record_gpu(&self, g: &GpuSample) {
        let index = g.index.to_string();
        let values = [
            ("gpu_util_pct", g.gpu_util_pct.map(f64::from)),
            ("mem_util_pct", g.mem_util_pct.map(f64::from)),
            ("memory_used_bytes", g.mem_used_bytes.map(|v| v as f64)),
            ("memory_total_bytes", g.mem_total_bytes.map(|v| v as f64)),
            ("sm_clock_mhz", g.sm_clock_mhz.map(f64::from)),
            ("power_w", g.power_w),
            ("tensor_util_pct", g.tensor_util_pct),
            ("dram_bw_util_pct", g.dram_bw_util_pct),
            ("sm_occupancy_pct", g.sm_occupancy_pct),
            (
                "throttle_reasons_active",
                Some(g.throttle_reasons.len() as f64),
            ),
            (
                "outlier",
                Some(if g.outliers.is_empty() { 0.0 } else { 1.0 }),
            ),
        ];
        for (metric, value) in values {
            if let Some(v) = value {
                self.set_gpu(&index, &g.uuid, metric, v);
            }
        }
    }

    pub(crate) fn set_gpu(&self, gpu: &str, uuid: &str, metric: &str, value: f64) {
        self.gpu
            .get_or_create(&GpuLabels {
                gpu: gpu.into(),
                uuid: uuid.into(),
                metric: metric.into(),
            })
            .set(value);
    }

    pub(crate) fn set_diagnosis(&self, cause: &str, dominant_phase: &str, active: bool) {
        self.diagnosis.clear();
        if active {
            self.diagnosis
                .get_or_create(&DiagnosisLabels {
                    cause: cause.into(),
                    dominant_phase: dominant_phase.into(),
                })
                .set(1);
        }
    }

    /// Prometheus text exposition (OpenMetrics flavour, as prometheus-client writes it).
    pub(crate) fn encode(&self) -> Result<String, std::fmt::Error> {
        self.process.update();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// `process_cpu_seconds_total` and `process_resident_memory_bytes`, as Prometheus' client
/// libraries name them, for the agent's own cost.
#[derive(Default)]
struct ProcessGauges {
    cpu_seconds: Counter<f64, AtomicU64>,
    resident_bytes: Gauge<f64, AtomicU64>,
    /// CPU seconds already added to the counter.
    cpu_reported: Mutex<f64>,
}

impl ProcessGauges {
    fn update(&self) {
        let Some((cpu, rss)) = own_usage() else {
            return;
        };
        self.resident_bytes.set(rss);
        if let Ok(mut reported) = self.cpu_reported.lock()
            && cpu > *reported
        {
            self.cpu_seconds.inc_by(cpu - *reported);
            *reported = cpu;
        }
    }
}

/// (CPU seconds, resident bytes) of this process, from /proc/self/stat.
fn own_usage() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // comm may hold spaces: the fields resume after its closing parenthesis (field 3 on).
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 2..)?
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    let (utime, stime, rss_pages) = (ticks(11)?, ticks(12)?, ticks(21)?);
    // SAFETY: sysconf has no preconditions.
    let (hz, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (hz > 0 && page > 0).then(|| ((utime + stime) / hz as f64, rss_pages * page as f64))
}

fn otel_engine_gauges(meter: &Meter, snapshot: EngineSnapshot) {
    let names = [
        "inferscope.engine.kv_cache.usage",
        "inferscope.engine.requests.running",
        "inferscope.engine.requests.waiting",
    ];
    for (i, name) in names.into_iter().enumerate() {
        let snapshot = snapshot.clone();
        let _gauge = meter
            .f64_observable_gauge(name)
            .with_callback(move |observer| {
                if let Ok(snapshot) = snapshot.lock() {
                    for ((engine, pid), values) in snapshot.iter() {
                        if let Some(v) = values[i] {
                            observer.observe(
                                v,
                                &[
                                    KeyValue::new("inferscope.engine", engine.clone()),
                                    KeyValue::new("process.pid", i64::from(*pid)),
                                ],
                            );
                        }
                    }
                }
            })
            .build();
    }
}

fn otel_instruments(meter: &Meter, agent: Arc<Mutex<Vec<(AgentCounter, u64)>>>) -> OtelInstruments {
    let hist = |name: &'static str, desc: &'static str, buckets: &[f64]| {
        meter
            .f64_histogram(name)
            .with_unit("s")
            .with_description(desc)
            .with_boundaries(buckets.to_vec())
            .build()
    };
    let _agent_events = meter
        .u64_observable_counter("inferscope.agent.events")
        .with_description(
            "The agent's own counters: captured records, drops, truncations, parse failures",
        )
        .with_callback(move |observer| {
            if let Ok(snapshot) = agent.lock() {
                for (counter, value) in snapshot.iter() {
                    observer.observe(
                        *value,
                        &[KeyValue::new("inferscope.counter", counter.name())],
                    );
                }
            }
        })
        .build();
    OtelInstruments {
        ttft: hist(
            "gen_ai.server.time_to_first_token",
            "Time to first token",
            &TTFT_BUCKETS,
        ),
        tpot: hist(
            "gen_ai.server.time_per_output_token",
            "Time per output token after the first",
            &TPOT_BUCKETS,
        ),
        duration: hist(
            "gen_ai.server.request.duration",
            "Request duration",
            &DURATION_BUCKETS,
        ),
        queue_wait: hist(
            "inferscope.queue_wait",
            "Arrival to admission",
            &TTFT_BUCKETS,
        ),
        prefill: hist(
            "inferscope.prefill",
            "Admission to first token",
            &TTFT_BUCKETS,
        ),
        step_duration: hist(
            "inferscope.engine.step.duration",
            "Engine step duration",
            &TPOT_BUCKETS,
        ),
        prompt_tokens: meter
            .u64_histogram("inferscope.prompt_tokens")
            .with_unit("{token}")
            .with_boundaries(TOKEN_BUCKETS.to_vec())
            .build(),
        prompt_tokens_cached: meter
            .u64_histogram("inferscope.prompt_tokens.cached")
            .with_unit("{token}")
            .with_boundaries(TOKEN_BUCKETS.to_vec())
            .build(),
        prefill_tokens_computed: meter
            .u64_histogram("inferscope.prefill_tokens.computed")
            .with_unit("{token}")
            .with_boundaries(TOKEN_BUCKETS.to_vec())
            .build(),
        requests: meter.u64_counter("inferscope.requests").build(),
        admitted: meter.u64_counter("inferscope.requests.admitted").build(),
        preemptions: meter.u64_counter("inferscope.preemptions").build(),
    }
}

#[cfg(test)]
mod tests {
    /// The fleet diagnosis reads P99s from these buckets: they span what users see (TTFT 1 ms
    /// to 60 s, TPOT 1 ms to 1 s) and no two neighbours are far apart where P99s sit.
    #[test]
    fn latency_buckets_cover_the_range_finely() {
        let spread = |b: &[f64], from: f64| {
            b.windows(2)
                .filter(|w| w[0] >= from)
                .map(|w| w[1] / w[0])
                .fold(0.0_f64, f64::max)
        };
        assert_eq!(
            (super::TTFT_BUCKETS[0], *super::TTFT_BUCKETS.last().unwrap()),
            (0.001, 60.0)
        );
        assert!(spread(&super::TTFT_BUCKETS, 0.1) <= 1.5);
        assert!(spread(&super::TTFT_BUCKETS, 0.0) <= 2.5);
        assert_eq!(super::TPOT_BUCKETS[0], 0.001);
        assert!(super::TPOT_BUCKETS.contains(&1.0));
        assert!(spread(&super::TPOT_BUCKETS[..19], 0.005) <= 1.5);
    }

    use inferscope_model::RequestRecord;

    use super::*;

    fn timeline(model: &str) -> RequestTimeline {
        RequestTimeline::bare(RequestRecord {
            engine: "llama.cpp".into(),
            model: Some(model.into()),
            ttft_ms: Some(120.0),
            queue_wait_ms: Some(20.0),
            prefill_ms: Some(100.0),
            tpot_ms: Some(30.0),
            e2e_ms: 900.0,
            admitted_mono_ns: Some(1),
            prompt_tokens: Some(50),
            status: Some(200),
            ..Default::default()
        })
    }

    #[test]
    fn exposition_has_genai_histograms() {
        let m = Metrics::new(None);
        m.record_request(&timeline("smol"));
        m.set_agent_counters(&[(AgentCounter::KernelRingbufFullDrops, 3)]);
        m.set_agent_counters(&[(AgentCounter::KernelRingbufFullDrops, 5)]);
        let text = m.encode().unwrap();
        assert!(text.contains("gen_ai_server_time_to_first_token_seconds_bucket{"));
        assert!(text.contains("le=\"0.25\""));
        assert!(text.contains("inferscope_queue_wait_seconds_sum"));
        assert!(
            text.contains("inferscope_agent_events_total{counter=\"kernel_ringbuf_full_drops\"} 5")
        );
        assert!(text.contains("inferscope_requests_admitted_total{engine=\"llama.cpp\"} 1"));
    }

    #[test]
    fn steps_without_a_start_have_no_duration() {
        let m = Metrics::new(None);
        let step = |start_from, duration_ms| StepRecord {
            pid: 1,
            engine: "sglang".into(),
            tid: 1,
            start_mono_ns: 0,
            end_mono_ns: 0,
            duration_ms,
            sequences: 1,
            prefilling: 0,
            requests: Vec::new(),
            start_from,
            ..StepRecord::default()
        };
        m.record_step(&step(Some("forward_entry"), 12.0));
        m.record_step(&step(Some("unknown"), 0.0));
        m.record_step(&step(None, 3.0));
        let text = m.encode().unwrap();
        assert!(
            text.contains("inferscope_engine_step_duration_seconds_count{engine=\"sglang\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn counters_exist_at_zero_and_losses_are_exported_on_their_own() {
        let m = Metrics::new(None);
        m.set_agent_counters(&[
            (AgentCounter::KernelRingbufFullDrops, 0),
            (AgentCounter::RingbufRecords, 7),
            (AgentCounter::EngineProcessesTraced, 1),
        ]);
        m.set_agent_counters(&[(AgentCounter::KernelRingbufFullDrops, 3)]);
        let mut r = timeline("smol");
        r.request.preemptions = None;
        r.request.itl_p99_ms = Some(40.0);
        m.record_request(&r);
        let text = m.encode().unwrap();
        for line in [
            "inferscope_agent_losses_total{counter=\"kernel_ringbuf_full_drops\"} 3",
            "inferscope_agent_events_total{counter=\"kernel_ringbuf_full_drops\"} 3",
            "inferscope_agent_events_total{counter=\"ringbuf_records\"} 7",
            "inferscope_agent_state{name=\"engine_processes_traced\"} 1",
            // An engine that never preempted: 0, not absent.
            "inferscope_preemptions_total{engine=\"llama.cpp\"} 0",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        // Totals that are not losses stay out of the losses family.
        assert!(!text.contains("inferscope_agent_losses_total{counter=\"ringbuf_records\"}"));
        assert!(text.contains("inferscope_itl_p99_seconds_bucket"), "{text}");
        let rss = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no RSS in\n{text}"));
        assert!(rss > 1e6, "{rss}");
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
    }

    #[test]
    fn model_labels_are_bounded() {
        let m = Metrics::new(None);
        for i in 0..(MAX_MODELS_PER_ENGINE + 10) {
            m.record_request(&timeline(&format!("model-{i}")));
        }
        let text = m.encode().unwrap();
        assert!(text.contains("model=\"other\""));
        assert!(!text.contains(&format!("model-{}\"", MAX_MODELS_PER_ENGINE + 5)));
    }

    #[test]
    fn pods_are_labels_where_known_and_absent_otherwise() {
        let m = Metrics::new(None);
        m.record_request(&timeline("smol"));
        let mut in_pod = timeline("smol");
        in_pod.request.identity = Some(inferscope_model::ProcessIdentity {
            container_id: Some("ab".repeat(32)),
            k8s_namespace_name: Some("inference".into()),
            k8s_pod_name: Some("vllm-7d9f8c6b5-x2k4p".into()),
            k8s_container_name: Some("engine".into()),
            ..Default::default()
        });
        m.record_request(&in_pod);
        // A container without a pod (podman on a bare host): no pod labels.
        let mut in_container = timeline("smol");
        in_container.request.identity = Some(inferscope_model::ProcessIdentity {
            container_id: Some("cd".repeat(32)),
            ..Default::default()
        });
        m.record_request(&in_container);
        let text = m.encode().unwrap();
        let counts: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gen_ai_server_time_to_first_token_seconds_count"))
            .collect();
        assert_eq!(counts.len(), 2, "{counts:?}");
        assert!(counts.contains(
            &"gen_ai_server_time_to_first_token_seconds_count{engine=\"llama.cpp\",model=\"smol\",namespace=\"inference\",pod=\"vllm-7d9f8c6b5-x2k4p\",container=\"engine\"} 1"
        ), "{counts:?}");
        assert!(counts.contains(
            &"gen_ai_server_time_to_first_token_seconds_count{engine=\"llama.cpp\",model=\"smol\"} 2"
        ), "{counts:?}");
        assert!(text.contains(
            "inferscope_requests_total{engine=\"llama.cpp\",model=\"smol\",outcome=\"ok\",namespace=\"inference\",pod=\"vllm-7d9f8c6b5-x2k4p\",container=\"engine\"} 1"
        ));
    }
}
