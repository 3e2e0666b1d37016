//! Engine metrics scraping on the real llama.cpp engine: `inferscope record --metrics` finds the
//! engine's /metrics on its serving port, writes one record per scrape whose running and waiting
//! counts follow a small load, turns counters into rates, keeps its own scrapes out of the
//! request records, and stamps each request with the queue it found on arrival.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use inferscope_integration_tests::{
    agent::{self, Recorder, read_records, wait_records},
    client::Client,
    engine::Engine,
    free_port,
};
use serde_json::Value;

#[test]
fn metrics_records_follow_the_load_on_the_real_engine() {
    let dir = inferscope_integration_tests::test_dir("metrics");
    let port = free_port();
    let engine = Engine::start(port, 2);
    let pid = engine.pid();
    let metrics_path = dir.join("metrics.jsonl");
    let metrics_arg = metrics_path.to_string_lossy().into_owned();
    let mut recorder = Recorder::start(
        &dir,
        &[
            "--port",
            &port.to_string(),
            "--metrics",
            &metrics_arg,
            "--metrics-interval",
            "200ms",
        ],
    );
    recorder.wait_attached(pid, Duration::from_secs(30));
    // Idle scrapes first, so the load shows as a change.
    let idle = wait_records(
        &metrics_path,
        Duration::from_secs(30),
        "idle scrapes",
        |m| m.len() >= 2,
    );
    assert_eq!(series(&idle, "requests_running")[0], 0.0);

    // Five streams on two slots: two run, three wait for a slot.
    let topics = ["lanterns", "otters", "deserts", "violins", "harbors"];
    let clients: Vec<_> = topics
        .iter()
        .enumerate()
        .map(|(i, topic)| {
            let prompt = format!("({i}) Write three sentences about {topic}.");
            std::thread::spawn(move || Client::connect(port).chat(&prompt, 24, None))
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    // The streams' records, then two scrapes of the engine idle again.
    recorder.wait_records(
        Duration::from_secs(30),
        "the five streams' records",
        |records| {
            records
                .iter()
                .filter(|r| r["path"] == "/v1/chat/completions")
                .count()
                >= topics.len()
        },
    );
    let after_load = read_records(&metrics_path).len();
    wait_records(
        &metrics_path,
        Duration::from_secs(30),
        "idle scrapes after the load",
        |m| {
            m.len() >= (after_load + 2).max(8) && series(m, "requests_running").last() == Some(&0.0)
        },
    );
    let records = recorder.stop();
    let counters = agent::Counters::beside(&dir.join("agent.log"));
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let metrics = read_records(&metrics_path);
    drop(engine);

    assert!(
        metrics.len() >= 8,
        "{} metrics records:\n{log}",
        metrics.len()
    );
    for m in &metrics {
        assert_eq!(m["pid"], pid, "{m}");
        assert_eq!(m["engine"], "llamacpp");
        assert_eq!(m["port"], port);
        assert_eq!(m["path"], "/metrics");
        assert_eq!(m["lines_skipped"], 0, "{m}");
        assert!(m["samples"].as_u64().unwrap() >= 5, "{m}");
        // This llama.cpp build serves no KV usage metric (see tests/fixtures/metrics/README.md).
        assert!(m["kv_cache_usage"].is_null(), "{m}");
        assert!(m["preemptions_total"].is_null(), "{m}");
    }
    let times: Vec<u64> = metrics
        .iter()
        .map(|m| m["mono_ns"].as_u64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");

    let running = series(&metrics, "requests_running");
    let waiting = series(&metrics, "requests_waiting");
    assert_eq!(running[0], 0.0, "idle engine first: {running:?}");
    assert_eq!(*running.last().unwrap(), 0.0, "{running:?}");
    assert_eq!(
        running.iter().copied().fold(0.0, f64::max),
        2.0,
        "both slots busy under load: {running:?}"
    );
    assert!(
        waiting.iter().any(|&w| w >= 1.0),
        "requests deferred while the slots are busy: {waiting:?}"
    );
    let prompt = series(&metrics, "prompt_tokens_total");
    assert!(prompt.last().unwrap() > &prompt[0], "{prompt:?}");
    assert!(metrics[0]["interval_s"].is_null());
    assert!(
        metrics
            .iter()
            .any(|m| m["generation_tokens_per_s"].as_f64().unwrap_or(0.0) > 0.0),
        "generation rate under load"
    );
    assert!(
        metrics
            .iter()
            .skip(1)
            .all(|m| { (0.1..1.0).contains(&m["interval_s"].as_f64().unwrap_or(0.0)) }),
        "intervals near 200 ms"
    );

    // The agent's own scrapes are not requests.
    assert!(
        records.iter().all(|r| r["path"] != "/metrics"),
        "{records:#?}"
    );
    assert!(counters.get("metrics_scrape_requests_hidden") >= metrics.len() as u64 - 1);
    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 5, "{records:#?}");
    let mut found_idle = 0;
    for r in &chats {
        let offset = r["engine_metrics_offset_ms"]
            .as_f64()
            .unwrap_or_else(|| panic!("no metrics sample joined: {r:#?}"));
        // A scrape within two intervals of the arrival, normally the last one before it.
        assert!((-450.0..=450.0).contains(&offset), "{offset}");
        let waiting = r["requests_waiting_at_arrival"]
            .as_f64()
            .unwrap_or_else(|| panic!("{r:#?}"));
        assert!(waiting <= 3.0, "{r:#?}");
        found_idle += u32::from(offset <= 0.0 && waiting == 0.0);
        assert!(r["kv_cache_usage_at_arrival"].is_null());
    }
    // All five arrive together at an idle engine: (nearly) all found nobody waiting, unless a
    // scrape fell in the few milliseconds between their arrivals.
    assert!(found_idle >= 3, "{chats:#?}");
    assert_eq!(counters.get("metrics_scrape_errors_connect"), 0, "{log}");
}

fn series(metrics: &[Value], field: &str) -> Vec<f64> {
    metrics
        .iter()
        .map(|m| {
            m[field]
                .as_f64()
                .unwrap_or_else(|| panic!("{field} missing: {m}"))
        })
        .collect()
}
