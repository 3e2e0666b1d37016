//! The rules on synthetic windows: each cause from its own signal, and `none` for equal load.
use super::*;

const S: u64 = 1_000_000_000;

/// A window's worth of load: `n` requests arriving evenly over 10 s from `t0`, each with the
/// given queue wait, prefill and prompt, and decode-only steps of `step_ms` with 2 requests.
struct Load {
    n: u64,
    queue_ms: f64,
    prefill_ms: f64,
    prompt_tokens: u64,
    prefill_steps: u64,
    step_ms: f64,
    preemptions: u64,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            n: 40,
            queue_ms: 2.0,
            prefill_ms: 40.0,
            prompt_tokens: 50,
            prefill_steps: 1,
            step_ms: 20.0,
            preemptions: 0,
        }
    }
}

fn add(inputs: &mut Inputs, t0: u64, load: Load) {
    for i in 0..load.n {
        // A little spread, so percentiles are not all one value.
        let jitter = (i % 5) as f64;
        let arrival = t0 + i * 10 * S / load.n;
        let q = load.queue_ms + jitter;
        let p = load.prefill_ms + jitter;
        let admitted = arrival + (q * 1e6) as u64;
        inputs.requests.push(RequestSample {
            method: "POST".into(),
            arrival_mono_ns: arrival,
            arrival_unix_ns: arrival + 1_000 * S,
            admitted_mono_ns: Some(admitted),
            end_mono_ns: admitted + ((p + 300.0) * 1e6) as u64,
            ttft_ms: Some(q + p),
            queue_wait_ms: Some(q),
            prefill_ms: Some(p),
            prefill_steps: Some(load.prefill_steps),
            prompt_tokens: Some(load.prompt_tokens + i % 7),
            prompt_bytes: Some(load.prompt_tokens * 4),
            preemptions: Some(load.preemptions),
        });
    }
    for i in 0..200 {
        inputs.steps.push(StepSample {
            start_mono_ns: t0 + i * 10 * S / 200,
            duration_ms: load.step_ms + (i % 3) as f64,
            prefill_requests: 0,
            decode_requests: 2,
        });
    }
}

fn run(incident: Load) -> Diagnosis {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(&mut inputs, 200 * S, incident);
    diagnose(
        &inputs,
        TimeWindow {
            start_mono_ns: 100 * S,
            end_mono_ns: 110 * S,
        },
        TimeWindow {
            start_mono_ns: 200 * S,
            end_mono_ns: 210 * S,
        },
    )
}

fn crossed(d: &Diagnosis, signal: &str) -> bool {
    d.evidence.iter().any(|e| e.signal == signal && e.crossed)
}

#[test]
fn same_load_is_no_regression() {
    let d = run(Load::default());
    assert_eq!(d.cause, Cause::None, "{}", render(&d));
    assert!(!d.regression);
    assert_eq!(d.dominant_phase, Phase::None);
    assert!(d.confidence >= 0.9, "{}", d.confidence);
}

#[test]
fn more_arrivals_and_queue_wait_is_a_traffic_spike() {
    let d = run(Load {
        n: 120,
        queue_ms: 900.0,
        ..Default::default()
    });
    assert_eq!(d.dominant_phase, Phase::Queue);
    assert_eq!(d.cause, Cause::TrafficSpike, "{}", render(&d));
    assert!(crossed(&d, "arrival_rate_per_s"));
    assert_eq!(d.evidence[0].signal, "arrival_rate_per_s");
}

#[test]
fn longer_prompts_and_prefill_is_prompt_growth() {
    let d = run(Load {
        prefill_ms: 200.0,
        prompt_tokens: 250,
        ..Default::default()
    });
    assert_eq!(d.dominant_phase, Phase::Prefill);
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
    assert!(crossed(&d, "prompt_tokens_p99"));
}

#[test]
fn slower_steps_at_unchanged_prompts_is_a_degraded_device() {
    let d = run(Load {
        prefill_ms: 120.0,
        step_ms: 60.0,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::DegradedDevice, "{}", render(&d));
    assert!(crossed(&d, "decode_step_ms_p50"));
    assert!(!crossed(&d, "prompt_tokens_p99"));
}

#[test]
fn queue_growth_from_a_slow_device_is_still_the_device() {
    let d = run(Load {
        queue_ms: 800.0,
        prefill_ms: 120.0,
        step_ms: 60.0,
        ..Default::default()
    });
    assert_eq!(d.dominant_phase, Phase::Queue);
    assert_eq!(d.cause, Cause::DegradedDevice, "{}", render(&d));
}

#[test]
fn preemptions_at_steady_arrivals_are_kv_pressure() {
    let d = run(Load {
        queue_ms: 800.0,
        preemptions: 1,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::KvPressure, "{}", render(&d));
    assert!(crossed(&d, "preemptions_per_s"));
}

#[test]
fn kv_usage_from_engine_samples_is_kv_pressure() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(
        &mut inputs,
        200 * S,
        Load {
            queue_ms: 700.0,
            ..Default::default()
        },
    );
    for i in 0..20 {
        for (t0, usage) in [(100 * S, 0.4), (200 * S, 0.97)] {
            inputs.engine.push(EngineSample {
                mono_ns: t0 + i * S / 2,
                kv_cache_usage: Some(usage),
                requests_waiting: Some(if usage > 0.9 { 6.0 } else { 0.0 }),
                ..Default::default()
            });
        }
    }
    let base = TimeWindow {
        start_mono_ns: 100 * S,
        end_mono_ns: 110 * S,
    };
    let win = TimeWindow {
        start_mono_ns: 200 * S,
        end_mono_ns: 210 * S,
    };
    let d = diagnose(&inputs, base, win);
    assert_eq!(d.cause, Cause::KvPressure, "{}", render(&d));
    assert!(crossed(&d, "kv_cache_usage_p90"));
}

#[test]
fn more_prefill_steps_at_unchanged_prompts_is_scheduler_config() {
    let d = run(Load {
        prefill_ms: 150.0,
        prefill_steps: 4,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::SchedulerConfig, "{}", render(&d));
    // With longer prompts, the extra steps are the prompts' doing.
    let d = run(Load {
        prefill_ms: 150.0,
        prefill_steps: 4,
        prompt_tokens: 250,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
}

#[test]
fn device_outlier_flags_are_a_degraded_device() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(
        &mut inputs,
        200 * S,
        Load {
            prefill_ms: 150.0,
            ..Default::default()
        },
    );
    for i in 0..10 {
        for (t0, flagged) in [(100 * S, false), (200 * S, true)] {
            for dev in ["gpu0", "gpu1"] {
                inputs.devices.push(DeviceSample {
                    mono_ns: t0 + i * S,
                    device: dev.into(),
                    outlier: flagged && dev == "gpu1",
                    ..Default::default()
                });
            }
        }
    }
    let d = diagnose(
        &inputs,
        TimeWindow {
            start_mono_ns: 100 * S,
            end_mono_ns: 110 * S,
        },
        TimeWindow {
            start_mono_ns: 200 * S,
            end_mono_ns: 210 * S,
        },
    );
    assert_eq!(d.cause, Cause::DegradedDevice, "{}", render(&d));
    let e = d
        .evidence
        .iter()
        .find(|e| e.signal == "device_outlier_share")
        .unwrap();
    assert_eq!(e.detail.as_deref(), Some("gpu1"));
}

#[test]
fn one_slow_outlier_is_not_a_regression() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(&mut inputs, 200 * S, Load::default());
    inputs.requests.last_mut().unwrap().ttft_ms = Some(5_000.0);
    let d = diagnose(
        &inputs,
        TimeWindow {
            start_mono_ns: 100 * S,
            end_mono_ns: 110 * S,
        },
        TimeWindow {
            start_mono_ns: 200 * S,
            end_mono_ns: 210 * S,
        },
    );
    assert!(!d.regression, "{}", render(&d));
    assert_eq!(d.cause, Cause::None);
}

#[test]
fn too_few_requests_decides_nothing() {
    let d = run(Load {
        n: 3,
        queue_ms: 900.0,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::None);
    assert_eq!(d.confidence, 0.0);
    assert!(d.summary.contains("Not enough requests"));
}

#[test]
fn json_has_the_documented_fields() {
    let d = run(Load {
        n: 120,
        queue_ms: 900.0,
        ..Default::default()
    });
    let v = serde_json::to_value(&d).unwrap();
    for key in [
        "ttft_p99_ms",
        "queue_wait_p99_ms",
        "prefill_p99_ms",
        "dominant_phase",
        "cause",
        "evidence",
        "confidence",
    ] {
        assert!(v.get(key).is_some(), "{key}: {v}");
    }
    assert_eq!(v["cause"], "traffic_spike");
    assert_eq!(v["dominant_phase"], "queue");
    assert!(v["ttft_p99_ms"]["baseline"].is_f64());
    assert!(v["evidence"][0]["signal"].is_string());
}

/// Decode steps of `n` requests each: `(count, batch size, ms)` spread over a 10 s window.
fn steps_at(t0: u64, groups: &[(u64, u32, f64)]) -> Vec<StepSample> {
    let total: u64 = groups.iter().map(|g| g.0).sum();
    let mut i = 0;
    let mut out = Vec::new();
    for &(count, size, ms) in groups {
        for _ in 0..count {
            out.push(StepSample {
                start_mono_ns: t0 + i * 10 * S / total,
                duration_ms: ms,
                prefill_requests: 0,
                decode_requests: size,
            });
            i += 1;
        }
    }
    out
}

#[test]
fn steps_compare_at_the_same_batch_size() {
    let decode = |base: &[(u64, u32, f64)], incident: &[(u64, u32, f64)]| {
        let mut inputs = Inputs::default();
        add(&mut inputs, 100 * S, Load::default());
        add(
            &mut inputs,
            200 * S,
            Load {
                queue_ms: 600.0,
                ..Default::default()
            },
        );
        inputs.steps = steps_at(100 * S, base);
        inputs.steps.extend(steps_at(200 * S, incident));
        let d = diagnose(
            &inputs,
            TimeWindow {
                start_mono_ns: 100 * S,
                end_mono_ns: 110 * S,
            },
            TimeWindow {
                start_mono_ns: 200 * S,
                end_mono_ns: 210 * S,
            },
        );
        d.evidence
            .into_iter()
            .find(|e| e.signal == "decode_step_ms_p50")
    };
    // More load, more steps of 2 requests, each as fast as before: not a slower device,
    // although the median step grew.
    let e = decode(
        &[(80, 1, 13.0), (8, 2, 20.0)],
        &[(3, 1, 13.0), (90, 2, 20.0)],
    )
    .unwrap();
    assert!(!e.crossed, "{e:?}");
    assert_eq!(e.ratio, Some(1.0));
    // The same mix, every step 4x slower.
    let e = decode(
        &[(80, 1, 13.0), (8, 2, 20.0)],
        &[(3, 1, 52.0), (90, 2, 80.0)],
    )
    .unwrap();
    assert!(e.crossed, "{e:?}");
    assert_eq!(e.ratio, Some(4.0));
    // No batch size with enough baseline steps: no comparison.
    assert!(decode(&[(4, 1, 13.0)], &[(90, 2, 80.0)]).is_none());
    // The baseline only ran single requests, the incident only pairs: a pair may cost up to
    // two singles, so pairs at 1.3x a single are no slowdown, and pairs at 8x are 4x at least.
    let e = decode(&[(80, 1, 13.0)], &[(90, 2, 17.0)]).unwrap();
    assert!(!e.crossed, "{e:?}");
    let e = decode(&[(80, 1, 13.0)], &[(90, 2, 104.0)]).unwrap();
    assert!(e.crossed, "{e:?}");
    assert_eq!(e.ratio, Some(4.0));
    // Smaller batches than the baseline's are compared with the larger batch's cost.
    let e = decode(&[(80, 4, 30.0)], &[(90, 1, 29.0)]).unwrap();
    assert!(!e.crossed, "{e:?}");
}

#[test]
fn the_report_shows_the_split_the_cause_and_the_evidence() {
    let d = run(Load {
        n: 120,
        queue_ms: 900.0,
        ..Default::default()
    });
    let text = render(&d);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("P99 TTFT regressed"), "{text}");
    for needle in [
        "  TTFT ",
        "    queue wait ",
        "    prefill ",
        "Grew most: queue wait",
        "Cause:     traffic_spike - more requests arrived per second",
        "[x] arrival_rate_per_s",
        "[ ] prompt_tokens_p99",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    assert!(lines.iter().all(|l| l.len() == l.trim_end().len()));
}
