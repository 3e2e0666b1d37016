//! The incident suite (tests/incidents/): each scenario is recorded live by the real agent on the
//! real engine, then diagnosed by `inferscope diagnose`; the cause must match the incident made,
//! and the evidence must carry the signal that shows it.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../incidents/mod.rs"]
mod incidents;

use std::time::Duration;

use incidents::{
    BASELINE, CLOSED_BASELINE, Clients, DEFAULT_ENGINE, EngineSettings, Load, Phase, SLOTS,
    Scenario, cgroup::CpuLimit, evidence, run, run_scenario, vllm::Vllm,
};

fn ratio(e: &serde_json::Value) -> f64 {
    e["ratio"]
        .as_f64()
        .unwrap_or_else(|| panic!("no ratio: {e:#}"))
}

#[test]
fn no_regression_when_the_same_load_runs_twice() {
    let o = run("none", BASELINE, |_| None);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "none", "{}", o.report);
    assert_eq!(d["dominant_phase"], "none", "{}", o.report);
    assert_eq!(d["regression"], false, "{}", o.report);
    // The control of every branch: no profile regressed (TPOT, ITL, E2E, success rate too).
    assert_eq!(d["any_regression"], false, "{}", o.report);
    assert!(d["tpot"].is_null() && d["errors"].is_null(), "{}", o.report);
    assert_eq!(o.exit_code, Some(0), "{}", o.report);
    incidents::check_recorded(&o, BASELINE.requests, BASELINE.requests);
    // Same schedule, same prompt sizes: the workload signals agree.
    let arrivals = ratio(evidence(d, "arrival_rate_per_s"));
    assert!((0.8..1.25).contains(&arrivals), "{}", o.report);
}

#[test]
fn traffic_spike_concurrency_far_above_the_slots() {
    // 14 requests 100 ms apart: up to 7x the 2 slots in flight at once.
    let spike = Phase {
        requests: 14,
        every: Duration::from_millis(100),
        ..BASELINE
    };
    assert!(spike.requests as u32 > 3 * SLOTS);
    let o = run("traffic_spike", spike, |_| None);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "traffic_spike", "{}", o.report);
    assert_eq!(d["dominant_phase"], "queue", "{}", o.report);
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(&o, BASELINE.requests, spike.requests);
    let e = evidence(d, "arrival_rate_per_s");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 3.0, "{}", o.report);
    // The queue, not prefill, carries the growth.
    let q = &d["queue_wait_p99_ms"];
    assert!(q["window"].as_f64().unwrap() > 5.0 * q["baseline"].as_f64().unwrap().max(10.0));
    assert_eq!(
        d["evidence"][0]["signal"], "arrival_rate_per_s",
        "{}",
        o.report
    );
    // Open loop: the spike shows as rate (the queue it builds may show as concurrency too).
    let form = d["traffic_form"].as_str().unwrap_or_default();
    assert!(form.starts_with("rate"), "{}", o.report);
}

/// The headline case: more clients at once, each waiting for its answer before asking again.
/// Arrivals cannot outrun the service rate, so the arrival rate barely moves; the spike shows as
/// requests in the system (Little's law) and queue wait.
#[test]
fn traffic_spike_more_clients_in_a_closed_loop() {
    let more = Clients {
        clients: 8,
        requests_each: 3,
        ..CLOSED_BASELINE
    };
    let mut s = Scenario::new("closed_loop_spike", Load::Closed(more));
    s.baseline = Load::Closed(CLOSED_BASELINE);
    let o = run_scenario(s);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "traffic_spike", "{}", o.report);
    assert_eq!(d["dominant_phase"], "queue", "{}", o.report);
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(
        &o,
        Load::Closed(CLOSED_BASELINE).requests(),
        Load::Closed(more).requests(),
    );
    let l = evidence(d, "requests_in_system");
    assert_eq!(l["crossed"], true, "{}", o.report);
    assert!(ratio(l) >= 2.0, "{}", o.report);
    // Concurrency carries it. The rate may rise too, by how far the baseline left the engine's
    // slots idle (x1.16 to x1.6 over runs here): never by as much as the requests in the system.
    let rate = ratio(evidence(d, "arrival_rate_per_s"));
    assert!(ratio(l) > rate, "{}", o.report);
    let form = d["traffic_form"].as_str().unwrap_or_default();
    assert!(
        form == "concurrency" || form == "rate_and_concurrency",
        "{}",
        o.report
    );
    if form == "concurrency" {
        assert_eq!(
            d["evidence"][0]["signal"], "requests_in_system",
            "{}",
            o.report
        );
    }
}

/// The same open-loop traffic on an engine restarted with a batch of two tokens (`--batch-size 2`
/// instead of the default 2048; 1 trips an assertion in llama.cpp): every prompt is prefilled
/// over many steps instead of one. The steps show it (prefill steps per request, x10) and the
/// engine's command line says why (n_batch default -> 2), recorded live through the llama.cpp
/// plugin.
///
/// On this 1-thread CPU engine a prompt token costs only ~1.4x more in two-token steps than in
/// one big step, so P99 TTFT grows ~x1.3, short of the x1.5 a regression needs; fewer slots
/// cannot regress here either (a step of two requests costs about two of one, so two slots add
/// no throughput). So the verdict may be "no regression" (then `none`), and where it is a
/// regression the cause must be scheduler_config, never another cause. The regression itself
/// is for the vLLM scenarios (`--max-num-batched-tokens`), where chunked prefill costs more.
#[test]
fn scheduler_config_smaller_batch() {
    let mut s = Scenario::new("scheduler_config", Load::Open(BASELINE));
    s.incident_engine = Some(EngineSettings {
        batch_tokens: Some(2),
        ..DEFAULT_ENGINE
    });
    let o = run_scenario(s);
    let d = &o.diagnosis;
    let expected = if d["regression"] == true {
        "scheduler_config"
    } else {
        "none"
    };
    assert_eq!(d["cause"], expected, "{}", o.report);
    incidents::check_recorded(&o, BASELINE.requests, BASELINE.requests);
    let e = evidence(d, "prefill_steps_per_request_p50");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 5.0, "{}", o.report);
    for signal in [
        "arrival_rate_per_s",
        "prompt_tokens_p99",
        "requests_in_system",
    ] {
        assert_eq!(
            evidence(d, signal)["crossed"],
            false,
            "{signal}: {}",
            o.report
        );
    }
    let changes = d["engine_config_changes"].as_array().expect("a list");
    assert!(
        changes
            .iter()
            .any(|c| c["setting"] == "n_batch" && c["baseline"].is_null() && c["window"] == "2"),
        "{}",
        o.report
    );
}

/// Two causes at once: more clients in a closed loop, and prompts several times longer. The
/// queue (the clients) carries most of the growth, prefill (the prompts) the rest.
#[test]
fn mixed_more_clients_and_longer_prompts() {
    let more = Clients {
        clients: 10,
        requests_each: 3,
        prompt_words: 40,
        ..CLOSED_BASELINE
    };
    let mut s = Scenario::new("mixed", Load::Closed(more));
    s.baseline = Load::Closed(CLOSED_BASELINE);
    let o = run_scenario(s);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "traffic_spike", "{}", o.report);
    assert_eq!(d["secondary_cause"], "prompt_growth", "{}", o.report);
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    let causes = d["causes"].as_array().expect("ranked causes");
    let share = |i: usize| causes[i]["share"].as_f64().unwrap();
    assert!(share(0) >= share(1) && share(1) >= 0.2, "{}", o.report);
    assert_eq!(
        evidence(d, "prompt_tokens_p99")["crossed"],
        true,
        "{}",
        o.report
    );
    assert_eq!(
        evidence(d, "requests_in_system")["crossed"],
        true,
        "{}",
        o.report
    );
}

#[test]
fn prompt_growth_prompts_several_times_longer() {
    let long = Phase {
        prompt_words: 80,
        ..BASELINE
    };
    let o = run("prompt_growth", long, |_| None);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "prompt_growth", "{}", o.report);
    // Prefill grew (queue wait may grow too: longer prefills also keep the slots busy longer).
    // Less than the prompts did (x2.5 in tokens): each prefill has a fixed cost too, and a P99
    // of 12 requests moves with the machine's phases (x1.9 to x2.5 seen on the project's VM).
    let p = &d["prefill_p99_ms"];
    assert!(
        p["window"].as_f64().unwrap() > 1.5 * p["baseline"].as_f64().unwrap(),
        "{}",
        o.report
    );
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(&o, BASELINE.requests, long.requests);
    let e = evidence(d, "prompt_tokens_p99");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 2.0, "{}", o.report);
    // Arrivals did not change, so the requests the slower service kept in the system are no
    // more demand, however slow the machine's phase made each request (issue 46).
    for signal in ["arrival_rate_per_s", "requests_in_system"] {
        assert_eq!(
            evidence(d, signal)["crossed"],
            false,
            "{signal}: {}",
            o.report
        );
    }
}

/// Clients that give up: the baseline's load, then a burst of long answers (64 tokens, 16
/// requests 100 ms apart on 2 slots) whose clients close the connection after 2 s without a
/// byte. The success rate falls, and the error branch names clients leaving after long queue
/// waits, with their request ids.
#[test]
fn client_timeouts_after_queue_waits() {
    let burst = Phase {
        requests: 16,
        every: Duration::from_millis(100),
        max_tokens: 64,
        ..BASELINE
    };
    let s = Scenario::new(
        "client_timeouts",
        Load::Impatient {
            phase: burst,
            patience: Duration::from_secs(2),
        },
    );
    let o = run_scenario(s);
    let d = &o.diagnosis;
    let success = d["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["profile"] == "success_rate")
        .unwrap();
    assert_eq!(success["regressed"], true, "{}", o.report);
    assert_eq!(success["p50"]["baseline"], 1.0, "{}", o.report);
    let errors = &d["errors"];
    assert_eq!(
        errors["cause"], "client_timeouts_after_queue_waits",
        "{}",
        o.report
    );
    let timeouts = errors["failures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "client_timeout")
        .unwrap_or_else(|| panic!("no client timeouts: {}", o.report));
    assert!(
        timeouts["count"]["window"].as_u64().unwrap() >= 3,
        "{}",
        o.report
    );
    assert!(!timeouts["requests"].as_array().unwrap().is_empty());
    assert!(
        o.report.contains("Errors: Success rate 100.0%"),
        "{}",
        o.report
    );
}

/// Prefix-cache misses: every prompt opens with the same 150 words in the baseline (llama.cpp's
/// slots keep them cached), and with 150 words of its own in the incident: the same prompt
/// tokens, many times the tokens to compute. The control (the shared prefix twice) is `none`.
#[test]
fn prefix_cache_misses_at_the_same_prompt_length() {
    let phase = Phase {
        requests: 10,
        every: Duration::from_millis(1200),
        prompt_words: 4,
        max_tokens: 4,
    };
    let prefixed = |shared| Load::Prefixed {
        phase,
        prefix_words: 150,
        shared,
    };
    let mut s = Scenario::new("prefix_cache_miss", prefixed(false));
    s.baseline = prefixed(true);
    let o = run_scenario(s);
    let d = &o.diagnosis;
    // Prefill grew, and so did queue wait: llama.cpp runs one slot's long prefill as one step,
    // which the other slot's next request waits behind. Either phase may carry more.
    assert_eq!(d["cause"], "prefix_cache_miss", "{}", o.report);
    // Those long prefill steps also stretch the other slot's decode: where TPOT regressed, the
    // TPOT branch names prefill interference (the requests' decode time in steps that also
    // prefilled).
    if d["tpot"].is_object() {
        assert_eq!(d["tpot"]["cause"], "prefill_interference", "{}", o.report);
    }
    let e = evidence(d, "prefill_tokens_computed_p50");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 3.0, "{}", o.report);
    assert_eq!(
        evidence(d, "prompt_tokens_p99")["crossed"],
        false,
        "{}",
        o.report
    );

    let mut control = Scenario::new("prefix_cache_hits_twice", prefixed(true));
    control.baseline = prefixed(true);
    let o = run_scenario(control);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "none", "{}", o.report);
    assert_eq!(
        evidence(d, "prefill_tokens_computed_p50")["crossed"],
        false,
        "{}",
        o.report
    );
}

#[test]
fn degraded_device_engine_cpu_throttled_by_a_cgroup() {
    // 20% of one CPU in 10 ms periods: every step runs about 5x slower, prompts unchanged.
    let o = run("degraded_device", BASELINE, |pid| {
        Some(CpuLimit::apply(pid, 2_000, 10_000).unwrap_or_else(|e| panic!("{e}")))
    });
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "degraded_device", "{}", o.report);
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(&o, BASELINE.requests, BASELINE.requests);
    let e = evidence(d, "decode_step_ms_p50");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 2.0, "{}", o.report);
    // Decoding slowed with every step: TPOT regressed too, and its branch names the device.
    let tpot = d["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["profile"] == "tpot")
        .unwrap();
    assert_eq!(tpot["regressed"], true, "{}", o.report);
    assert_eq!(d["tpot"]["cause"], "degraded_device", "{}", o.report);
    assert_eq!(
        evidence(d, "prompt_tokens_p99")["crossed"],
        false,
        "{}",
        o.report
    );
    assert_eq!(
        evidence(d, "arrival_rate_per_s")["crossed"],
        false,
        "{}",
        o.report
    );
}

#[test]
fn diagnose_exit_status_for_errors_and_too_little_data() {
    use std::process::Command;
    let dir = inferscope_integration_tests::test_dir("diag-exit");
    let run = |records: &std::path::Path, baseline: &str, window: &str| {
        let out = Command::new(inferscope_integration_tests::agent::binary())
            .args(["diagnose", "--records"])
            .arg(records)
            .args(["--baseline", baseline, "--window", window])
            .output()
            .expect("running inferscope diagnose");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&dir.join("missing.jsonl"), "..+1s", "-1s..");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot open"), "{err}");
    // Two requests: too few to decide, whatever the windows.
    let records = dir.join("two.jsonl");
    std::fs::write(
        &records,
        "{\"method\":\"POST\",\"arrival_mono_ns\":1000000000,\"end_mono_ns\":1500000000,\"ttft_ms\":20.0}\n\
         {\"method\":\"POST\",\"arrival_mono_ns\":9000000000,\"end_mono_ns\":9500000000,\"ttft_ms\":900.0}\n",
    )
    .expect("writing records");
    let (code, err) = run(&records, "..+5s", "+5s..");
    assert_eq!(code, Some(5), "{err}");
    let (code, err) = run(&records, "yesterday..", "+5s..");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--baseline"), "{err}");
    // Wall-clock times need the records' wall-clock arrivals.
    let (code, err) = run(&records, "2026-01-01T00:00:00Z..", "+5s..");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("arrival_unix_ns"), "{err}");
}

/// The same traffic spike seen by the long-running agent: its continuous diagnosis raises the
/// alarm (Prometheus info metric and an OTLP log event), and `inferscope diagnose --connect`
/// names the cause from what the agent kept.
#[test]
fn traffic_spike_seen_live_by_the_daemon() {
    use std::time::Instant;

    use inferscope_integration_tests::{daemon::Daemon, engine::Engine, free_port, otlp::Rotel};

    // The alarm compares two windows' latencies: another test's engine must not load one.
    let _machine = inferscope_integration_tests::exclusive();
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = Engine::start(free_port(), SLOTS);
    let rotel = Rotel::start_logging(dir.path(), free_port(), &["logs"]);
    let mut daemon = Daemon::start(
        dir.path(),
        &[
            "--port",
            &engine.port.to_string(),
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{}", rotel.port),
            "--diagnose-interval",
            "1s",
            "--diagnose-window",
            "10s",
            "--diagnose-baseline",
            "15s",
            "--diagnose-ratio",
            "1.5",
        ],
    );
    daemon.wait_attached(engine.pid(), Duration::from_secs(60));
    let baseline = Phase {
        requests: 20,
        ..BASELINE
    };
    let spike = Phase {
        requests: 14,
        every: Duration::from_millis(100),
        ..BASELINE
    };
    let base_span = incidents::send(engine.port, baseline, 0);
    let spike_span = incidents::send(engine.port, spike, 1000);

    // The continuous watch: the info metric turns on with the cause.
    let deadline = Instant::now() + Duration::from_secs(20);
    let alarm = loop {
        let text = daemon.scrape();
        if let Some(line) = text
            .lines()
            .find(|l| l.starts_with("inferscope_diagnosis_info{") && l.ends_with(" 1"))
        {
            break line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no alarm:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(alarm.contains("cause=\"traffic_spike\""), "{alarm}");
    assert!(daemon.log_text().contains("P99 TTFT regressed"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !rotel.text().contains("inferscope.diagnosis") {
        assert!(
            Instant::now() < deadline,
            "no OTLP diagnosis event:\n{}",
            rotel.text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(rotel.text().contains("traffic_spike"));

    // The same question asked explicitly, with the phases' own times.
    let out = daemon.client(&[
        "diagnose",
        "--json",
        "--baseline",
        &base_span.arg(),
        "--window",
        &spike_span.arg(),
    ]);
    let d: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(d["cause"], "traffic_spike", "{d:#}");
    assert_eq!(out.status.code(), Some(3));
    let report = daemon.client(&[
        "diagnose",
        "--baseline",
        &base_span.arg(),
        "--window",
        &spike_span.arg(),
    ]);
    assert!(String::from_utf8_lossy(&report.stdout).contains("traffic"));
    daemon.stop();
}

/// vLLM's real scheduler with a fake device: 8 ms a step plus 20 us a scheduled token, 16-token
/// KV blocks, contexts up to 352 tokens (a pool needs one block more than the longest context).
static KV_VLLM: Vllm = Vllm {
    step_ms: 8.0,
    token_us: 20.0,
    block_size: 16,
    max_model_len: 352,
    kv_blocks: 512,
};

/// Open-loop traffic both vLLM KV phases share: 24 chats 150 ms apart, ~110-token prompts and
/// 64-token answers (~11 KV blocks each by the end), so up to ~8 run at once.
const KV_TRAFFIC: Phase = Phase {
    requests: 24,
    every: Duration::from_millis(150),
    prompt_words: 100,
    max_tokens: 64,
};

/// The same traffic against a KV pool of 24 blocks (384 tokens) instead of 512: only two
/// requests fit, vLLM preempts running requests to make room and new ones wait for blocks. Named kv_pressure from the preemption counts vLLM itself sent over its IPC and the
/// KV use its /metrics reported.
#[test]
fn kv_pressure_vllm_small_kv_pool() {
    let roomy = EngineSettings {
        slots: 16,
        batch_tokens: None,
        kv_tokens: None,
    };
    let s = Scenario {
        name: "kv_pressure",
        launcher: &KV_VLLM,
        engine: roomy,
        baseline: Load::Open(KV_TRAFFIC),
        incident: Load::Open(KV_TRAFFIC),
        incident_engine: Some(EngineSettings {
            kv_tokens: Some(24 * 16),
            ..roomy
        }),
        between: None,
    };
    let o = run_scenario(s);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "kv_pressure", "{}", o.report);
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(&o, KV_TRAFFIC.requests, KV_TRAFFIC.requests);
    let ttft = &d["ttft_p99_ms"];
    assert!(
        ttft["window"].as_f64().unwrap() > 3.0 * ttft["baseline"].as_f64().unwrap(),
        "{}",
        o.report
    );
    let pre = evidence(d, "preemptions_per_s");
    assert_eq!(pre["crossed"], true, "{}", o.report);
    assert!(
        pre["detail"]
            .as_str()
            .is_some_and(|t| t.contains("preempted in the incident window")),
        "{}",
        o.report
    );
    // KV use from vLLM's /metrics: a few percent of the roomy pool, most of the small one (its
    // P90 stays under 1: preempting frees the blocks of the request preempted).
    let kv = evidence(d, "kv_cache_usage_p90");
    let (kv_b, kv_w) = (
        kv["baseline"].as_f64().unwrap(),
        kv["window"].as_f64().unwrap(),
    );
    assert!(kv_w >= 0.5 && kv_w > 4.0 * kv_b, "{}", o.report);
    for signal in ["arrival_rate_per_s", "prompt_tokens_p99"] {
        assert_eq!(
            evidence(d, signal)["crossed"],
            false,
            "{signal}: {}",
            o.report
        );
    }
    let changes = d["engine_config_changes"].as_array().expect("a list");
    assert!(
        changes
            .iter()
            .any(|c| c["setting"] == "num_gpu_blocks_override" && c["window"] == "24"),
        "{}",
        o.report
    );
}

/// vLLM with a slower fake step (25 ms): a prompt's cost is mostly steps, as on a GPU.
static CHUNK_VLLM: Vllm = Vllm {
    step_ms: 25.0,
    token_us: 20.0,
    block_size: 16,
    max_model_len: 1024,
    kv_blocks: 256,
};

/// ~400-token prompts, 12 of them 250 ms apart, short answers.
const CHUNK_TRAFFIC: Phase = Phase {
    requests: 12,
    every: Duration::from_millis(250),
    prompt_words: 400,
    max_tokens: 8,
};

/// The same traffic on vLLM restarted with `--max-num-batched-tokens 64` (vLLM's default
/// otherwise): every prompt is prefilled in chunks over ~7 steps instead of one. Named
/// scheduler_config from the steps (prefill steps per request) with the setting read from the
/// real `vllm serve` command line.
#[test]
fn scheduler_config_vllm_smaller_token_budget() {
    let default = EngineSettings {
        slots: 16,
        batch_tokens: None,
        kv_tokens: None,
    };
    let s = Scenario {
        name: "scheduler_config_vllm",
        launcher: &CHUNK_VLLM,
        engine: default,
        baseline: Load::Open(CHUNK_TRAFFIC),
        incident: Load::Open(CHUNK_TRAFFIC),
        incident_engine: Some(EngineSettings {
            batch_tokens: Some(64),
            ..default
        }),
        between: None,
    };
    let o = run_scenario(s);
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "scheduler_config", "{}", o.report);
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(&o, CHUNK_TRAFFIC.requests, CHUNK_TRAFFIC.requests);
    let ttft = &d["ttft_p99_ms"];
    assert!(
        ttft["window"].as_f64().unwrap() > 2.0 * ttft["baseline"].as_f64().unwrap(),
        "{}",
        o.report
    );
    let e = evidence(d, "prefill_steps_per_request_p50");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 4.0, "{}", o.report);
    for signal in ["arrival_rate_per_s", "prompt_tokens_p99"] {
        assert_eq!(
            evidence(d, signal)["crossed"],
            false,
            "{signal}: {}",
            o.report
        );
    }
    let changes = d["engine_config_changes"].as_array().expect("a list");
    assert!(
        changes
            .iter()
            .any(|c| c["setting"] == "max_num_batched_tokens"
                && c["baseline"].is_null()
                && c["window"] == "64"),
        "{}",
        o.report
    );
}
