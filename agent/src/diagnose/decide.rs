//! The rules: from two windows' signals to a phase, a cause and a confidence.
use inferscope_model::{clock::ms_text, quantile::percentile, thresholds as t};

use super::{
    Cause, CauseShare, ConfigChange, Diagnosis, Evidence, Inputs, LoadForm, Pair, Phase, Test,
    TimeWindow, Timeline, WindowSignals, human_ns,
};

pub(super) fn ratio(b: Option<f64>, w: Option<f64>) -> Option<f64> {
    match (b, w) {
        (Some(b), Some(w)) if b > 0.0 => Some(w / b),
        _ => None,
    }
}

pub(super) fn line(
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
        (Test::RatioAtMost, Some(th)) => r.is_some_and(|r| r <= th),
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
    let reference: Vec<(u32, f64)> = b
        .decode_steps_ms
        .iter()
        .filter(|(_, v)| v.len() >= t::MIN_STEPS_PER_BATCH_SIZE)
        .filter_map(|(k, v)| percentile(v, 0.5).filter(|m| *m > 0.0).map(|m| (*k, m)))
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
        percentile(&base_ms, 0.5),
        percentile(&win_ms, 0.5),
        Test::Ratio,
        Some(t::DEVICE_SLOWDOWN_RATIO),
        Cause::DegradedDevice,
    );
    // The median of per-step ratios against the reference for each step's batch size.
    e.ratio = percentile(&ratios, 0.5);
    e.crossed = e.ratio.is_some_and(|r| r >= t::DEVICE_SLOWDOWN_RATIO);
    e.detail = Some(format!(
        "decode-only steps by requests in the batch: {}",
        pairs.join("; ")
    ));
    Some(e)
}

/// Every signal both windows have, each tagged with the cause it points to.
fn evidence(b: &WindowSignals, w: &WindowSignals) -> Vec<Evidence> {
    let mut arrivals = line(
        "arrival_rate_per_s",
        "req/s",
        b.arrival_rate_per_s,
        w.arrival_rate_per_s,
        Test::Ratio,
        Some(t::ARRIVAL_RATE_RATIO),
        Cause::TrafficSpike,
    );
    arrivals.detail = Some("open-loop form: more requests per second".to_owned());
    let mut admission = line(
        "admission_rate_per_s",
        "req/s",
        b.admission_rate_per_s,
        w.admission_rate_per_s,
        Test::Context,
        None,
        Cause::None,
    );
    admission.detail = ratio(w.arrival_rate_per_s, w.admission_rate_per_s)
        .map(|r| format!("admitted / arrived in the incident window: {r:.2}"));
    let mut clients = line(
        "client_connections",
        "conn",
        b.clients_mean,
        w.clients_mean,
        Test::Context,
        None,
        Cause::None,
    );
    clients.detail = Some(
        match (b.requests_per_connection, w.requests_per_connection) {
            (Some(rb), Some(rw)) if b.clients_mean.is_some() && w.clients_mean.is_some() => {
                format!(
                    "client connections open, time-averaged: the closed loop's demand ({rb:.1} -> {rw:.1} requests per connection)"
                )
            }
            (Some(rb), Some(rw)) => format!(
                "not counted as clients: {rb:.1} -> {rw:.1} requests per connection (needs {} in both windows: a connection per request counts requests, not clients)",
                t::CONNECTION_REUSE_MIN
            ),
            _ => "no connection ids in the records".to_owned(),
        },
    );
    let mut ev = vec![
        arrivals,
        in_system_line(b, w),
        clients,
        admission,
        line(
            "queue_wait_share",
            "fraction",
            b.queue_wait_share,
            w.queue_wait_share,
            Test::Context,
            None,
            Cause::None,
        ),
        line(
            "engine_time_per_request_ms",
            "ms",
            b.engine_time_mean_ms,
            w.engine_time_mean_ms,
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
            "kv_transfer_wait_p99_ms",
            "ms",
            b.kv_transfer_wait_p99_ms,
            w.kv_transfer_wait_p99_ms,
            Test::Ratio,
            Some(t::KV_TRANSFER_WAIT_RATIO),
            Cause::KvTransfer,
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
        "at least {} /s and {}x the baseline{}",
        t::PREEMPTION_RATE_MIN_PER_S,
        t::PREEMPTION_RATE_RATIO,
        if w.preempted_requests > 0 {
            format!(
                "; preempted in the incident window: {} request(s): {}{}",
                w.preempted_requests,
                w.preempted_ids.join(", "),
                if w.preempted_requests > w.preempted_ids.len() {
                    ", ..."
                } else {
                    ""
                }
            )
        } else {
            String::new()
        }
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
    let mut computed = line(
        "prefill_tokens_computed_p50",
        "tokens",
        b.computed_tokens_p50,
        w.computed_tokens_p50,
        Test::Ratio,
        Some(t::PREFIX_CACHE_MISS_RATIO),
        Cause::PrefixCacheMiss,
    );
    computed.crossed &= !prompts_grew;
    computed.detail = Some(format!(
        "prompt tokens the engine computed (less its prefix cache's), per request; counts only while prompts did not grow; cached share of the prompts {} -> {}",
        fmt_num(b.cached_share),
        fmt_num(w.cached_share)
    ));
    ev.push(computed);
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
    // Fewer slots: the engine ran fewer requests per step while requests waited for one.
    let mut batch = line(
        "batch_requests_max",
        "req",
        b.batch_requests_max,
        w.batch_requests_max,
        Test::RatioAtMost,
        Some(t::BATCH_MAX_FALL_RATIO),
        Cause::SchedulerConfig,
    );
    let waited = w
        .in_system_littles
        .zip(w.batch_requests_max)
        .is_some_and(|(l, m)| l > m)
        && queue_grew(b, w);
    batch.crossed = batch.crossed && waited;
    batch.detail =
        Some("the most requests one step carried; counts only while requests waited".to_owned());
    ev.push(batch);
    ev.push(line(
        "step_ms_p50",
        "ms",
        b.step_ms_p50,
        w.step_ms_p50,
        Test::Context,
        None,
        Cause::None,
    ));
    gate_concurrency(&mut ev);
    ev.retain(|e| e.baseline.is_some() || e.window.is_some());
    ev
}

fn queue_grew(b: &WindowSignals, w: &WindowSignals) -> bool {
    match (b.queue_wait_p99_ms, w.queue_wait_p99_ms) {
        (Some(bq), Some(wq)) => wq > bq,
        // Without the split, the time in the system stands in for it.
        _ => ratio(b.time_in_system_mean_s, w.time_in_system_mean_s).is_some_and(|r| r > 1.0),
    }
}

/// Whether demand rose, the cause the closed-loop form needs (more requests in the system alone
/// is what any slowdown produces): the arrival rate crossed, or the clients grew, counted as
/// client connections where connections carry several requests each. Where connections cannot
/// count clients (a connection per request, or no connection ids) the test is left to the
/// requests in the system scaled by the engine's own time per request: a closed loop's arrival
/// rate cannot stand for its clients (it falls with heavier requests however many clients
/// there are). Returns the verdict (None: clients not countable) and its words.
fn demand_rose(b: &WindowSignals, w: &WindowSignals) -> (Option<bool>, String) {
    let rate = ratio(b.arrival_rate_per_s, w.arrival_rate_per_s);
    let clients = ratio(b.clients_mean, w.clients_mean);
    let rate_crossed = rate.is_some_and(|r| r >= t::ARRIVAL_RATE_RATIO);
    match clients {
        Some(c) => (
            Some(rate_crossed || c >= t::CLIENTS_RATIO),
            format!(
                "client connections x{c:.2} (needs x{}), arrival rate x{}",
                t::CLIENTS_RATIO,
                fmt_num(rate)
            ),
        ),
        None => (
            None,
            format!(
                "client connections not countable (a connection per request, or no ids), arrival rate x{}",
                fmt_num(rate)
            ),
        ),
    }
}

/// The closed-loop form of demand: requests in the system by Little's law (arrival rate x mean
/// time in system), scaled to the baseline's work per request, measured by the engine's own time
/// per request (admission to end; the prompt-token growth only where that is unknown), so that
/// heavier or slower requests do not pass for more clients (token counts alone understate a
/// request that also got slower per token); counted only while demand rose (more clients or
/// more arrivals: see `demand_rose`) and while the system stayed full rather than still filling
/// up (see IN_SYSTEM_TREND_MAX).
fn in_system_line(b: &WindowSignals, w: &WindowSignals) -> Evidence {
    let mut e = line(
        "requests_in_system",
        "req",
        b.in_system_littles,
        w.in_system_littles,
        Test::Ratio,
        Some(t::IN_SYSTEM_RATIO),
        Cause::TrafficSpike,
    );
    let work = ratio(b.engine_time_mean_ms, w.engine_time_mean_ms)
        .or_else(|| {
            ratio(b.prompt_tokens_p99, w.prompt_tokens_p99)
                .or_else(|| ratio(b.prompt_bytes_p99, w.prompt_bytes_p99))
        })
        .unwrap_or(1.0)
        .max(1.0);
    let raw = e.ratio;
    e.ratio = raw.map(|r| r / work);
    let filling = w
        .in_system_trend
        .is_some_and(|x| x > t::IN_SYSTEM_TREND_MAX);
    let (demand, demand_words) = demand_rose(b, w);
    let grew = e.ratio.is_some_and(|r| r >= t::IN_SYSTEM_RATIO) && queue_grew(b, w);
    e.crossed = grew && !filling && demand != Some(false);
    let little = match (w.arrival_rate_per_s, w.time_in_system_mean_s) {
        (Some(l), Some(s)) => format!("{l:.2}/s x {s:.2} s = {}", fmt_num(w.in_system_littles)),
        _ => "?".to_owned(),
    };
    e.detail = Some(format!(
        "closed-loop form, Little's law L = arrival rate x time in system: {little} (time-averaged {} -> {}); x{} raw, / x{work:.2} work per request; late/early in the window x{}; demand: {demand_words}{}{}",
        fmt_num(b.in_system_mean),
        fmt_num(w.in_system_mean),
        fmt_num(raw),
        fmt_num(w.in_system_trend),
        if filling {
            "; not counted: still filling up (arrivals outrunning service)"
        } else {
            ""
        },
        if grew && !filling && demand == Some(false) {
            "; not counted: demand did not rise (more requests in the system at the same demand is a slowdown, not more clients)"
        } else {
            ""
        }
    ));
    e
}

/// Requests in the system also rise in an open loop when capacity falls (slower steps, fewer
/// slots, a full KV cache): the concurrency form counts as demand only while no capacity signal
/// crossed ("demand rose while per-step service time did not").
fn gate_concurrency(ev: &mut [Evidence]) {
    let capacity: Vec<&'static str> = ev
        .iter()
        .filter(|e| {
            e.crossed
                && matches!(
                    e.points_to,
                    Cause::DegradedDevice
                        | Cause::KvPressure
                        | Cause::KvTransfer
                        | Cause::SchedulerConfig
                )
        })
        .map(|e| e.signal)
        .collect();
    if capacity.is_empty() {
        return;
    }
    if let Some(e) = ev
        .iter_mut()
        .find(|e| e.signal == "requests_in_system" && e.crossed)
    {
        e.crossed = false;
        if let Some(d) = e.detail.as_mut() {
            d.push_str(&format!(
                "; not counted: capacity fell ({})",
                capacity.join(", ")
            ));
        }
    }
}

/// The order causes are tried in, given the phase that grew: changes in the workload (more
/// requests, longer prompts) before changes in capacity (memory, device, scheduler), because a
/// heavier workload also slows steps and fills memory; within that, the phase's own causes first.
fn order(phase: Phase) -> [Cause; 7] {
    use Cause::*;
    match phase {
        Phase::Prefill => [
            PromptGrowth,
            PrefixCacheMiss,
            DegradedDevice,
            SchedulerConfig,
            TrafficSpike,
            KvPressure,
            KvTransfer,
        ],
        Phase::Queue | Phase::None => [
            TrafficSpike,
            PromptGrowth,
            PrefixCacheMiss,
            KvTransfer,
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
    ms_text(v, 0, "?")
}

/// What the inputs cover as a whole: the recording's span and which sources were given at all.
#[derive(Debug, Clone, Default)]
pub(super) struct Coverage {
    pub recording: Option<Timeline>,
    pub steps: usize,
    pub engine_samples: usize,
    pub configs: usize,
    /// Records with admission times (a queue-wait / prefill split).
    pub admitted: usize,
    /// Records with preemption counts.
    pub preemption_counts: usize,
}

impl Coverage {
    pub(super) fn of(inputs: &Inputs) -> Coverage {
        Coverage {
            recording: Timeline::of(&inputs.requests),
            steps: inputs.steps.len(),
            engine_samples: inputs.engine.len(),
            configs: inputs.configs.len(),
            admitted: inputs
                .requests
                .iter()
                .filter(|r| r.admitted_mono_ns.is_some())
                .count(),
            preemption_counts: inputs
                .requests
                .iter()
                .filter(|r| r.preemptions.is_some())
                .count(),
        }
    }
}

fn span_text(start: u64, end: u64) -> String {
    format!("{start}..{end} ({})", human_ns(end.saturating_sub(start)))
}

/// A window that misses the recording, or one that misses it in part.
fn window_outside(name: &str, w: TimeWindow, rec: &Timeline) -> Option<String> {
    if w.end_mono_ns <= rec.start_mono_ns || w.start_mono_ns >= rec.end_mono_ns {
        let side = if w.end_mono_ns <= rec.start_mono_ns {
            "ends before the recording starts"
        } else {
            "starts after the recording ends"
        };
        return Some(format!(
            "the {name} window {} {side} ({}): pick a window inside the recording",
            span_text(w.start_mono_ns, w.end_mono_ns),
            span_text(rec.start_mono_ns, rec.end_mono_ns)
        ));
    }
    None
}

/// What the inputs lack, and which signals that leaves unjudged.
fn missing(c: &Coverage, b: &WindowSignals, w: &WindowSignals) -> Vec<String> {
    let mut m = Vec::new();
    if c.admitted == 0 {
        m.push("no admission times in the records (no scheduler hooks for this engine): queue wait and prefill cannot be told apart".to_owned());
    }
    if c.steps == 0 {
        m.push("no step records (record with --steps, on an engine with scheduler hooks): per-step service time is unknown, so a slower device cannot be ruled out and prefill steps / batch sizes are not judged".to_owned());
    } else if b.steps_in_window == 0 || w.steps_in_window == 0 {
        m.push(format!(
            "no step records in the {} window: device speed, prefill steps and batch sizes are not judged there",
            if w.steps_in_window == 0 {
                "incident"
            } else {
                "baseline"
            }
        ));
    }
    if c.engine_samples == 0 && c.preemption_counts == 0 {
        m.push("no engine metrics (--engine-metrics, or --metrics when recording) and no preemption counts in the records: kv_pressure cannot be judged".to_owned());
    } else if c.engine_samples == 0 {
        m.push("no engine metrics (KV cache usage): kv_pressure is judged from the records' preemption counts only".to_owned());
    }
    if c.configs == 0 {
        m.push(
            "no engine config (record with --engines): scheduler settings are not shown".to_owned(),
        );
    }
    m
}

/// The phases a cause lengthens: a heavier or slower engine lengthens both; demand and a full
/// KV cache make requests wait.
fn phases(c: Cause) -> (bool, bool) {
    match c {
        // A decode leg's wait for the remote KV cache is queue time on D (it is scheduled
        // once the blocks arrived).
        Cause::TrafficSpike | Cause::KvPressure | Cause::KvTransfer => (true, false),
        _ => (true, true),
    }
}

/// How far a crossed signal moved, as a factor >= 1.
fn factor(e: &Evidence) -> f64 {
    let f = match e.test {
        Test::Ratio => e.ratio.unwrap_or(1.0),
        Test::RatioAtMost => e.ratio.filter(|r| *r > 0.0).map_or(1.0, |r| 1.0 / r),
        Test::AtLeast => 1.0 + e.window.unwrap_or(0.0) / e.threshold.unwrap_or(1.0).max(1e-9),
        Test::Context => 1.0,
    };
    if f.is_finite() { f.max(1.1) } else { 10.0 }
}

/// Ranks the crossed causes by how much of the growth each explains: the queue-wait growth is
/// split among the causes that lengthen queue wait, the prefill growth among those that
/// lengthen prefill, each in proportion to the log of the factor it moved by (factors multiply:
/// 4x the clients and 1.8x the engine time per request give log 4 : log 1.8 of the queue).
/// On the queue, a heavier workload (prompts, prefill steps) counts by how much longer each
/// request held the engine; demand by the requests in the system (or arrivals, whichever rose
/// more). Where a workload cause (traffic, prompts) lengthens a phase, the capacity causes
/// (KV, device, scheduler) share none of that phase: a heavier workload also slows steps and
/// fills memory. Growth no crossed cause lengthens is left unexplained.
fn rank(
    crossed: &[Cause],
    ev: &[Evidence],
    dq: Option<f64>,
    dp: Option<f64>,
    ttft_delta: f64,
) -> (Vec<CauseShare>, Option<f64>) {
    let signal_factor = |c: Cause| {
        ev.iter()
            .filter(|e| e.points_to == c && e.crossed)
            .map(factor)
            .fold(1.1_f64, f64::max)
    };
    let raw = |signal: &str| {
        ev.iter()
            .find(|e| e.signal == signal)
            .and_then(|e| ratio(e.baseline, e.window))
            .filter(|r| r.is_finite())
    };
    let weight = |c: Cause, queue: bool| -> f64 {
        let f = match (c, queue) {
            (Cause::PromptGrowth | Cause::PrefixCacheMiss, true) => {
                raw("engine_time_per_request_ms")
                    .unwrap_or(1.1)
                    .min(signal_factor(c))
            }
            (Cause::SchedulerConfig, true) => {
                let slots = ev
                    .iter()
                    .filter(|e| e.signal == "batch_requests_max" && e.crossed)
                    .map(factor)
                    .fold(1.0_f64, f64::max);
                raw("engine_time_per_request_ms")
                    .unwrap_or(1.1)
                    .min(signal_factor(c))
                    .max(slots)
            }
            _ => signal_factor(c),
        };
        f.max(1.1).ln()
    };
    let (q, p) = match (dq, dp) {
        (Some(q), Some(p)) if q.max(0.0) + p.max(0.0) > 0.0 => (q.max(0.0), p.max(0.0)),
        // Split unknown: the whole growth, shared by every crossed cause.
        _ => (ttft_delta.max(1.0), 0.0),
    };
    let total = q + p;
    let mut out: Vec<CauseShare> = crossed
        .iter()
        .map(|&c| CauseShare {
            cause: c,
            share: 0.0,
            explains_ms: 0.0,
            factor: round2_any(signal_factor(c)),
            signals: ev
                .iter()
                .filter(|e| e.points_to == c && e.crossed)
                .map(|e| e.signal)
                .collect(),
        })
        .collect();
    let mut explained = 0.0;
    let workload = |c: Cause| {
        matches!(
            c,
            Cause::TrafficSpike | Cause::PromptGrowth | Cause::PrefixCacheMiss
        )
    };
    for (amount, queue) in [(q, true), (p, false)] {
        let lengthens = |c: Cause| if queue { phases(c).0 } else { phases(c).1 };
        // A heavier workload also slows steps and fills memory: where a workload cause
        // lengthens this phase, capacity causes get no part of it.
        let by_workload = crossed.iter().any(|c| workload(*c) && lengthens(*c));
        let in_phase = |c: Cause| lengthens(c) && (workload(c) || !by_workload);
        if amount <= 0.0 {
            continue;
        }
        let sum: f64 = crossed
            .iter()
            .filter(|c| in_phase(**c))
            .map(|c| weight(*c, queue))
            .sum();
        if sum <= 0.0 {
            continue;
        }
        for cs in out.iter_mut().filter(|cs| in_phase(cs.cause)) {
            let part = amount * weight(cs.cause, queue) / sum;
            cs.share += part / total;
            explained += part;
        }
    }
    for cs in &mut out {
        cs.explains_ms = (cs.share * ttft_delta.max(0.0) * 10.0).round() / 10.0;
        cs.share = round2_any(cs.share);
    }
    // Largest share first; ties keep the phase order (workload before capacity).
    out.sort_by(|a, b| b.share.total_cmp(&a.share));
    let unexplained = (total > 0.0).then(|| round2_any((1.0 - explained / total).max(0.0)));
    (out, unexplained)
}

fn config_changes(b: &WindowSignals, w: &WindowSignals) -> Vec<ConfigChange> {
    let keys: std::collections::BTreeSet<&String> = b
        .engine_settings
        .keys()
        .chain(w.engine_settings.keys())
        .collect();
    keys.into_iter()
        .filter(|k| b.engine_settings.get(*k) != w.engine_settings.get(*k))
        .map(|k| ConfigChange {
            setting: k.clone(),
            baseline: b.engine_settings.get(k).cloned(),
            window: w.engine_settings.get(k).cloned(),
        })
        .collect()
}

pub(super) fn decide(
    b: &WindowSignals,
    w: &WindowSignals,
    baseline_window: TimeWindow,
    incident_window: TimeWindow,
    coverage: &Coverage,
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
        profiles: Vec::new(),
        any_regression: false,
        unexplained: false,
        tpot: None,
        errors: None,
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
        secondary_cause: Cause::None,
        causes: Vec::new(),
        unexplained_share: None,
        traffic_form: None,
        preempted_requests: w.preempted_ids.clone(),
        preempted_count: w.preempted_requests,
        engine_config_changes: config_changes(b, w),
        missing: missing(coverage, b, w),
        summary: String::new(),
        evidence: evidence(b, w),
        notes: Vec::new(),
    };
    let outside: Vec<String> = match &coverage.recording {
        None => vec!["the records hold no requests".to_owned()],
        Some(rec) => [
            window_outside("baseline", baseline_window, rec),
            window_outside("incident", incident_window, rec),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    if !outside.is_empty() {
        d.summary = format!("No decision: {}.", outside.join("; "));
        for (i, o) in outside.into_iter().enumerate() {
            d.missing.insert(i, o);
        }
        return d;
    }
    if b.requests < t::MIN_REQUESTS_PER_WINDOW || w.requests < t::MIN_REQUESTS_PER_WINDOW {
        let short: Vec<&str> = [
            (b.requests < t::MIN_REQUESTS_PER_WINDOW).then_some("baseline"),
            (w.requests < t::MIN_REQUESTS_PER_WINDOW).then_some("incident"),
        ]
        .into_iter()
        .flatten()
        .collect();
        d.summary = format!(
            "Not enough requests to decide: {} in the baseline and {} in the incident window (at least {} each, with a TTFT); widen the {} window.",
            b.requests,
            w.requests,
            t::MIN_REQUESTS_PER_WINDOW,
            short.join(" and ")
        );
        d.missing.insert(0, d.summary.clone());
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
    if crossed.is_empty() {
        d.unexplained_share = Some(1.0);
        d.summary = format!(
            "P99 TTFT regressed {} -> {} (x{ttft_ratio:.1}), {}, but no measured signal crossed its threshold; see the evidence{}.",
            fmt_ms(ttft.baseline),
            fmt_ms(ttft.window),
            phase_text(d.dominant_phase),
            if d.missing.is_empty() {
                String::new()
            } else {
                " and what was missing".to_owned()
            }
        );
        return d;
    }
    let (causes, unexplained) = rank(&crossed, &d.evidence, dq, dp, ttft_delta);
    let cause = causes[0].cause;
    d.cause = cause;
    d.secondary_cause = causes
        .get(1)
        .filter(|c| c.share >= t::SECONDARY_MIN_SHARE)
        .map_or(Cause::None, |c| c.cause);
    d.also_crossed = causes[1..].iter().map(|c| c.cause).collect();
    d.unexplained_share = unexplained;
    if crossed.contains(&Cause::TrafficSpike) {
        let hit = |s: &str| d.evidence.iter().any(|e| e.signal == s && e.crossed);
        d.traffic_form = match (hit("arrival_rate_per_s"), hit("requests_in_system")) {
            (true, true) => Some(LoadForm::RateAndConcurrency),
            (true, false) => Some(LoadForm::Rate),
            (false, true) => Some(LoadForm::Concurrency),
            (false, false) => None,
        };
    }
    let primary_share = causes[0].share;
    d.causes = causes;
    // Deciding signals first, then the secondary cause's, then the other crossed ones, then
    // context.
    let secondary = d.secondary_cause;
    d.evidence.sort_by_key(|e| {
        if e.points_to == cause && e.crossed {
            0
        } else if e.crossed && e.points_to == secondary {
            1
        } else if e.crossed {
            2
        } else {
            3
        }
    });
    let strength = d
        .evidence
        .iter()
        .filter(|e| e.points_to == cause && e.crossed)
        .map(|e| {
            let v = match e.test {
                Test::Ratio => e.ratio.unwrap_or(0.0),
                Test::RatioAtMost => e.ratio.filter(|r| *r > 0.0).map_or(0.0, |r| 1.0 / r),
                _ => e.window.unwrap_or(0.0),
            };
            let th = match e.test {
                Test::RatioAtMost => e.threshold.filter(|t| *t > 0.0).map(|t| 1.0 / t),
                _ => e.threshold,
            };
            th.map_or(1.0, |th| v / th)
        })
        .fold(1.0_f64, f64::max);
    let margin = 0.5 + 0.5 * (strength - 1.0).clamp(0.0, 1.0);
    let clarity = match (dq, dp) {
        (Some(q), Some(p)) if q.abs() + p.abs() > 0.0 => {
            0.5 + 0.5 * (q - p).abs() / (q.abs() + p.abs())
        }
        _ => 0.75,
    };
    // Another cause explaining part of the growth: the primary's share of it.
    let ambiguity = if d.also_crossed.is_empty() {
        1.0
    } else {
        0.5 + 0.5 * primary_share
    };
    // Without step records a slower device cannot be ruled out.
    let blind = if coverage.steps == 0 { 0.7 } else { 1.0 };
    d.confidence = round2(samples * margin * clarity * ambiguity * blind);
    let lead_text = d.evidence.first().map_or(String::new(), |e| {
        format!(
            ": {} {} -> {}",
            e.signal,
            fmt_num(e.baseline),
            fmt_num(e.window)
        )
    });
    let form = match d.traffic_form {
        Some(LoadForm::Concurrency) if cause == Cause::TrafficSpike => " (concurrency)",
        Some(LoadForm::Rate) if cause == Cause::TrafficSpike => " (rate)",
        Some(LoadForm::RateAndConcurrency) if cause == Cause::TrafficSpike => {
            " (rate and concurrency)"
        }
        _ => "",
    };
    let second = if secondary == Cause::None {
        String::new()
    } else {
        let share = d.causes.get(1).map_or(0.0, |c| c.share);
        format!(
            "; secondary: {} ({:.0}% of the growth)",
            secondary.as_str(),
            share * 100.0
        )
    };
    d.summary = format!(
        "P99 TTFT regressed {} -> {} (x{ttft_ratio:.1}), {}; cause: {}{form}{lead_text}{second}.",
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

pub(super) fn fmt_num(v: Option<f64>) -> String {
    match v {
        None => "?".to_owned(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// Two decimals (non-finite values as 0).
fn round2_any(v: f64) -> f64 {
    if v.is_finite() {
        (v * 100.0).round() / 100.0
    } else {
        0.0
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
