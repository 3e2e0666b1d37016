//! Fleet-wide diagnosis from the Prometheus users already run: the agents' own histograms and
//! counters, aggregated by PromQL inside Prometheus (a fleet larger than one machine holds in
//! memory costs this side one small vector per query), compared between two windows, and
//! localised: which replica (instance or pod) the regression is concentrated on.
//!
//! The decision reads query results through [`Query`]; the CLI's HTTP client answers them from
//! a real Prometheus, the tests from canned vectors.
use std::collections::BTreeMap;

use inferscope_model::thresholds as t;
use serde::Serialize;

use super::{Pair, Profile, TimeWindow, decide::fmt_num};

/// One series of an instant vector: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueryError {
    #[error("querying Prometheus at {url} failed: {why} (is the URL right, and Prometheus up?)")]
    Unreachable { url: String, why: String },
    #[error("Prometheus refused the query {query}: {why}")]
    Refused { query: String, why: String },
    #[error("Prometheus answered something that is not a query result: {0}")]
    Malformed(String),
}

/// An instant query at a time (Unix seconds).
pub(crate) trait Query {
    fn instant(&self, promql: &str, at_unix_s: f64) -> Result<Vec<Sample>, QueryError>;
}

/// The latency histograms the agents export, by profile.
const LATENCY: [(Profile, &str, f64); 3] = [
    (
        Profile::Ttft,
        "gen_ai_server_time_to_first_token_seconds",
        t::TTFT_REGRESSION_MIN_MS,
    ),
    (
        Profile::Tpot,
        "gen_ai_server_time_per_output_token_seconds",
        t::TPOT_REGRESSION_MIN_MS,
    ),
    (
        Profile::E2e,
        "gen_ai_server_request_duration_seconds",
        t::E2E_REGRESSION_MIN_MS,
    ),
];
const REQUESTS: &str = "inferscope_requests_total";
const QUEUE_WAIT: &str = "inferscope_queue_wait_seconds";
const PREFILL: &str = "inferscope_prefill_seconds";
const PROMPT_TOKENS: &str = "inferscope_prompt_tokens";
const COMPUTED_TOKENS: &str = "inferscope_prefill_tokens_computed";
const KV_USAGE: &str = "inferscope_engine_kv_cache_usage_ratio";

/// Where in the fleet: the labels that name a replica, most specific first.
const PLACE_LABELS: &str = "pod, instance";

/// A profile fleet-wide and per replica.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FleetProfile {
    pub profile: Profile,
    /// P99 (ms) fleet-wide; the success rate (0..1) for `success_rate`.
    pub fleet: Pair<Option<f64>>,
    /// Regressed fleet-wide.
    pub regressed: bool,
    /// Each replica's value in both windows, worst incident first.
    pub places: Vec<PlaceValue>,
    /// The one replica that regressed (by the profile's own rule) while every other stayed
    /// under CONCENTRATION_PEERS_MAX: where a fleet-wide regression sits, or, in a fleet large
    /// enough that one replica does not move the fleet's P99, the replica that did regress.
    pub concentrated_on: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PlaceValue {
    pub place: String,
    pub value: Pair<Option<f64>>,
    /// window / baseline (for the success rate: failures' share, window over baseline).
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FleetDiagnosis {
    pub baseline_window: TimeWindow,
    pub incident_window: TimeWindow,
    pub requests: Pair<Option<f64>>,
    pub profiles: Vec<FleetProfile>,
    /// Fleet-wide signals behind the TTFT branch.
    pub signals: Vec<FleetSignal>,
    /// The named cause (the same vocabulary as one node's diagnosis) and where.
    pub cause: super::Cause,
    pub place: Option<String>,
    pub missing: Vec<String>,
    pub summary: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FleetSignal {
    pub signal: &'static str,
    pub value: Pair<Option<f64>>,
    pub ratio: Option<f64>,
    pub crossed: bool,
}

/// The value a PromQL expression had over `w` (evaluated at its end, over its length).
struct Windowed<'a> {
    q: &'a dyn Query,
    w: TimeWindow,
}

impl Windowed<'_> {
    fn range(&self) -> String {
        format!("{}s", (self.w.duration_s().round() as u64).max(1))
    }

    fn at(&self) -> f64 {
        self.w.end_mono_ns as f64 / 1e9
    }

    fn vector(&self, promql: &str) -> Result<Vec<Sample>, QueryError> {
        self.q.instant(promql, self.at())
    }

    fn scalar(&self, promql: &str) -> Result<Option<f64>, QueryError> {
        Ok(self
            .vector(promql)?
            .into_iter()
            .map(|s| s.value)
            .find(|v| v.is_finite()))
    }

    fn quantile(&self, q: f64, metric: &str, by: &str) -> Result<Vec<Sample>, QueryError> {
        self.vector(&format!(
            "histogram_quantile({q}, sum by (le{by}) (increase({metric}_bucket[{}])))",
            self.range()
        ))
    }
}

fn place_of(labels: &BTreeMap<String, String>) -> String {
    labels
        .get("pod")
        .filter(|p| !p.is_empty())
        .or_else(|| labels.get("instance"))
        .cloned()
        .unwrap_or_else(|| "unknown".to_owned())
}

fn by_place(samples: Vec<Sample>, scale: f64) -> BTreeMap<String, f64> {
    samples
        .into_iter()
        .filter(|s| s.value.is_finite())
        .map(|s| (place_of(&s.labels), s.value * scale))
        .collect()
}

fn ratio(p: Pair<Option<f64>>) -> Option<f64> {
    match (p.baseline, p.window) {
        (Some(b), Some(w)) if b > 0.0 => Some(w / b),
        _ => None,
    }
}

/// The replicas' values in both windows, and the one the change sits on: it moved by the
/// regression's ratio while every other stayed under CONCENTRATION_PEERS_MAX.
fn places(
    b: BTreeMap<String, f64>,
    w: BTreeMap<String, f64>,
    worse_is_lower: bool,
    min_delta: f64,
) -> (Vec<PlaceValue>, Option<String>) {
    let mut names: Vec<&String> = b.keys().chain(w.keys()).collect();
    names.sort();
    names.dedup();
    let mut out: Vec<PlaceValue> = names
        .into_iter()
        .map(|n| {
            let value = Pair {
                baseline: b.get(n).copied(),
                window: w.get(n).copied(),
            };
            let r = if worse_is_lower {
                // Failures' share, window over baseline (a floor of 1 % keeps a clean baseline
                // comparable).
                match (value.baseline, value.window) {
                    (Some(bv), Some(wv)) => Some((1.0 - wv).max(0.01) / (1.0 - bv).max(0.01)),
                    _ => None,
                }
            } else {
                ratio(value)
            };
            PlaceValue {
                place: n.clone(),
                value,
                ratio: r,
            }
        })
        .collect();
    out.sort_by(|a, b| b.ratio.unwrap_or(0.0).total_cmp(&a.ratio.unwrap_or(0.0)));
    let concentrated = match out.as_slice() {
        [top, rest @ ..] if !rest.is_empty() => {
            let delta = match (top.value.baseline, top.value.window) {
                (Some(b), Some(w)) if worse_is_lower => b - w,
                (Some(b), Some(w)) => w - b,
                _ => 0.0,
            };
            let moved =
                top.ratio.is_some_and(|r| r >= t::TTFT_REGRESSION_RATIO) && delta >= min_delta;
            let others_still = rest
                .iter()
                .all(|p| p.ratio.is_none_or(|r| r < t::CONCENTRATION_PEERS_MAX));
            (moved && others_still).then(|| top.place.clone())
        }
        _ => None,
    };
    (out, concentrated)
}

/// Compares the incident window with the baseline window across every agent Prometheus scrapes.
pub(crate) fn diagnose(
    q: &dyn Query,
    baseline: TimeWindow,
    window: TimeWindow,
) -> Result<FleetDiagnosis, QueryError> {
    let (bw, ww) = (Windowed { q, w: baseline }, Windowed { q, w: window });
    let mut missing = Vec::new();
    let total = |x: &Windowed<'_>| x.scalar(&format!("sum(increase({REQUESTS}[{}]))", x.range()));
    let requests = Pair {
        baseline: total(&bw)?,
        window: total(&ww)?,
    };
    if requests.baseline.is_none() || requests.window.is_none() {
        missing.push(format!(
            "{REQUESTS}: no series in the {} window (no agent scraped then: a scrape gap, or agents not exporting to this Prometheus)",
            if requests.baseline.is_none() { "baseline" } else { "incident" }
        ));
    }
    let mut profiles = Vec::new();
    for (profile, metric, min_ms) in LATENCY {
        let fleet = Pair {
            baseline: first(bw.quantile(0.99, metric, "")?).map(|s| s * 1e3),
            window: first(ww.quantile(0.99, metric, "")?).map(|s| s * 1e3),
        };
        if fleet.baseline.is_none() && fleet.window.is_none() {
            missing.push(format!(
                "{metric}: no samples in either window (agents older than this histogram, or no such requests)"
            ));
        }
        let regressed = enough(requests)
            && match (fleet.baseline, fleet.window) {
                (Some(b), Some(w)) => w >= b * t::TTFT_REGRESSION_RATIO && w - b >= min_ms,
                _ => false,
            };
        let by = format!(", {PLACE_LABELS}");
        let (places, concentrated_on) = places(
            by_place(bw.quantile(0.99, metric, &by)?, 1e3),
            by_place(ww.quantile(0.99, metric, &by)?, 1e3),
            false,
            min_ms,
        );
        profiles.push(FleetProfile {
            profile,
            fleet,
            regressed,
            concentrated_on: concentrated_on.filter(|_| enough(requests)),
            places,
        });
    }
    profiles.push(success(&bw, &ww, requests)?);
    gaps(&profiles, &mut missing);
    let signals = signals(&bw, &ww)?;
    let (cause, place) = decide(&profiles, &signals);
    let summary = summary(&profiles, cause, place.as_deref());
    Ok(FleetDiagnosis {
        baseline_window: baseline,
        incident_window: window,
        requests,
        profiles,
        signals,
        cause,
        place,
        missing,
        summary,
    })
}

fn first(v: Vec<Sample>) -> Option<f64> {
    v.into_iter().map(|s| s.value).find(|v| v.is_finite())
}

fn enough(requests: Pair<Option<f64>>) -> bool {
    let min = t::MIN_REQUESTS_PER_WINDOW as f64;
    requests.baseline.is_some_and(|b| b >= min) && requests.window.is_some_and(|w| w >= min)
}

fn success(
    bw: &Windowed<'_>,
    ww: &Windowed<'_>,
    requests: Pair<Option<f64>>,
) -> Result<FleetProfile, QueryError> {
    let rate = |x: &Windowed<'_>, by: &str| {
        x.vector(&format!(
            "sum by ({by}) (increase({REQUESTS}{{outcome=\"ok\"}}[{r}])) / sum by ({by}) (increase({REQUESTS}[{r}]))",
            r = x.range()
        ))
    };
    let fleet = Pair {
        baseline: first(bw.vector(&format!(
            "sum(increase({REQUESTS}{{outcome=\"ok\"}}[{r}])) / sum(increase({REQUESTS}[{r}]))",
            r = bw.range()
        ))?),
        window: first(ww.vector(&format!(
            "sum(increase({REQUESTS}{{outcome=\"ok\"}}[{r}])) / sum(increase({REQUESTS}[{r}]))",
            r = ww.range()
        ))?),
    };
    let failed = fleet
        .window
        .zip(requests.window)
        .map_or(0.0, |(rate, n)| (1.0 - rate) * n);
    let regressed = enough(requests)
        && failed >= t::FAILED_REQUESTS_MIN as f64
        && match (fleet.baseline, fleet.window) {
            (Some(b), Some(w)) => {
                w <= b - t::SUCCESS_RATE_DROP
                    || (b >= t::SUCCESS_RATE_CRITICAL && w < t::SUCCESS_RATE_CRITICAL)
            }
            _ => false,
        };
    let (places, concentrated_on) = places(
        by_place(rate(bw, PLACE_LABELS)?, 1.0),
        by_place(rate(ww, PLACE_LABELS)?, 1.0),
        true,
        t::SUCCESS_RATE_DROP,
    );
    Ok(FleetProfile {
        profile: Profile::SuccessRate,
        fleet,
        regressed,
        concentrated_on: concentrated_on.filter(|_| enough(requests)),
        places,
    })
}

/// Replicas that served in one window and not the other: a scrape gap, an agent stopped, or a
/// replica added or removed.
fn gaps(profiles: &[FleetProfile], missing: &mut Vec<String>) {
    let Some(ttft) = profiles.iter().find(|p| p.profile == Profile::Ttft) else {
        return;
    };
    for p in &ttft.places {
        match (p.value.baseline, p.value.window) {
            (Some(_), None) => missing.push(format!(
                "{}: samples in the baseline window and none in the incident window (a scrape gap, its agent stopped, or the replica went away)",
                p.place
            )),
            (None, Some(_)) => missing.push(format!(
                "{}: samples in the incident window and none in the baseline window (a new replica, or a scrape gap before)",
                p.place
            )),
            _ => {}
        }
    }
}

fn signals(bw: &Windowed<'_>, ww: &Windowed<'_>) -> Result<Vec<FleetSignal>, QueryError> {
    let both = |f: &dyn Fn(&Windowed<'_>) -> Result<Option<f64>, QueryError>| {
        Ok::<_, QueryError>(Pair {
            baseline: f(bw)?,
            window: f(ww)?,
        })
    };
    let rate = both(&|x: &Windowed<'_>| {
        Ok(
            x.scalar(&format!("sum(increase({REQUESTS}[{}]))", x.range()))?
                .map(|n| n / x.w.duration_s().max(1e-9)),
        )
    })?;
    let quantile = |metric: &'static str, q: f64, scale: f64| {
        both(&move |x: &Windowed<'_>| Ok(first(x.quantile(q, metric, "")?).map(|v| v * scale)))
    };
    let kv = both(&|x: &Windowed<'_>| {
        x.scalar(&format!("max(max_over_time({KV_USAGE}[{}]))", x.range()))
    })?;
    let line =
        |signal, value: Pair<Option<f64>>, crossed: fn(Option<f64>, Pair<Option<f64>>) -> bool| {
            let r = ratio(value);
            FleetSignal {
                signal,
                value,
                ratio: r,
                crossed: crossed(r, value),
            }
        };
    Ok(vec![
        line("arrival_rate_per_s", rate, |r, _| {
            r.is_some_and(|r| r >= t::ARRIVAL_RATE_RATIO)
        }),
        line(
            "queue_wait_p99_ms",
            quantile(QUEUE_WAIT, 0.99, 1e3)?,
            |r, _| r.is_some_and(|r| r >= t::TTFT_REGRESSION_RATIO),
        ),
        line("prefill_p99_ms", quantile(PREFILL, 0.99, 1e3)?, |r, _| {
            r.is_some_and(|r| r >= t::TTFT_REGRESSION_RATIO)
        }),
        line(
            "prompt_tokens_p99",
            quantile(PROMPT_TOKENS, 0.99, 1.0)?,
            |r, _| r.is_some_and(|r| r >= t::PROMPT_GROWTH_RATIO),
        ),
        line(
            "prefill_tokens_computed_p50",
            quantile(COMPUTED_TOKENS, 0.5, 1.0)?,
            |r, _| r.is_some_and(|r| r >= t::PREFIX_CACHE_MISS_RATIO),
        ),
        line("kv_cache_usage_max", kv, |_, v| {
            v.window.is_some_and(|w| w >= t::KV_USAGE_HIGH)
        }),
    ])
}

/// The fleet-wide cause: demand and work before capacity, as on one node; a regression on one
/// replica at unchanged fleet demand and work is that replica's (its device or its engine).
fn decide(profiles: &[FleetProfile], signals: &[FleetSignal]) -> (super::Cause, Option<String>) {
    use super::Cause;
    let hit = |s: &str| signals.iter().any(|x| x.signal == s && x.crossed);
    let latency = profiles
        .iter()
        .filter(|p| p.profile != Profile::SuccessRate)
        .filter(|p| p.regressed || p.concentrated_on.is_some())
        .collect::<Vec<_>>();
    if latency.is_empty() {
        let errors = profiles
            .iter()
            .find(|p| p.profile == Profile::SuccessRate && p.regressed);
        return (Cause::None, errors.and_then(|p| p.concentrated_on.clone()));
    }
    let place = latency.iter().find_map(|p| p.concentrated_on.clone());
    let prompts_grew = hit("prompt_tokens_p99");
    let cause = if hit("arrival_rate_per_s") && place.is_none() {
        Cause::TrafficSpike
    } else if prompts_grew {
        Cause::PromptGrowth
    } else if hit("prefill_tokens_computed_p50") {
        Cause::PrefixCacheMiss
    } else if hit("kv_cache_usage_max") {
        Cause::KvPressure
    } else if place.is_some() {
        Cause::DegradedDevice
    } else {
        Cause::None
    };
    (cause, place)
}

fn summary(profiles: &[FleetProfile], cause: super::Cause, place: Option<&str>) -> String {
    let regressed: Vec<String> = profiles
        .iter()
        .filter(|p| p.regressed)
        .map(|p| super::profiles::change_text(p.profile, p.fleet))
        .collect();
    if regressed.is_empty() {
        let on_one: Vec<String> = profiles
            .iter()
            .filter_map(|p| {
                let place = p.concentrated_on.as_deref()?;
                let v = p.places.iter().find(|x| x.place == place)?;
                Some(format!(
                    "{} {} -> {} (x{})",
                    p.profile.as_str(),
                    fmt_num(v.value.baseline),
                    fmt_num(v.value.window),
                    fmt_num(v.ratio)
                ))
            })
            .collect();
        return match place {
            Some(place) if !on_one.is_empty() => format!(
                "No profile regressed fleet-wide, but one replica did: {place}: {} while the others did not move; cause: {}.",
                on_one.join(", "),
                cause.as_str()
            ),
            _ => "No profile regressed fleet-wide (TTFT, TPOT, E2E, success rate).".to_owned(),
        };
    }
    let at = place.map_or(" across the fleet".to_owned(), |p| {
        format!(" concentrated on {p} (the other replicas did not move)")
    });
    format!(
        "Regressed fleet-wide: {}{at}; cause: {}.",
        regressed.join(", "),
        cause.as_str()
    )
}

/// Replicas listed per regressed profile (the worst first); the JSON has them all.
const MAX_PLACES_SHOWN: usize = 10;

/// The fleet report for people.
pub(crate) fn render(d: &FleetDiagnosis) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{}", d.summary);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "  requests          {:>10} -> {}",
        fmt_num(d.requests.baseline),
        fmt_num(d.requests.window)
    );
    for p in &d.profiles {
        let unit = if p.profile == Profile::SuccessRate {
            ""
        } else {
            " ms (P99)"
        };
        let _ = writeln!(
            out,
            "  {:<16}{:>10} -> {:<10}{unit}{}",
            p.profile.as_str(),
            fmt_num(p.fleet.baseline),
            fmt_num(p.fleet.window),
            if p.regressed { "   REGRESSED" } else { "" }
        );
        if p.regressed || p.concentrated_on.is_some() {
            for place in p.places.iter().take(MAX_PLACES_SHOWN) {
                let _ = writeln!(
                    out,
                    "      {:<28}{:>10} -> {:<10} x{}{}",
                    place.place,
                    fmt_num(place.value.baseline),
                    fmt_num(place.value.window),
                    fmt_num(place.ratio),
                    if p.concentrated_on.as_deref() == Some(place.place.as_str()) {
                        "   <- here"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Fleet-wide signals (baseline -> incident):");
    for s in &d.signals {
        let _ = writeln!(
            out,
            "  [{}] {:<30}{:>10} -> {:<10} x{}",
            if s.crossed { "x" } else { " " },
            s.signal,
            fmt_num(s.value.baseline),
            fmt_num(s.value.window),
            fmt_num(s.ratio)
        );
    }
    for m in &d.missing {
        let _ = writeln!(out, "Missing: {m}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus as three replicas' numbers: per metric, per window, the fleet value and each
    /// replica's.
    struct Fleet {
        baseline_end: f64,
        /// (metric substring, fleet value, per-replica values) for each window.
        baseline: Vec<(&'static str, f64, [f64; 3])>,
        window: Vec<(&'static str, f64, [f64; 3])>,
    }

    impl Query for Fleet {
        fn instant(&self, promql: &str, at: f64) -> Result<Vec<Sample>, QueryError> {
            let table = if at <= self.baseline_end {
                &self.baseline
            } else {
                &self.window
            };
            // The success rate's numerator names the outcome; the order in the table decides.
            let Some((_, fleet, places)) = table.iter().find(|(m, ..)| promql.contains(m)) else {
                return Ok(Vec::new());
            };
            if promql.contains("instance") {
                Ok(["a:9464", "b:9464", "c:9464"]
                    .iter()
                    .zip(places)
                    .map(|(i, v)| Sample {
                        labels: [("instance".to_owned(), (*i).to_owned())].into(),
                        value: *v,
                    })
                    .collect())
            } else {
                Ok(vec![Sample {
                    labels: BTreeMap::new(),
                    value: *fleet,
                }])
            }
        }
    }

    const S: u64 = 1_000_000_000;

    fn windows() -> (TimeWindow, TimeWindow) {
        (
            TimeWindow {
                start_mono_ns: 1000 * S,
                end_mono_ns: 1060 * S,
            },
            TimeWindow {
                start_mono_ns: 1100 * S,
                end_mono_ns: 1160 * S,
            },
        )
    }

    fn steady() -> Vec<(&'static str, f64, [f64; 3])> {
        vec![
            ("outcome=\"ok\"", 1.0, [1.0, 1.0, 1.0]),
            ("time_to_first_token", 0.2, [0.2, 0.2, 0.21]),
            ("time_per_output_token", 0.02, [0.02, 0.02, 0.02]),
            ("request_duration", 0.5, [0.5, 0.5, 0.5]),
            ("inferscope_requests_total", 120.0, [40.0, 40.0, 40.0]),
            ("prompt_tokens_bucket", 200.0, [200.0; 3]),
        ]
    }

    #[test]
    fn one_slowed_replica_is_named() {
        let (b, w) = windows();
        let mut window = steady();
        window[1] = ("time_to_first_token", 0.8, [0.2, 1.1, 0.21]);
        window[2] = ("time_per_output_token", 0.06, [0.02, 0.08, 0.02]);
        let q = Fleet {
            baseline_end: 1060.0,
            baseline: steady(),
            window,
        };
        let d = diagnose(&q, b, w).unwrap();
        let ttft = &d.profiles[0];
        assert!(ttft.regressed, "{}", render(&d));
        assert_eq!(ttft.concentrated_on.as_deref(), Some("b:9464"));
        assert_eq!(d.place.as_deref(), Some("b:9464"));
        assert_eq!(d.cause, super::super::Cause::DegradedDevice);
        assert!(render(&d).contains("<- here"));
        assert!(d.missing.iter().all(|m| !m.contains("time_to_first_token")));
    }

    /// In a large fleet one slowed replica does not move the fleet's P99: it is still named.
    #[test]
    fn one_regressed_replica_is_named_when_the_fleet_does_not_move() {
        let (b, w) = windows();
        let mut window = steady();
        window[1] = ("time_to_first_token", 0.2, [0.2, 0.9, 0.21]);
        let q = Fleet {
            baseline_end: 1060.0,
            baseline: steady(),
            window,
        };
        let d = diagnose(&q, b, w).unwrap();
        assert!(!d.profiles[0].regressed);
        assert_eq!(d.place.as_deref(), Some("b:9464"), "{}", render(&d));
        assert!(
            d.summary.contains("one replica did: b:9464"),
            "{}",
            d.summary
        );
        assert_eq!(d.cause, super::super::Cause::DegradedDevice);
    }

    #[test]
    fn the_same_fleet_twice_is_none() {
        let (b, w) = windows();
        let q = Fleet {
            baseline_end: 1060.0,
            baseline: steady(),
            window: steady(),
        };
        let d = diagnose(&q, b, w).unwrap();
        assert!(d.profiles.iter().all(|p| !p.regressed), "{}", render(&d));
        assert_eq!(d.cause, super::super::Cause::None);
        assert!(d.summary.starts_with("No profile regressed"));
    }

    #[test]
    fn a_fleet_wide_slowdown_with_more_arrivals_is_traffic_not_one_replica() {
        let (b, w) = windows();
        let mut window = steady();
        window[1] = ("time_to_first_token", 0.9, [0.8, 0.9, 1.0]);
        window[4] = ("inferscope_requests_total", 300.0, [100.0, 100.0, 100.0]);
        let q = Fleet {
            baseline_end: 1060.0,
            baseline: steady(),
            window,
        };
        let d = diagnose(&q, b, w).unwrap();
        assert_eq!(d.profiles[0].concentrated_on, None, "{}", render(&d));
        assert_eq!(d.cause, super::super::Cause::TrafficSpike);
    }

    #[test]
    fn missing_metrics_and_replicas_are_said() {
        let (b, w) = windows();
        let mut window = steady();
        window.retain(|(m, ..)| !m.contains("time_per_output_token"));
        let q = Fleet {
            baseline_end: 1060.0,
            baseline: vec![],
            window,
        };
        let d = diagnose(&q, b, w).unwrap();
        assert!(
            d.missing
                .iter()
                .any(|m| m.contains("inferscope_requests_total")),
            "{:?}",
            d.missing
        );
        assert!(
            d.missing.iter().any(|m| m.contains("a:9464")),
            "{:?}",
            d.missing
        );
        assert!(d.profiles.iter().all(|p| !p.regressed));
    }
}
