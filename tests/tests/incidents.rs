//! The incident suite (tests/incidents/): each scenario is recorded live by the real agent on the
//! real engine, then diagnosed by `inferscope diagnose`; the cause must match the incident made,
//! and the evidence must carry the signal that shows it.
#[path = "../incidents/mod.rs"]
mod incidents;

use std::time::Duration;

use incidents::{BASELINE, Phase, SLOTS, cgroup::CpuLimit, evidence, run};

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
    let p = &d["prefill_p99_ms"];
    assert!(
        p["window"].as_f64().unwrap() > 2.0 * p["baseline"].as_f64().unwrap(),
        "{}",
        o.report
    );
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(&o, BASELINE.requests, long.requests);
    let e = evidence(d, "prompt_tokens_p99");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 2.0, "{}", o.report);
    // Arrivals did not change.
    assert_eq!(
        evidence(d, "arrival_rate_per_s")["crossed"],
        false,
        "{}",
        o.report
    );
}

#[test]
fn degraded_device_engine_cpu_throttled_by_a_cgroup() {
    // 20% of one CPU in 10 ms periods: every step runs about 5x slower, prompts unchanged.
    let o = run("degraded_device", BASELINE, |engine| {
        Some(CpuLimit::apply(engine.pid(), 2_000, 10_000).unwrap_or_else(|e| panic!("{e}")))
    });
    let d = &o.diagnosis;
    assert_eq!(d["cause"], "degraded_device", "{}", o.report);
    assert_eq!(o.exit_code, Some(3), "{}", o.report);
    incidents::check_recorded(&o, BASELINE.requests, BASELINE.requests);
    let e = evidence(d, "decode_step_ms_p50");
    assert_eq!(e["crossed"], true, "{}", o.report);
    assert!(ratio(e) >= 2.0, "{}", o.report);
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
