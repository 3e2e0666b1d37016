//! The TPOT / inter-token-latency branch: why decoding got slower, from the engine steps each
//! request decoded in (the steps of its engine process between its first and last token).
//!
//! - batch growth: more requests per decode step at the same step cost per request;
//! - prefill interference: its decode steps also carried other requests' prefill (chunked
//!   prefill mixed into decode), and such steps took longer than decode-only ones;
//! - KV pressure: requests preempted during their decode, a full KV cache;
//! - degraded device: steps of the same batch size took longer (the TTFT branch's comparison),
//!   or a device stood out among its peers.
use inferscope_model::{quantile::percentile, thresholds as t};
use serde::Serialize;

use super::{
    Cause, Evidence, Inputs, RequestSample, StepSample, Test, TimeWindow,
    decide::{fmt_num, line, ratio},
};

/// The decode steps of one request.
#[derive(Debug, Clone, Default, PartialEq)]
struct DecodeSteps {
    steps: usize,
    batch_sum: f64,
    per_request_ms_sum: f64,
    /// Its decode steps' time, and the part spent in steps that also prefilled others.
    ms_sum: f64,
    mixed_ms_sum: f64,
    mixed_ms: Vec<f64>,
    decode_only_ms: Vec<f64>,
}

/// What one window's requests decoded in.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct DecodeSignals {
    pub requests: usize,
    pub batch_mean: Option<f64>,
    pub step_ms_per_request: Option<f64>,
    pub prefill_share: Option<f64>,
    /// A step with prefill over a decode-only step, medians.
    pub mixed_stretch: Option<f64>,
    pub preempted_share: Option<f64>,
    /// The slowest requests by TPOT, with what their decode steps were.
    pub slowest: Vec<SlowRequest>,
}

/// A request of the incident window and the steps it decoded in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlowRequest {
    pub request_id: String,
    pub tpot_ms: Option<f64>,
    pub itl_max_ms: Option<f64>,
    pub decode_steps: usize,
    /// Requests per step, averaged over its decode steps.
    pub batch_mean: Option<f64>,
    /// Share of its decode time spent in steps that also prefilled others.
    pub prefill_share: Option<f64>,
    pub preemptions: Option<u64>,
    /// Its longest decode step.
    pub longest_step_ms: Option<f64>,
}

const SLOWEST: usize = 5;

/// The steps of `r`'s engine between its first and last token: the steps it decoded in.
fn decode_steps<'a>(
    r: &RequestSample,
    steps: &'a [StepSample],
) -> Option<impl Iterator<Item = &'a StepSample>> {
    let (first, last) = (r.first_token_mono_ns?, r.last_token_mono_ns?);
    // Steps sorted by start: those that began once its first token was out, until its last.
    let from = steps.partition_point(|s| s.start_mono_ns < first);
    Some(
        steps
            .get(from..)
            .unwrap_or_default()
            .iter()
            .take_while(move |s| s.start_mono_ns < last)
            .filter(move |s| s.pid == 0 || r.pid == 0 || s.pid == r.pid),
    )
}

fn of_request(r: &RequestSample, steps: &[StepSample]) -> DecodeSteps {
    let mut d = DecodeSteps::default();
    let Some(iter) = decode_steps(r, steps) else {
        return d;
    };
    for s in iter {
        let batch = (s.prefill_requests + s.decode_requests).max(1);
        d.ms_sum += s.duration_ms;
        d.steps += 1;
        d.batch_sum += f64::from(batch);
        d.per_request_ms_sum += s.duration_ms / f64::from(batch);
        if s.prefill_requests > 0 && s.decode_requests > 0 {
            d.mixed_ms_sum += s.duration_ms;
            d.mixed_ms.push(s.duration_ms);
        } else {
            d.decode_only_ms.push(s.duration_ms);
        }
    }
    d
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

pub(super) fn measure(inputs: &Inputs, steps: &[StepSample], w: &TimeWindow) -> DecodeSignals {
    let decoding: Vec<&RequestSample> = inputs
        .requests
        .iter()
        .filter(|r| w.contains(r.arrival_mono_ns) && r.tpot_ms.is_some())
        .collect();
    let mut s = DecodeSignals {
        requests: decoding.len(),
        ..DecodeSignals::default()
    };
    let (mut steps_n, mut batch, mut per_request) = (0usize, 0.0, 0.0);
    let (mut ms, mut mixed) = (0.0, 0.0);
    let (mut mixed_ms, mut decode_ms) = (Vec::new(), Vec::new());
    let mut slowest = Vec::new();
    for r in &decoding {
        let d = of_request(r, steps);
        steps_n += d.steps;
        batch += d.batch_sum;
        per_request += d.per_request_ms_sum;
        ms += d.ms_sum;
        mixed += d.mixed_ms_sum;
        let longest = d
            .mixed_ms
            .iter()
            .chain(&d.decode_only_ms)
            .copied()
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        slowest.push(SlowRequest {
            request_id: r.request_id.clone(),
            tpot_ms: r.tpot_ms,
            itl_max_ms: r.itl_max_ms,
            decode_steps: d.steps,
            batch_mean: (d.steps > 0).then(|| round2(d.batch_sum / d.steps as f64)),
            prefill_share: (d.ms_sum > 0.0).then(|| round2(d.mixed_ms_sum / d.ms_sum)),
            preemptions: r.preemptions,
            longest_step_ms: longest.map(round2),
        });
        mixed_ms.extend(d.mixed_ms);
        decode_ms.extend(d.decode_only_ms);
    }
    if steps_n > 0 {
        let n = steps_n as f64;
        s.batch_mean = Some(batch / n);
        s.step_ms_per_request = Some(per_request / n);
        s.prefill_share = (ms > 0.0).then(|| mixed / ms);
    }
    s.mixed_stretch = ratio(median(decode_ms), median(mixed_ms));
    let with_counts: Vec<&&RequestSample> = decoding
        .iter()
        .filter(|r| r.preemptions.is_some())
        .collect();
    if !with_counts.is_empty() {
        let preempted = with_counts
            .iter()
            .filter(|r| r.preemptions.unwrap_or(0) > 0)
            .count();
        s.preempted_share = Some(preempted as f64 / with_counts.len() as f64);
    }
    slowest.sort_by(|a, b| {
        b.tpot_ms
            .unwrap_or(0.0)
            .total_cmp(&a.tpot_ms.unwrap_or(0.0))
    });
    slowest.truncate(SLOWEST);
    s.slowest = slowest;
    s
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Why TPOT (or ITL) regressed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TpotBranch {
    pub cause: Cause,
    /// Other causes whose signals crossed too.
    pub also_crossed: Vec<Cause>,
    pub evidence: Vec<Evidence>,
    /// The incident window's slowest requests by TPOT, with the steps they decoded in.
    pub slowest_requests: Vec<SlowRequest>,
    pub summary: String,
}

/// The order causes are tried in at equal strength: the workload's shape (more requests per
/// step, prefills mixed in) before capacity (memory, device), as for TTFT.
const ORDER: [Cause; 4] = [
    Cause::BatchGrowth,
    Cause::PrefillInterference,
    Cause::KvPressure,
    Cause::DegradedDevice,
];

/// Decides the branch. `shared`: the TTFT branch's evidence, whose KV and device lines (step
/// time at equal batch size, KV usage, preemptions, device outliers) hold for decoding too.
pub(super) fn explain(
    b: &DecodeSignals,
    w: &DecodeSignals,
    shared: &[Evidence],
    regressed: &str,
) -> TpotBranch {
    let per_request = ratio(b.step_ms_per_request, w.step_ms_per_request);
    let mut batch = line(
        "decode_batch_requests_mean",
        "req",
        b.batch_mean,
        w.batch_mean,
        Test::Ratio,
        Some(t::DECODE_BATCH_GROWTH_RATIO),
        Cause::BatchGrowth,
    );
    let device_slower = per_request.is_some_and(|r| r >= t::DEVICE_SLOWDOWN_RATIO);
    batch.crossed &= !device_slower;
    batch.detail = Some(format!(
        "requests per step during the window's requests' decode; counts only while the step cost per request did not grow x{} (x{})",
        t::DEVICE_SLOWDOWN_RATIO,
        fmt_num(per_request)
    ));
    let mut cost = line(
        "decode_step_ms_per_request",
        "ms",
        b.step_ms_per_request,
        w.step_ms_per_request,
        Test::Context,
        None,
        Cause::None,
    );
    cost.detail = Some("a decode step's time over the requests it carried".to_owned());
    let mut interference = line(
        "decode_time_in_prefill_steps_share",
        "fraction",
        b.prefill_share,
        w.prefill_share,
        Test::AtLeast,
        Some(t::PREFILL_INTERFERENCE_SHARE_MIN),
        Cause::PrefillInterference,
    );
    let rise = w.prefill_share.unwrap_or(0.0) - b.prefill_share.unwrap_or(0.0);
    let stretched = w
        .mixed_stretch
        .is_some_and(|s| s >= t::PREFILL_INTERFERENCE_STRETCH);
    interference.crossed &= rise >= t::PREFILL_INTERFERENCE_SHARE_RISE && stretched;
    interference.detail = Some(format!(
        "share of the requests' decode time spent in steps that also prefilled others: +{rise:.2} (needs +{}); such a step took x{} a decode-only one (needs x{})",
        t::PREFILL_INTERFERENCE_SHARE_RISE,
        fmt_num(w.mixed_stretch),
        t::PREFILL_INTERFERENCE_STRETCH
    ));
    let mut preempted = line(
        "preempted_during_decode_share",
        "fraction",
        b.preempted_share,
        w.preempted_share,
        Test::AtLeast,
        Some(t::PREEMPTED_SHARE_MIN),
        Cause::KvPressure,
    );
    preempted.crossed &= match (b.preempted_share, w.preempted_share) {
        (Some(bv), Some(wv)) => bv <= 0.0 || wv / bv >= t::PREEMPTION_RATE_RATIO,
        _ => true,
    };
    let mut ev = vec![batch, interference, preempted, cost];
    ev.extend(
        shared
            .iter()
            .filter(|e| {
                matches!(
                    e.signal,
                    "decode_step_ms_p50"
                        | "kv_cache_usage_p90"
                        | "preemptions_per_s"
                        | "device_outlier_share"
                )
            })
            .cloned(),
    );
    ev.retain(|e| e.baseline.is_some() || e.window.is_some());
    let strength = |c: Cause| {
        ev.iter()
            .filter(|e| e.points_to == c && e.crossed)
            .map(|e| match e.test {
                Test::Ratio => e.ratio.unwrap_or(1.0),
                _ => 1.0 + e.window.unwrap_or(0.0) / e.threshold.unwrap_or(1.0).max(1e-9),
            })
            .fold(0.0_f64, f64::max)
    };
    let mut crossed: Vec<Cause> = ORDER.into_iter().filter(|c| strength(*c) > 0.0).collect();
    // Strongest first; ties keep the order.
    crossed.sort_by(|a, b| strength(*b).total_cmp(&strength(*a)));
    let cause = crossed.first().copied().unwrap_or(Cause::None);
    ev.sort_by_key(|e| {
        if e.points_to == cause && e.crossed {
            0
        } else {
            1
        }
    });
    let lead = ev
        .iter()
        .find(|e| e.points_to == cause && e.crossed)
        .map_or(String::new(), |e| {
            format!(
                ": {} {} -> {}",
                e.signal,
                fmt_num(e.baseline),
                fmt_num(e.window)
            )
        });
    let summary = if cause == Cause::None {
        format!(
            "{regressed} regressed, but no decode signal crossed its threshold; see the evidence."
        )
    } else {
        format!("{regressed} regressed; cause: {}{lead}.", cause.as_str())
    };
    TpotBranch {
        cause,
        also_crossed: crossed.into_iter().skip(1).collect(),
        evidence: ev,
        slowest_requests: w.slowest.clone(),
        summary,
    }
}
