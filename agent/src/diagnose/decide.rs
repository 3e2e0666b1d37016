//! The rules: from two windows' signals to a phase, a cause and a confidence.
use super::{
    Cause, Diagnosis, Evidence, Pair, Phase, Test, TimeWindow, WindowSignals, thresholds as t,
};

fn ratio(b: Option<f64>, w: Option<f64>) -> Option<f64> {
    match (b, w) {
        (Some(b), Some(w)) if b > 0.0 => Some(w / b),
        _ => None,
    }
}

fn line(
    signal: &'static str,
    unit: &'static str,
    b: Option<f64>,
    w: Option<f64>,
    test: Test,
    threshold: Option<f64>,
    points_to: Cause,
) -> Evidence {
    let r = ratio(b, w);
    let crossed = match (test, threshold) {
        (Test::Ratio, Some(th)) => r.is_some_and(|r| r >= th),
        (Test::AtLeast, Some(th)) => w.is_some_and(|w| w >= th),
        _ => false,
    };
    Evidence {
        signal,
        unit,
        baseline: b,
        window: w,
        ratio: r,
        test,
        threshold,
        crossed,
        points_to,
        detail: None,
    }
}

/// The decode-step comparison: each decode-only step of the incident window against what the
/// baseline says a step of its batch size costs on the baseline's device. Batch sizes shift
/// with load, so a plain median would mix load into the device's speed. The baseline's median
/// at the same size is the reference; where the baseline lacks that size, the nearest size it
/// has enough steps of gives a bound that can only understate a slowdown: a step of k requests
/// costs at most k/j steps of j < k requests (batching is never slower than one by one), and
/// at most one step of j > k requests (fewer requests, less work).
fn decode_step_line(b: &WindowSignals, w: &WindowSignals) -> Option<Evidence> {
    let median = |v: &[f64]| v.get(v.len() / 2).copied();
    let reference: Vec<(u32, f64)> = b
        .decode_steps_ms
        .iter()
        .filter(|(_, v)| v.len() >= t::MIN_STEPS_PER_BATCH_SIZE)
        .filter_map(|(k, v)| median(v).filter(|m| *m > 0.0).map(|m| (*k, m)))
        .collect();
    let mut base_ms = Vec::new();
    let mut win_ms = Vec::new();
    let mut ratios = Vec::new();
    let mut pairs = Vec::new();
    for (k, vw) in &w.decode_steps_ms {
        let Some(&(j, mj)) = reference.iter().min_by_key(|(j, _)| j.abs_diff(*k)) else {
            continue;
        };
        let expected = if j < *k {
            mj * f64::from(*k) / f64::from(j)
        } else {
            mj
        };
        for d in vw {
            base_ms.push(expected);
            win_ms.push(*d);
            ratios.push(d / expected);
        }
        pairs.push(if j == *k {
            format!("{} steps of {k} vs the baseline's {k}", vw.len())
        } else {
            format!(
                "{} steps of {k} vs a bound from the baseline's {j}",
                vw.len()
            )
        });
    }
    if ratios.len() < t::MIN_STEPS_PER_BATCH_SIZE {
        return None;
    }
    for v in [&mut base_ms, &mut win_ms, &mut ratios] {
        v.sort_by(f64::total_cmp);
    }
    let mut e = line(
        "decode_step_ms_p50",
        "ms",
        median(&base_ms),
        median(&win_ms),
        Test::Ratio,
        Some(t::DEVICE_SLOWDOWN_RATIO),
        Cause::DegradedDevice,
    );
    // The median of per-step ratios against the reference for each step's batch size.
    e.ratio = median(&ratios);
    e.crossed = e.ratio.is_some_and(|r| r >= t::DEVICE_SLOWDOWN_RATIO);
    e.detail = Some(format!(
        "decode-only steps by requests in the batch: {}",
        pairs.join("; ")
    ));
    Some(e)
}

/// Every signal both windows have, each tagged with the cause it points to.
fn evidence(b: &WindowSignals, w: &WindowSignals) -> Vec<Evidence> {
    let mut ev = vec![
        line(
            "arrival_rate_per_s",
            "req/s",
            b.arrival_rate_per_s,
            w.arrival_rate_per_s,
            Test::Ratio,
            Some(t::ARRIVAL_RATE_RATIO),
            Cause::TrafficSpike,
        ),
        line(
            "admission_rate_per_s",
            "req/s",
            b.admission_rate_per_s,
            w.admission_rate_per_s,
            Test::Context,
            None,
            Cause::None,
        ),
        line(
            "requests_in_system_mean",
            "req",
            b.in_system_mean,
            w.in_system_mean,
            Test::Context,
            None,
            Cause::None,
        ),
        line(
            "kv_cache_usage_p90",
            "fraction",
            b.kv_usage_p90,
            w.kv_usage_p90,
            Test::AtLeast,
            Some(t::KV_USAGE_HIGH),
            Cause::KvPressure,
        ),
        line(
            "requests_waiting_mean",
            "req",
            b.requests_waiting_mean,
            w.requests_waiting_mean,
            Test::Context,
            None,
            Cause::None,
        ),
    ];
    // Preemptions: a floor on the rate and a rise over the baseline (a zero baseline counts
    // as a rise).
    let mut pre = line(
        "preemptions_per_s",
        "1/s",
        b.preemptions_per_s,
        w.preemptions_per_s,
        Test::AtLeast,
        Some(t::PREEMPTION_RATE_MIN_PER_S),
        Cause::KvPressure,
    );
    pre.crossed = pre.crossed
        && match (b.preemptions_per_s, w.preemptions_per_s) {
            (Some(bv), Some(wv)) => bv <= 0.0 || wv / bv >= t::PREEMPTION_RATE_RATIO,
            _ => true,
        };
    pre.detail = Some(format!(
        "at least {} /s and {}x the baseline",
        t::PREEMPTION_RATE_MIN_PER_S,
        t::PREEMPTION_RATE_RATIO
    ));
    ev.push(pre);
    // Prompts: tokens where both windows have them, else bytes of prompt text.
    let tokens_known = b.prompt_tokens_p99.is_some() && w.prompt_tokens_p99.is_some();
    let prompt = if tokens_known {
        line(
            "prompt_tokens_p99",
            "tokens",
            b.prompt_tokens_p99,
            w.prompt_tokens_p99,
            Test::Ratio,
            Some(t::PROMPT_GROWTH_RATIO),
            Cause::PromptGrowth,
        )
    } else {
        line(
            "prompt_bytes_p99",
            "bytes",
            b.prompt_bytes_p99,
            w.prompt_bytes_p99,
            Test::Ratio,
            Some(t::PROMPT_GROWTH_RATIO),
            Cause::PromptGrowth,
        )
    };
    let prompts_grew = prompt.crossed;
    ev.push(prompt);
    if let Some(e) = decode_step_line(b, w) {
        ev.push(e);
    }
    // Prefill time per prompt token decides only without step records: it also moves with
    // prompt length, cached prefixes and batching, which the decode-step comparison holds
    // constant.
    let have_steps = b.has_steps || w.has_steps;
    let mut per_token = line(
        "prefill_ms_per_prompt_token_p50",
        "ms/token",
        b.prefill_ms_per_token_p50,
        w.prefill_ms_per_token_p50,
        if have_steps {
            Test::Context
        } else {
            Test::Ratio
        },
        (!have_steps).then_some(t::DEVICE_SLOWDOWN_RATIO),
        if have_steps {
            Cause::None
        } else {
            Cause::DegradedDevice
        },
    );
    if have_steps {
        per_token.detail = Some("context: decode steps decide device speed".to_owned());
    }
    ev.push(per_token);
    let mut outlier = line(
        "device_outlier_share",
        "fraction",
        b.device_outlier_share,
        w.device_outlier_share,
        Test::AtLeast,
        Some(t::DEVICE_OUTLIER_SHARE),
        Cause::DegradedDevice,
    );
    outlier.crossed = outlier.crossed
        && b.device_outlier_share
            .is_none_or(|s| s < t::DEVICE_OUTLIER_SHARE);
    outlier.detail = w.outlier_device.clone();
    ev.push(outlier);
    let mut steps = line(
        "prefill_steps_per_request_p50",
        "steps",
        b.prefill_steps_p50,
        w.prefill_steps_p50,
        Test::Ratio,
        Some(t::PREFILL_STEPS_RATIO),
        Cause::SchedulerConfig,
    );
    steps.crossed = steps.crossed && !prompts_grew;
    steps.detail = Some("counts only while prompts did not grow".to_owned());
    ev.push(steps);
    ev.push(line(
        "step_ms_p50",
        "ms",
        b.step_ms_p50,
        w.step_ms_p50,
        Test::Context,
        None,
        Cause::None,
    ));
    ev.retain(|e| e.baseline.is_some() || e.window.is_some());
    ev
}

/// The order causes are tried in, given the phase that grew: changes in the workload (more
/// requests, longer prompts) before changes in capacity (memory, device, scheduler), because a
/// heavier workload also slows steps and fills memory; within that, the phase's own causes first.
fn order(phase: Phase) -> [Cause; 5] {
    use Cause::*;
    match phase {
        Phase::Prefill => [
            PromptGrowth,
            DegradedDevice,
            SchedulerConfig,
            TrafficSpike,
            KvPressure,
        ],
        Phase::Queue | Phase::None => [
            TrafficSpike,
            PromptGrowth,
            KvPressure,
            DegradedDevice,
            SchedulerConfig,
        ],
    }
}

fn delta(p: Pair<Option<f64>>) -> Option<f64> {
    Some(p.window? - p.baseline?)
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("?".to_owned(), |v| format!("{v:.0} ms"))
}

pub fn decide(
    b: &WindowSignals,
    w: &WindowSignals,
    baseline_window: TimeWindow,
    incident_window: TimeWindow,
) -> Diagnosis {
    let ttft = Pair {
        baseline: b.ttft_p99_ms,
        window: w.ttft_p99_ms,
    };
    let queue = Pair {
        baseline: b.queue_wait_p99_ms,
        window: w.queue_wait_p99_ms,
    };
    let prefill = Pair {
        baseline: b.prefill_p99_ms,
        window: w.prefill_p99_ms,
    };
    let over = b
        .ttft_p99_ms
        .map_or(0, |p| w.ttft_ms.iter().filter(|x| **x > p).count());
    let mut d = Diagnosis {
        baseline_window,
        incident_window,
        requests: Pair {
            baseline: b.requests,
            window: w.requests,
        },
        ttft_p99_ms: ttft,
        queue_wait_p99_ms: queue,
        prefill_p99_ms: prefill,
        regression: false,
        requests_over_baseline_p99: over,
        dominant_phase: Phase::None,
        cause: Cause::None,
        confidence: 0.0,
        also_crossed: Vec::new(),
        summary: String::new(),
        evidence: evidence(b, w),
        notes: Vec::new(),
    };
    if b.requests < t::MIN_REQUESTS_PER_WINDOW || w.requests < t::MIN_REQUESTS_PER_WINDOW {
        d.summary = format!(
            "Not enough requests to decide: {} in the baseline and {} in the incident window (at least {} each).",
            b.requests,
            w.requests,
            t::MIN_REQUESTS_PER_WINDOW
        );
        d.notes.push(d.summary.clone());
        return d;
    }
    let samples =
        0.5 + 0.5 * (b.requests.min(w.requests) as f64 / t::CONFIDENT_REQUESTS as f64).min(1.0);
    let ttft_ratio = ratio(ttft.baseline, ttft.window).unwrap_or(1.0);
    let ttft_delta = delta(ttft).unwrap_or(0.0);
    let needed = t::TTFT_REGRESSED_MIN_REQUESTS
        .max((t::TTFT_REGRESSED_SHARE * w.requests as f64).ceil() as usize);
    d.regression = ttft_ratio >= t::TTFT_REGRESSION_RATIO
        && ttft_delta >= t::TTFT_REGRESSION_MIN_MS
        && over >= needed;
    if !d.regression {
        let margin = ((t::TTFT_REGRESSION_RATIO - ttft_ratio) / (t::TTFT_REGRESSION_RATIO - 1.0))
            .clamp(0.0, 1.0);
        d.confidence = round2(samples * (0.5 + 0.5 * margin));
        d.summary = format!(
            "No TTFT regression: P99 TTFT {} -> {} (x{ttft_ratio:.2}; a regression needs x{} and +{} ms, carried by {needed} of {} requests; {over} were slower than the baseline P99).",
            fmt_ms(ttft.baseline),
            fmt_ms(ttft.window),
            t::TTFT_REGRESSION_RATIO,
            t::TTFT_REGRESSION_MIN_MS,
            w.requests
        );
        return d;
    }
    let (dq, dp) = (delta(queue), delta(prefill));
    d.dominant_phase = match (dq, dp) {
        (Some(q), Some(p)) if q >= p && q > 0.0 => Phase::Queue,
        (Some(_), Some(p)) if p > 0.0 => Phase::Prefill,
        _ => Phase::None,
    };
    if d.dominant_phase == Phase::None {
        d.notes.push(
            "queue wait and prefill are unknown (no scheduler hooks for this engine) or neither grew: causes are tried in the queue-first order".to_owned(),
        );
    }
    let crossed: Vec<Cause> = order(d.dominant_phase)
        .into_iter()
        .filter(|c| d.evidence.iter().any(|e| e.points_to == *c && e.crossed))
        .collect();
    let Some(&cause) = crossed.first() else {
        d.summary = format!(
            "P99 TTFT regressed {} -> {} (x{ttft_ratio:.1}), {}, but no measured signal crossed its threshold; see the evidence.",
            fmt_ms(ttft.baseline),
            fmt_ms(ttft.window),
            phase_text(d.dominant_phase)
        );
        return d;
    };
    d.cause = cause;
    d.also_crossed = crossed[1..].to_vec();
    // Deciding signals first, then the other crossed ones, then context.
    d.evidence.sort_by_key(|e| {
        if e.points_to == cause && e.crossed {
            0
        } else if e.crossed {
            1
        } else {
            2
        }
    });
    let strength = d
        .evidence
        .iter()
        .filter(|e| e.points_to == cause && e.crossed)
        .map(|e| {
            let v = match e.test {
                Test::Ratio => e.ratio.unwrap_or(0.0),
                _ => e.window.unwrap_or(0.0),
            };
            e.threshold.map_or(1.0, |th| v / th)
        })
        .fold(1.0_f64, f64::max);
    let margin = 0.5 + 0.5 * (strength - 1.0).clamp(0.0, 1.0);
    let clarity = match (dq, dp) {
        (Some(q), Some(p)) if q.abs() + p.abs() > 0.0 => {
            0.5 + 0.5 * (q - p).abs() / (q.abs() + p.abs())
        }
        _ => 0.75,
    };
    let ambiguity = if d.also_crossed.is_empty() { 1.0 } else { 0.75 };
    d.confidence = round2(samples * margin * clarity * ambiguity);
    let lead = d.evidence.first();
    let lead_text = lead.map_or(String::new(), |e| {
        format!(
            ": {} {} -> {}",
            e.signal,
            fmt_num(e.baseline),
            fmt_num(e.window)
        )
    });
    d.summary = format!(
        "P99 TTFT regressed {} -> {} (x{ttft_ratio:.1}), {}; cause: {}{lead_text}.",
        fmt_ms(ttft.baseline),
        fmt_ms(ttft.window),
        phase_text(d.dominant_phase),
        cause.as_str()
    );
    d
}

fn phase_text(p: Phase) -> &'static str {
    match p {
        Phase::Queue => "mostly queue wait",
        Phase::Prefill => "mostly prefill",
        Phase::None => "phase split unknown",
    }
}

pub fn fmt_num(v: Option<f64>) -> String {
    match v {
        None => "?".to_owned(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// Two decimals, within 0..=1 (extreme inputs can make a factor non-finite).
fn round2(v: f64) -> f64 {
    if v.is_finite() {
        ((v * 100.0).round() / 100.0).clamp(0.0, 1.0)
    } else {
        0.0
    }
}
