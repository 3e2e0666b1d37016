//! The daemon path in-process: what the pipeline hands the sink reaches every output.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use inferscope_model::{
    Counter, RequestRecord, StepMember, StepRecord, StepRef, clock::monotonic_now_ns,
};

use super::*;
use crate::{
    diagnose::{
        history::{History, HistoryLimits},
        watch::{Watch, WatchConfig},
    },
    export::{
        hub::{Hub, HubEvent, HubLimits},
        jsonl::JsonlWriter,
        metrics::Metrics,
        otlp::ExportCounters,
    },
    join::{TimelineLimits, testing::Driver},
    pipeline::Sink,
};

fn step(pid: u32, end_mono_ns: u64, request_id: &str) -> StepRecord {
    StepRecord {
        pid,
        engine: "vllm".into(),
        tid: pid,
        start_mono_ns: end_mono_ns - 5_000_000,
        end_mono_ns,
        duration_ms: 5.0,
        batch_tokens: Some(12),
        sequences: 1,
        prefilling: 1,
        requests: vec![StepMember {
            request_id: request_id.into(),
            phase: "prefill",
        }],
        kv_cache_usage: Some(0.25),
        running_requests: Some(1),
        waiting_requests: Some(0),
        ..StepRecord::default()
    }
}

struct Daemon {
    sink: FanOut,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    history: Arc<Mutex<History>>,
    records: std::path::PathBuf,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn daemon(name: &str) -> Daemon {
    let dir = std::env::temp_dir().join(format!("inferscope-daemon-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let records = dir.join("records.jsonl");
    let hub = Arc::new(Hub::new(HubLimits::default()));
    let metrics = Arc::new(Metrics::new(None));
    let history = Arc::new(Mutex::new(History::new(HistoryLimits::default())));
    let sink = FanOut::new(
        Outputs {
            hub: hub.clone(),
            metrics: metrics.clone(),
            traces: None,
            export_counters: Arc::new(ExportCounters::default()),
            sampler: Sampler {
                ratio: 1.0,
                always_ttft_ms: None,
            },
            records: Some(JsonlWriter::create(&records).unwrap()),
        },
        GpuInputs::start(None, None).unwrap(),
        Some(Diagnosis {
            watch: Watch::new(
                WatchConfig {
                    baseline: Duration::from_secs(60),
                    window: Duration::from_secs(10),
                    interval: Duration::from_secs(5),
                    ratio: 2.0,
                },
                monotonic_now_ns(),
            ),
            history: history.clone(),
            events: None,
            reported_cause: None,
        }),
    );
    Daemon {
        sink,
        hub,
        metrics,
        history,
        records,
        _dir: TempDir(dir),
    }
}

#[test]
fn a_finished_request_reaches_every_output_with_its_steps() {
    let mut d = daemon("fanout");
    let mut events = d.hub.subscribe();
    let now = monotonic_now_ns();
    let step_end = now - 50_000_000;
    // The pipeline hands the step to the sink and the join; the join closes the
    // request's timeline with it.
    let mut join = Driver::new(TimelineLimits::default());
    let s = step(7, step_end, "7-1-0");
    d.sink.on_step(&s);
    join.on_step(s);
    let record = RequestRecord {
        request_id: "7-1-0".into(),
        pid: 7,
        engine: "vllm".into(),
        method: "POST".into(),
        path: "/v1/completions".into(),
        status: Some(200),
        arrival_mono_ns: now - 80_000_000,
        end_mono_ns: now - 10_000_000,
        ttft_ms: Some(40.0),
        output_chunks: 3,
        engine_steps: vec![StepRef {
            pid: 7,
            end_mono_ns: step_end,
            phase: "prefill",
        }],
        ..Default::default()
    };
    let mut closed = Vec::new();
    join.on_request(record, now, &mut closed);
    assert_eq!(closed.len(), 1, "no shim: closed at once");
    for timeline in closed {
        d.sink.on_timeline(&std::sync::Arc::new(timeline));
    }
    d.sink.on_tick();
    d.sink.on_counters(&[(Counter::RequestsLost, 2)]);
    d.sink.finish();

    // JSONL: the record, once.
    let lines = std::fs::read_to_string(&d.records).unwrap();
    let ids: Vec<String> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["request_id"].to_string())
        .collect();
    assert_eq!(ids, ["\"7-1-0\""]);

    // gRPC subscribers: the step, then the request's timeline carrying that step.
    let mut steps_seen = 0;
    let mut timeline = None;
    while let Ok(event) = events.try_recv() {
        match event {
            HubEvent::Step(_) => steps_seen += 1,
            HubEvent::Request(t) => timeline = Some(t),
            _ => {}
        }
    }
    assert_eq!(steps_seen, 1);
    let timeline = timeline.expect("the request's timeline was published");
    assert_eq!(timeline.request.request_id, "7-1-0");
    assert_eq!(timeline.steps.len(), 1, "{timeline:?}");
    assert_eq!(timeline.steps[0].end_mono_ns, step_end);

    // Prometheus: the request by outcome, and the counters handed over.
    let text = d.metrics.encode().unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("inferscope_requests_total{") && l.ends_with(" 1")),
        "{text}"
    );
    assert!(
        text.contains("inferscope_agent_events_total{counter=\"requests_lost\"} 2"),
        "{text}"
    );

    // The continuous diagnosis: the request is in its history.
    assert_eq!(d.history.lock().unwrap().len(), 1);
}

#[test]
fn a_detached_process_leaves_no_state_in_the_outputs() {
    let mut d = daemon("detach");
    // A step with the engine's KV use sets the process's gauge (labels engine, pid).
    d.sink.on_step(&step(9, monotonic_now_ns(), "9-1-0"));
    let gauge = "pid=\"9\"";
    let before = d.metrics.encode().unwrap();
    assert!(before.contains(gauge), "{before}");
    // Another process keeps its gauge.
    d.sink.on_step(&step(10, monotonic_now_ns(), "10-1-0"));
    // The pipeline forgets a process the same way whether discovery detached it or it was
    // adopted and given up (pipeline::lifecycle).
    d.sink.on_process_gone(9);
    let after = d.metrics.encode().unwrap();
    assert!(!after.contains(gauge), "{after}");
    assert!(after.contains("pid=\"10\""), "{after}");
}
