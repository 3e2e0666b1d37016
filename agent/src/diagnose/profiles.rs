//! The first question of any regression: which profile broke. TTFT, time per output token,
//! inter-token latency (each request's worst gap between two tokens), arrival to end, and the
//! success rate, each compared between the windows with the same rule, so a TPOT-only
//! regression is never explained as a TTFT one.
use inferscope_model::{quantile::percentile, thresholds as t};
use serde::Serialize;

use super::{Inputs, Pair, TimeWindow, outcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    Ttft,
    Tpot,
    Itl,
    E2e,
    SuccessRate,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Ttft => "TTFT",
            Profile::Tpot => "TPOT",
            Profile::Itl => "ITL",
            Profile::E2e => "E2E",
            Profile::SuccessRate => "success rate",
        }
    }
}

/// One profile in both windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileChange {
    pub profile: Profile,
    pub unit: &'static str,
    /// Requests measured in each window.
    pub requests: Pair<usize>,
    /// Latency profiles: the medians and P99s; the success rate: its value in both.
    pub p50: Pair<Option<f64>>,
    pub p99: Pair<Option<f64>>,
    /// Latency profiles: the window's requests slower than the baseline's P99.
    pub over_baseline_p99: usize,
    pub regressed: bool,
    /// What a regression of this profile needs.
    pub rule: String,
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v
}

/// A latency profile from the values its requests have in each window.
fn latency(profile: Profile, b: Vec<f64>, w: Vec<f64>, min_ms: f64) -> ProfileChange {
    let (b, w) = (sorted(b), sorted(w));
    let (bp99, wp99) = (percentile(&b, 0.99), percentile(&w, 0.99));
    let over = bp99.map_or(0, |p| w.iter().filter(|x| **x > p).count());
    let needed = t::TTFT_REGRESSED_MIN_REQUESTS
        .max((t::TTFT_REGRESSED_SHARE * w.len() as f64).ceil() as usize);
    let enough = b.len() >= t::MIN_REQUESTS_PER_WINDOW && w.len() >= t::MIN_REQUESTS_PER_WINDOW;
    let regressed = enough
        && match (bp99, wp99) {
            (Some(bv), Some(wv)) => {
                wv >= bv * t::TTFT_REGRESSION_RATIO && wv - bv >= min_ms && over >= needed
            }
            _ => false,
        };
    ProfileChange {
        profile,
        unit: "ms",
        requests: Pair {
            baseline: b.len(),
            window: w.len(),
        },
        p50: Pair {
            baseline: percentile(&b, 0.5),
            window: percentile(&w, 0.5),
        },
        p99: Pair {
            baseline: bp99,
            window: wp99,
        },
        over_baseline_p99: over,
        regressed,
        rule: format!(
            "P99 x{} and +{min_ms} ms, {} of the window's requests over the baseline's P99 (at least {})",
            t::TTFT_REGRESSION_RATIO,
            t::TTFT_REGRESSED_SHARE,
            t::TTFT_REGRESSED_MIN_REQUESTS
        ),
    }
}

/// The success rate in both windows (requests whose outcome is known: not those the agent lost
/// track of).
fn success(inputs: &Inputs, b: &TimeWindow, w: &TimeWindow) -> ProfileChange {
    let (bo, wo) = (outcome::tally(inputs, b), outcome::tally(inputs, w));
    let (br, wr) = (bo.success_rate(), wo.success_rate());
    let regressed = wo.failed() >= t::FAILED_REQUESTS_MIN
        && bo.judged() >= t::MIN_REQUESTS_PER_WINDOW
        && match (br, wr) {
            (Some(b), Some(w)) => {
                w <= b - t::SUCCESS_RATE_DROP
                    || (b >= t::SUCCESS_RATE_CRITICAL && w < t::SUCCESS_RATE_CRITICAL)
            }
            _ => false,
        };
    ProfileChange {
        profile: Profile::SuccessRate,
        unit: "fraction",
        requests: Pair {
            baseline: bo.judged(),
            window: wo.judged(),
        },
        p50: Pair {
            baseline: br,
            window: wr,
        },
        p99: Pair {
            baseline: None,
            window: None,
        },
        over_baseline_p99: wo.failed(),
        regressed,
        rule: format!(
            "fell by {} or below {}, with at least {} failed requests",
            t::SUCCESS_RATE_DROP,
            t::SUCCESS_RATE_CRITICAL,
            t::FAILED_REQUESTS_MIN
        ),
    }
}

/// Every profile, TTFT first; `ttft_regressed`: the TTFT decision's own verdict (same rule).
pub(super) fn compare(
    inputs: &Inputs,
    b: &TimeWindow,
    w: &TimeWindow,
    ttft_regressed: bool,
) -> Vec<ProfileChange> {
    let values = |win: &TimeWindow, f: fn(&super::RequestSample) -> Option<f64>| -> Vec<f64> {
        inputs
            .requests
            .iter()
            .filter(|r| win.contains(r.arrival_mono_ns))
            .filter_map(f)
            .collect()
    };
    let mut ttft = latency(
        Profile::Ttft,
        values(b, |r| r.ttft_ms),
        values(w, |r| r.ttft_ms),
        t::TTFT_REGRESSION_MIN_MS,
    );
    ttft.regressed = ttft_regressed;
    // E2E of requests that succeeded: a failure's end says how it failed, not how long serving
    // took.
    let e2e = |r: &super::RequestSample| {
        (outcome::classify(r) == outcome::Outcome::Success)
            .then_some(r.e2e_ms)
            .flatten()
    };
    vec![
        ttft,
        latency(
            Profile::Tpot,
            values(b, |r| r.tpot_ms),
            values(w, |r| r.tpot_ms),
            t::TPOT_REGRESSION_MIN_MS,
        ),
        latency(
            Profile::Itl,
            values(b, |r| r.itl_max_ms),
            values(w, |r| r.itl_max_ms),
            t::ITL_REGRESSION_MIN_MS,
        ),
        latency(
            Profile::E2e,
            values(b, e2e),
            values(w, e2e),
            t::E2E_REGRESSION_MIN_MS,
        ),
        success(inputs, b, w),
    ]
}

/// The diagnosis's one sentence: which profiles regressed, then each branch's own sentence
/// (`ttft`: the TTFT branch's).
pub(super) fn headline(
    profiles: &[ProfileChange],
    ttft: &str,
    tpot: Option<&super::TpotBranch>,
    errors: Option<&super::ErrorBranch>,
) -> String {
    let regressed: Vec<String> = profiles
        .iter()
        .filter(|p| p.regressed)
        .map(|p| {
            let value = if p.profile == Profile::SuccessRate {
                p.p50
            } else {
                p.p99
            };
            change_text(p.profile, value)
        })
        .collect();
    if regressed.is_empty() {
        return format!("No profile regressed (TTFT, TPOT, ITL, E2E, success rate). {ttft}");
    }
    let ttft_regressed = profiles
        .iter()
        .any(|p| p.profile == Profile::Ttft && p.regressed);
    let mut parts = vec![format!("Regressed: {}.", regressed.join(", "))];
    if ttft_regressed {
        parts.push(ttft.to_owned());
    }
    parts.extend(tpot.map(|t| t.summary.clone()));
    parts.extend(errors.map(|e| e.summary.clone()));
    parts.join(" ")
}

/// A regressed profile in words: P99 in ms for latencies, percent for the success rate.
pub(super) fn change_text(profile: Profile, value: Pair<Option<f64>>) -> String {
    match profile {
        Profile::SuccessRate => format!(
            "success rate {} -> {}",
            percent(value.baseline),
            percent(value.window)
        ),
        _ => format!(
            "{} P99 {} -> {}",
            profile.as_str(),
            inferscope_model::clock::ms_text(value.baseline, 0, "?"),
            inferscope_model::clock::ms_text(value.window, 0, "?")
        ),
    }
}

fn percent(v: Option<f64>) -> String {
    v.map_or("?".to_owned(), |v| format!("{:.1}%", v * 100.0))
}
