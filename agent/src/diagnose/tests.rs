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
    /// Requests per decode step.
    batch: u32,
    /// Disaggregated serving: the decode legs' wait for the remote KV cache (part of their
    /// queue wait).
    kv_wait_ms: Option<f64>,
    /// Clients keeping their connections: request i on connection i % clients; 0: a connection
    /// per request.
    clients: u64,
    /// Prompt tokens the engine's prefix cache served per request.
    cached_tokens: Option<u64>,
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
            batch: 2,
            kv_wait_ms: None,
            clients: 2,
            cached_tokens: None,
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
            request_id: format!("{t0}-{i}"),
            pid: (t0 / S) as u32,
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
            cached_tokens: load.cached_tokens,
            prompt_bytes: Some(load.prompt_tokens * 4),
            preemptions: Some(if i % 4 == 0 { load.preemptions } else { 0 }),
            first_token_mono_ns: None,
            disagg: load.kv_wait_ms.map(|k| input::DisaggSample {
                role: Some("decode".into()),
                kv_transfer_wait_ms: Some(k + jitter),
            }),
            connection_id: 1 + if load.clients == 0 {
                i
            } else {
                i % load.clients
            },
            ..Default::default()
        });
    }
    for i in 0..200 {
        inputs.steps.push(StepSample {
            start_mono_ns: t0 + i * 10 * S / 200,
            duration_ms: load.step_ms + (i % 3) as f64,
            prefill_requests: 0,
            decode_requests: load.batch,
            ..Default::default()
        });
    }
}

fn run(incident: Load) -> Diagnosis {
    run_from(Load::default(), incident)
}

fn run_from(baseline: Load, incident: Load) -> Diagnosis {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, baseline);
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

/// Disaggregated serving: the decode legs waited longer for the prefill server's KV cache at
/// unchanged arrivals, prompts and steps: the KV transfer, not demand.
#[test]
fn a_slower_kv_transfer_is_named() {
    let baseline = Load {
        queue_ms: 12.0,
        kv_wait_ms: Some(10.0),
        ..Default::default()
    };
    let d = run_from(
        baseline,
        Load {
            queue_ms: 402.0,
            kv_wait_ms: Some(400.0),
            ..Default::default()
        },
    );
    assert_eq!(d.dominant_phase, Phase::Queue);
    assert_eq!(d.cause, Cause::KvTransfer, "{}", render(&d));
    assert!(crossed(&d, "kv_transfer_wait_p99_ms"));
    assert!(!crossed(&d, "requests_in_system"), "{}", render(&d));
    assert!(d.summary.contains("kv_transfer"), "{}", d.summary);
    // The same queue growth without a longer transfer is not put on the transfer.
    let d = run_from(
        Load {
            queue_ms: 12.0,
            kv_wait_ms: Some(10.0),
            ..Default::default()
        },
        Load {
            n: 120,
            queue_ms: 402.0,
            kv_wait_ms: Some(10.0),
            ..Default::default()
        },
    );
    assert_eq!(d.cause, Cause::TrafficSpike, "{}", render(&d));
    assert!(!crossed(&d, "kv_transfer_wait_p99_ms"));
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
                ..Default::default()
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
    assert!(lines[0].starts_with("Regressed: TTFT P99"), "{text}");
    assert!(lines[0].contains("P99 TTFT regressed"), "{text}");
    for needle in [
        "  TTFT ",
        "    queue wait ",
        "    prefill ",
        "Grew most: queue wait",
        "Cause:     traffic_spike - demand rose",
        "Load form: rate",
        "[x] arrival_rate_per_s",
        "[ ] prompt_tokens_p99",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    assert!(lines.iter().all(|l| l.len() == l.trim_end().len()));
}

fn windows() -> (TimeWindow, TimeWindow) {
    (
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

fn evidence<'a>(d: &'a Diagnosis, signal: &str) -> &'a Evidence {
    d.evidence
        .iter()
        .find(|e| e.signal == signal)
        .unwrap_or_else(|| panic!("no {signal}:\n{}", render(&d.clone())))
}

/// The headline case: more clients in a closed loop. Arrivals can never outrun the service
/// rate, so the rate barely moves (x1.1); the clients show as requests in the system.
#[test]
fn more_clients_in_a_closed_loop_is_a_traffic_spike_by_concurrency() {
    let d = run(Load {
        n: 44,
        queue_ms: 1200.0,
        clients: 8,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::TrafficSpike, "{}", render(&d));
    assert_eq!(d.traffic_form, Some(LoadForm::Concurrency));
    assert!(!crossed(&d, "arrival_rate_per_s"));
    let e = evidence(&d, "requests_in_system");
    assert!(e.crossed, "{e:?}");
    assert!(e.ratio.unwrap() > 3.0, "{e:?}");
    // L = rate x time in system: 4.4/s x (1.2 + 0.36) s.
    assert!((e.window.unwrap() - 4.4 * 1.562).abs() < 0.2, "{e:?}");
    assert!(e.detail.as_deref().unwrap().contains("Little's law"));
    assert_eq!(d.evidence[0].signal, "requests_in_system");
    assert_eq!(d.causes.len(), 1);
    assert!(render(&d).contains("Load form: concurrency"));
}

#[test]
fn more_in_the_system_because_steps_slowed_is_the_device_not_demand() {
    let d = run(Load {
        n: 44,
        queue_ms: 1200.0,
        step_ms: 60.0,
        clients: 8,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::DegradedDevice, "{}", render(&d));
    let e = evidence(&d, "requests_in_system");
    assert!(!e.crossed);
    assert!(
        e.detail
            .as_deref()
            .unwrap()
            .contains("not counted: capacity fell (decode_step_ms_p50)"),
        "{e:?}"
    );
    assert_eq!(d.traffic_form, None);
}

#[test]
fn longer_service_alone_is_not_more_clients() {
    // Open loop, same arrivals, prompts x3: requests stay longer in the engine, and some queue
    // behind them. Scaled to the baseline's engine time, requests in the system did not grow.
    let d = run(Load {
        queue_ms: 60.0,
        prefill_ms: 400.0,
        prompt_tokens: 150,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
    let e = evidence(&d, "requests_in_system");
    assert!(!e.crossed, "{e:?}");
    assert!(e.ratio.unwrap() < 1.5, "{e:?}");
    assert_eq!(d.secondary_cause, Cause::None);
}

#[test]
fn fewer_slots_while_requests_wait_is_scheduler_config() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(
        &mut inputs,
        200 * S,
        Load {
            queue_ms: 900.0,
            batch: 1,
            ..Default::default()
        },
    );
    for (pid, slots) in [(100, "2"), (200, "1")] {
        inputs.configs.push(EngineConfigSample {
            mono_ns: pid * S,
            pid: pid as u32,
            engine: "llamacpp".into(),
            settings: [("n_parallel".to_owned(), slots.to_owned())].into(),
        });
    }
    let (b, w) = windows();
    let d = diagnose(&inputs, b, w);
    assert_eq!(d.cause, Cause::SchedulerConfig, "{}", render(&d));
    let e = evidence(&d, "batch_requests_max");
    assert!(e.crossed, "{e:?}");
    assert_eq!((e.baseline, e.window), (Some(2.0), Some(1.0)));
    // Requests in the system grew, but capacity fell: not counted as demand.
    assert!(!crossed(&d, "requests_in_system"));
    assert_eq!(
        d.engine_config_changes,
        vec![ConfigChange {
            setting: "n_parallel".into(),
            baseline: Some("2".into()),
            window: Some("1".into()),
        }]
    );
    assert!(render(&d).contains("Engine config (command line): n_parallel 2 -> 1"));
}

#[test]
fn more_clients_with_longer_prompts_ranks_both_causes() {
    let d = run(Load {
        n: 44,
        queue_ms: 3000.0,
        prefill_ms: 500.0,
        prompt_tokens: 150,
        clients: 8,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::TrafficSpike, "{}", render(&d));
    assert_eq!(d.secondary_cause, Cause::PromptGrowth, "{}", render(&d));
    assert_eq!(d.causes.len(), 2);
    let (first, second) = (&d.causes[0], &d.causes[1]);
    assert!(first.share > second.share && second.share >= 0.2, "{d:?}");
    assert!((first.share + second.share - 1.0).abs() < 0.02, "{d:?}");
    let growth = d.ttft_p99_ms.window.unwrap() - d.ttft_p99_ms.baseline.unwrap();
    assert!((first.explains_ms + second.explains_ms - growth).abs() < growth * 0.02);
    assert_eq!(first.signals, ["requests_in_system"]);
    assert_eq!(second.signals, ["prompt_tokens_p99"]);
    // The secondary cause's evidence comes right after the primary's.
    assert_eq!(d.evidence[1].signal, "prompt_tokens_p99");
    let text = render(&d);
    assert!(text.contains("Secondary: prompt_growth"), "{text}");
    assert!(text.contains("Growth:    traffic_spike"), "{text}");
    assert!(
        d.summary.contains("secondary: prompt_growth"),
        "{}",
        d.summary
    );
}

#[test]
fn prompt_growth_with_a_bit_more_traffic_keeps_prompts_first() {
    // Prefill carries the growth; a rise in arrivals also crossed.
    let d = run(Load {
        n: 64,
        queue_ms: 40.0,
        prefill_ms: 500.0,
        prompt_tokens: 300,
        ..Default::default()
    });
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
    assert!(
        d.also_crossed.contains(&Cause::TrafficSpike),
        "{}",
        render(&d)
    );
}

#[test]
fn kv_pressure_names_rate_usage_and_the_preempted_requests() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(
        &mut inputs,
        200 * S,
        Load {
            queue_ms: 800.0,
            preemptions: 2,
            ..Default::default()
        },
    );
    for i in 0..20u64 {
        for (t0, usage, preempted) in [(100 * S, 0.55, 0.0), (200 * S, 0.98, 2.0 * i as f64)] {
            inputs.engine.push(EngineSample {
                mono_ns: t0 + i * S / 2,
                kv_cache_usage: Some(usage),
                requests_waiting: Some(if usage > 0.9 { 5.0 } else { 0.0 }),
                requests_running: Some(2.0),
                preemptions_total: Some(preempted),
            });
        }
    }
    let (b, w) = windows();
    let d = diagnose(&inputs, b, w);
    assert_eq!(d.cause, Cause::KvPressure, "{}", render(&d));
    assert!(crossed(&d, "kv_cache_usage_p90"));
    let pre = evidence(&d, "preemptions_per_s");
    assert!(pre.crossed);
    // The engine's counter: 2 preemptions per 0.5 s sample.
    assert!((pre.window.unwrap() - 4.0).abs() < 0.01, "{pre:?}");
    // Every 4th request of 40 was preempted: ids 200000000000-0, -4, ...
    assert_eq!(d.preempted_count, 10);
    assert_eq!(d.preempted_requests[0], format!("{}-0", 200 * S));
    assert!(pre.detail.as_deref().unwrap().contains("10 request(s)"));
    assert!(render(&d).contains("Preempted in the incident window: 10 request(s)"));
    // The queue grew from memory, not demand.
    assert!(!crossed(&d, "requests_in_system"));
    assert!(!d.missing.iter().any(|m| m.contains("kv_pressure")));
}

#[test]
fn a_window_outside_the_recording_decides_nothing_and_says_why() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(&mut inputs, 200 * S, Load::default());
    let d = diagnose(
        &inputs,
        windows().0,
        TimeWindow {
            start_mono_ns: 900 * S,
            end_mono_ns: 910 * S,
        },
    );
    assert_eq!(d.cause, Cause::None);
    assert!(!d.regression);
    assert_eq!(d.confidence, 0.0);
    assert!(
        d.summary.contains("the incident window")
            && d.summary.contains("starts after the recording ends"),
        "{}",
        d.summary
    );
    let d = diagnose(&Inputs::default(), windows().0, windows().1);
    assert!(d.summary.contains("no requests"), "{}", d.summary);
}

#[test]
fn too_few_requests_says_which_window() {
    let d = run(Load {
        n: 3,
        queue_ms: 900.0,
        ..Default::default()
    });
    assert!(
        d.summary.contains("widen the incident window"),
        "{}",
        d.summary
    );
}

#[test]
fn without_steps_or_engine_metrics_it_says_what_is_missing() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(
        &mut inputs,
        200 * S,
        Load {
            n: 44,
            queue_ms: 1200.0,
            clients: 8,
            ..Default::default()
        },
    );
    let with_steps = {
        let (b, w) = windows();
        diagnose(&inputs, b, w)
    };
    inputs.steps.clear();
    for r in &mut inputs.requests {
        r.preemptions = None;
    }
    let (b, w) = windows();
    let d = diagnose(&inputs, b, w);
    assert!(
        d.missing.iter().any(|m| m.contains("no step records")),
        "{:?}",
        d.missing
    );
    assert!(
        d.missing
            .iter()
            .any(|m| m.contains("kv_pressure cannot be judged")),
        "{:?}",
        d.missing
    );
    // The demand signal still shows, with less confidence: a slower device is not ruled out.
    assert_eq!(d.cause, Cause::TrafficSpike);
    assert!(
        d.confidence < with_steps.confidence,
        "{} vs {}",
        d.confidence,
        with_steps.confidence
    );
    assert!(render(&d).contains("Missing: no step records"));
}

#[test]
fn a_regression_no_signal_explains_stays_none() {
    // Prefill doubled: same prompts, same steps, same arrivals (e.g. a cache that stopped
    // hitting): nothing measured explains it.
    let d = run(Load {
        prefill_ms: 200.0,
        ..Default::default()
    });
    assert!(d.regression, "{}", render(&d));
    assert_eq!(d.cause, Cause::None, "{}", render(&d));
    assert_eq!(d.unexplained_share, Some(1.0));
    assert!(d.causes.is_empty());
}

#[test]
fn engine_flags_reach_the_diagnosis_through_the_plugin() {
    let args = [
        "/usr/bin/llama-server",
        "-m",
        "m.gguf",
        "-np",
        "1",
        "-b",
        "16",
    ];
    let settings = crate::engines::scheduler_config("llamacpp", &args);
    assert_eq!(settings.get("n_parallel").map(String::as_str), Some("1"));
    assert_eq!(settings.get("n_batch").map(String::as_str), Some("16"));
    let vllm = crate::engines::scheduler_config(
        "vllm",
        &[
            "vllm",
            "serve",
            "m",
            "--max-num-batched-tokens=256",
            "--max-num-seqs",
            "8",
        ],
    );
    assert_eq!(vllm.len(), 2, "{vllm:?}");
    assert!(crate::engines::scheduler_config("custom", &args).is_empty());
}

/// Open loop, same arrivals, prompts x2.5 and the engine overloaded: each request waits longer
/// than the one before (the backlog grows through the window). Requests in the system soar, but
/// that is arrivals outrunning the heavier work, not more clients.
#[test]
fn an_open_loop_overload_from_longer_prompts_is_not_more_clients() {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, Load::default());
    add(
        &mut inputs,
        200 * S,
        Load {
            prefill_ms: 120.0,
            prompt_tokens: 125,
            ..Default::default()
        },
    );
    // The backlog: the i-th request of the incident waits i x 150 ms.
    for (i, r) in inputs
        .requests
        .iter_mut()
        .filter(|r| r.arrival_mono_ns >= 200 * S)
        .enumerate()
    {
        let q = 150.0 * i as f64;
        let admitted = r.arrival_mono_ns + (q * 1e6) as u64;
        r.end_mono_ns = admitted + (r.end_mono_ns - r.admitted_mono_ns.unwrap());
        r.admitted_mono_ns = Some(admitted);
        r.queue_wait_ms = Some(q);
        r.ttft_ms = Some(q + r.prefill_ms.unwrap());
    }
    let (b, w) = windows();
    let d = diagnose(&inputs, b, w);
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
    let e = evidence(&d, "requests_in_system");
    assert!(!e.crossed, "{e:?}");
    assert!(
        e.detail.as_deref().unwrap().contains("still filling up"),
        "{e:?}"
    );
}

/// More arrivals and slower steps at once: the heavier workload takes the queue growth (it also
/// slows steps); the device is still listed.
#[test]
fn a_workload_cause_takes_the_queue_before_a_capacity_cause() {
    let d = run(Load {
        n: 120,
        queue_ms: 900.0,
        step_ms: 40.0,
        ..Default::default()
    });
    assert!(crossed(&d, "decode_step_ms_p50"), "{}", render(&d));
    assert_eq!(d.cause, Cause::TrafficSpike, "{}", render(&d));
    assert!(d.also_crossed.contains(&Cause::DegradedDevice));
    assert_eq!(d.secondary_cause, Cause::None, "{}", render(&d));
}

/// vLLM's IPC names no request in the chunked-prefill steps before its first token: the records
/// carry no prefill step count, and the steps of the request's engine between its admission and
/// its first token stand in (1 step per prompt before, 6 with a smaller token budget).
#[test]
fn prefill_steps_from_the_engine_steps_where_records_have_none() {
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
    let mut steps = Vec::new();
    for r in &mut inputs.requests {
        r.prefill_steps = None;
        let admitted = r.admitted_mono_ns.unwrap();
        let first = admitted + (r.prefill_ms.unwrap() * 1e6) as u64;
        r.first_token_mono_ns = Some(first);
        let k = if r.prefill_ms.unwrap() > 100.0 { 6 } else { 1 };
        // The last one produced the first token; one more ends after it.
        for i in 1..=k + 1 {
            steps.push(StepSample {
                pid: r.pid,
                end_mono_ns: admitted + (first - admitted) * i / k,
                duration_ms: 20.0,
                ..Default::default()
            });
        }
    }
    inputs.steps.extend(steps);
    let (b, w) = windows();
    let d = diagnose(&inputs, b, w);
    let e = evidence(&d, "prefill_steps_per_request_p50");
    assert_eq!((e.baseline, e.window), (Some(1.0), Some(6.0)), "{e:?}");
    assert_eq!(d.cause, Cause::SchedulerConfig, "{}", render(&d));
    // Without the engine's steps there is no count, and no such cause.
    inputs.steps.retain(|s| s.pid == 0);
    let d = diagnose(&inputs, b, w);
    assert!(
        !crossed(&d, "prefill_steps_per_request_p50"),
        "{}",
        render(&d)
    );
}

/// Issue #46's case: an open loop at an unchanged arrival rate (a connection per request),
/// prompts x2.54, and the engine's time per request x6.6 on a slow phase of the machine, so
/// requests in the system rose x4.8 by Little's law. Scaled by the prompts' growth alone that
/// looked like x1.9 the clients; scaled by the engine's own time per request it is x0.73: the
/// slower service, not more clients. It is prompt growth.
fn slower_service_at_the_same_rate(clients: u64) -> Diagnosis {
    let mut inputs = Inputs::default();
    add(
        &mut inputs,
        100 * S,
        Load {
            queue_ms: 200.0,
            clients,
            ..Default::default()
        },
    );
    add(
        &mut inputs,
        200 * S,
        Load {
            queue_ms: 349.0,
            prefill_ms: 100.0,
            prompt_tokens: 136,
            clients,
            ..Default::default()
        },
    );
    // Engine time per request 344 ms -> 2270 ms (the decode after the first token slowed).
    for r in inputs
        .requests
        .iter_mut()
        .filter(|r| r.arrival_mono_ns >= 200 * S)
    {
        r.end_mono_ns = r.admitted_mono_ns.unwrap() + 2_270_000_000;
    }
    let (b, w) = windows();
    diagnose(&inputs, b, w)
}

#[test]
fn more_in_the_system_at_an_unchanged_arrival_rate_is_not_more_clients() {
    let d = slower_service_at_the_same_rate(0);
    let r = |s: &str| evidence(&d, s).ratio.unwrap();
    // The reported figures.
    assert!(
        (r("arrival_rate_per_s") - 1.0).abs() < 0.01,
        "{}",
        render(&d)
    );
    assert!(
        (r("prompt_tokens_p99") - 2.54).abs() < 0.02,
        "{}",
        render(&d)
    );
    assert!(
        (r("engine_time_per_request_ms") - 6.6).abs() < 0.05,
        "{}",
        render(&d)
    );
    let e = evidence(&d, "requests_in_system");
    let detail = e.detail.as_deref().unwrap();
    assert!(detail.contains("x4.8"), "{detail}");
    // x4.8 / x2.54 (the prompts) passed for more clients; x4.8 / x6.6 (the engine) does not.
    assert!((e.ratio.unwrap() - 4.82 / 6.64).abs() < 0.02, "{e:?}");
    assert!(!e.crossed, "{e:?}");
    assert!(detail.contains("/ x6.6"), "{detail}");
    assert!(detail.contains("arrival rate x1.00"), "{detail}");
    assert_eq!(d.dominant_phase, Phase::Queue, "{}", render(&d));
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
    assert!(
        !d.also_crossed.contains(&Cause::TrafficSpike),
        "{}",
        render(&d)
    );
    assert_eq!(d.traffic_form, None);
    // Connections carried one request each: they count requests, not clients (no line).
    assert!(
        d.evidence.iter().all(|e| e.signal != "client_connections"),
        "{}",
        render(&d)
    );
}

/// The same slowdown with clients that keep their connections: the same two clients in both
/// windows, so not more demand either.
#[test]
fn the_same_keep_alive_clients_with_slower_service_are_not_more_clients() {
    let d = slower_service_at_the_same_rate(2);
    let c = evidence(&d, "client_connections");
    assert!((c.ratio.unwrap() - 1.0).abs() < 0.05, "{c:?}");
    assert!((c.window.unwrap() - 2.0).abs() < 0.2, "{c:?}");
    let e = evidence(&d, "requests_in_system");
    assert!(!e.crossed, "{e:?}");
    assert!(
        e.detail
            .as_deref()
            .unwrap()
            .contains("client connections x1.0"),
        "{e:?}"
    );
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
    assert!(
        !d.also_crossed.contains(&Cause::TrafficSpike),
        "{}",
        render(&d)
    );
}

/// More requests in the system and a longer queue at the same rate and the same work, from the
/// same two keep-alive clients: no rise in clients or arrivals, so no traffic spike (no signal
/// names a cause).
#[test]
fn a_longer_queue_at_the_same_demand_is_not_a_traffic_spike() {
    let d = run(Load {
        queue_ms: 1200.0,
        ..Default::default()
    });
    let e = evidence(&d, "requests_in_system");
    assert!(e.ratio.unwrap() > 3.0 && !e.crossed, "{e:?}");
    assert!(
        e.detail
            .as_deref()
            .unwrap()
            .contains("not counted: demand did not rise"),
        "{e:?}"
    );
    assert_ne!(d.cause, Cause::TrafficSpike, "{}", render(&d));
}

/// The suite's mixed scenario as it ran live: 2 -> 10 closed-loop clients that open a connection
/// per request, prompts x1.7. Heavier requests lower the service rate, so the arrival rate fell
/// (x0.75) however many more clients there were, and connections cannot count them; the
/// requests in the system at the engine's own time per request (x8 / x2.3) show them.
#[test]
fn more_clients_opening_a_connection_per_request_with_longer_prompts_rank_both_causes() {
    let d = run_from(
        Load {
            clients: 0,
            ..Default::default()
        },
        Load {
            n: 30,
            queue_ms: 3000.0,
            prefill_ms: 500.0,
            prompt_tokens: 150,
            clients: 0,
            ..Default::default()
        },
    );
    assert!((evidence(&d, "arrival_rate_per_s").ratio.unwrap() - 0.75).abs() < 0.01);
    assert_eq!(d.cause, Cause::TrafficSpike, "{}", render(&d));
    assert_eq!(d.secondary_cause, Cause::PromptGrowth, "{}", render(&d));
    assert_eq!(d.traffic_form, Some(LoadForm::Concurrency));
    let e = evidence(&d, "requests_in_system");
    assert!(e.crossed, "{e:?}");
    assert!(
        e.detail.as_deref().unwrap().contains("not countable"),
        "{e:?}"
    );
}

/// Keep-alive clients are counted whatever the window's length: two clients over 10 s and
/// eight over 10 s read 2 and 8, and the headline closed-loop case crosses by them.
#[test]
fn client_connections_count_keep_alive_clients() {
    let d = run(Load {
        n: 44,
        queue_ms: 1200.0,
        clients: 8,
        ..Default::default()
    });
    let c = evidence(&d, "client_connections");
    assert!((c.baseline.unwrap() - 2.0).abs() < 0.2, "{c:?}");
    assert!((c.window.unwrap() - 8.0).abs() < 0.8, "{c:?}");
    assert!(
        evidence(&d, "requests_in_system")
            .detail
            .as_deref()
            .unwrap()
            .contains("client connections x3.7"),
        "{}",
        render(&d)
    );
}

#[test]
fn records_without_a_connection_id_read_as_unknown() {
    let (v, _): (Vec<RequestSample>, _) =
        input::read_jsonl(&br#"{"arrival_mono_ns":5,"end_mono_ns":9}"#[..]).unwrap();
    assert_eq!(v[0].connection_id, 0);
}

/// Prompts of the same length, but the engine's prefix cache stopped serving them (a router
/// sent requests away from the replica holding their prefix): ten times the prompt tokens to
/// compute, so prefill grew. Prefix-cache misses, not prompt growth and not a slower device.
#[test]
fn fewer_cached_prompt_tokens_at_the_same_prompt_size_are_prefix_cache_misses() {
    let cached = Load {
        prompt_tokens: 500,
        cached_tokens: Some(450),
        ..Default::default()
    };
    let missed = Load {
        prompt_tokens: 500,
        cached_tokens: Some(0),
        prefill_ms: 400.0,
        ..Default::default()
    };
    let d = run_from(cached, missed);
    assert_eq!(d.dominant_phase, Phase::Prefill, "{}", render(&d));
    assert_eq!(d.cause, Cause::PrefixCacheMiss, "{}", render(&d));
    assert!(crossed(&d, "prefill_tokens_computed_p50"));
    assert!(!crossed(&d, "prompt_tokens_p99"));
    let e = d
        .evidence
        .iter()
        .find(|e| e.signal == "prefill_tokens_computed_p50")
        .unwrap();
    assert!(e.ratio.unwrap() > 5.0, "{e:?}");
    // The control: the same cache hits twice.
    let same = run_from(
        Load {
            prompt_tokens: 500,
            cached_tokens: Some(450),
            ..Default::default()
        },
        Load {
            prompt_tokens: 500,
            cached_tokens: Some(450),
            ..Default::default()
        },
    );
    assert_eq!(same.cause, Cause::None);
    assert!(!crossed(&same, "prefill_tokens_computed_p50"));
}

/// Longer prompts also mean more tokens to compute: prompt growth, never a cache miss.
#[test]
fn longer_prompts_with_the_same_cache_hits_are_prompt_growth() {
    let d = run_from(
        Load {
            cached_tokens: Some(10),
            ..Default::default()
        },
        Load {
            prompt_tokens: 400,
            cached_tokens: Some(10),
            prefill_ms: 400.0,
            ..Default::default()
        },
    );
    assert_eq!(d.cause, Cause::PromptGrowth, "{}", render(&d));
    assert!(!crossed(&d, "prefill_tokens_computed_p50"));
}
