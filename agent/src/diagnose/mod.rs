//! Diagnose stage: names the branch of a TTFT regression between a baseline window and an
//! incident window, with the measured evidence. A pure function of its inputs: the CLI feeds it
//! recorded files, a daemon can feed it the records it holds.
//!
//! The playbook it automates: split P99 TTFT into queue wait and prefill; if queue wait grew,
//! compare arrivals (a traffic spike) with KV usage and preemptions (memory pressure starving
//! admission); if prefill grew, compare prompt sizes (prompts grew) with the device's speed at
//! unchanged work (a slower device) and with how the scheduler splits prefills. Every threshold
//! lives in [`inferscope_model::thresholds`].
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
mod decide;
#[cfg(test)]
mod decode_tests;
mod evidence;
pub(crate) mod fleet;
pub(crate) mod history;
pub(crate) mod input;
mod outcome;
mod profiles;
pub(crate) mod report;
#[cfg(test)]
mod tests;
mod tpot;
pub(crate) mod watch;
pub(crate) mod window;

pub(crate) use evidence::WindowSignals;
pub(crate) use input::{
    DeviceSample, EngineConfigSample, EngineSample, Inputs, ReadStats, RequestSample, StepSample,
    read_jsonl, read_steps,
};
pub(crate) use outcome::{ErrorBranch, ErrorCause};
pub(crate) use profiles::{Profile, ProfileChange};
pub(crate) use report::render;
use serde::Serialize;
pub(crate) use tpot::TpotBranch;
pub(crate) use window::{TimeWindow, Timeline, human_ns, parse_window};

/// The phase of TTFT that grew the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queue,
    Prefill,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    KvPressure,
    /// Disaggregated serving: decode legs waited longer for the prefill server's KV cache.
    KvTransfer,
    TrafficSpike,
    PromptGrowth,
    /// Prompts unchanged, but the engine's prefix cache served less of them: more prompt tokens
    /// to compute per request (a router change sent requests away from the replica that held
    /// their prefix, an eviction, a changed system prompt).
    PrefixCacheMiss,
    DegradedDevice,
    SchedulerConfig,
    /// TPOT: more requests per decode step at the same step cost per request.
    BatchGrowth,
    /// TPOT: decode steps also carried other requests' prefill (chunked prefill).
    PrefillInterference,
    None,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::KvPressure => "kv_pressure",
            Cause::KvTransfer => "kv_transfer",
            Cause::TrafficSpike => "traffic_spike",
            Cause::PromptGrowth => "prompt_growth",
            Cause::PrefixCacheMiss => "prefix_cache_miss",
            Cause::DegradedDevice => "degraded_device",
            Cause::SchedulerConfig => "scheduler_config",
            Cause::BatchGrowth => "batch_growth",
            Cause::PrefillInterference => "prefill_interference",
            Cause::None => "none",
        }
    }
}

/// A value in the baseline window and in the incident window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair<T> {
    pub baseline: T,
    pub window: T,
}

/// How an evidence line's threshold applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Test {
    /// window / baseline at or above the threshold.
    Ratio,
    /// window / baseline at or below the threshold (a capacity that fell).
    RatioAtMost,
    /// the window's value at or above the threshold.
    AtLeast,
    /// measured for context; no threshold.
    Context,
}

/// One measured signal, in both windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evidence {
    pub signal: &'static str,
    pub unit: &'static str,
    pub baseline: Option<f64>,
    pub window: Option<f64>,
    /// window / baseline, where both are known and the baseline is not zero.
    pub ratio: Option<f64>,
    pub test: Test,
    pub threshold: Option<f64>,
    /// The signal crossed its threshold.
    pub crossed: bool,
    /// The cause this signal points to when it crosses.
    pub points_to: Cause,
    /// What exactly was compared, where the name alone does not say.
    pub detail: Option<String>,
}

/// One cause's part in the TTFT growth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseShare {
    pub cause: Cause,
    /// Share of the P99 growth (queue wait + prefill) this cause explains, 0..1.
    pub share: f64,
    /// The same share of the P99 TTFT growth, in ms.
    pub explains_ms: f64,
    /// The factor its strongest crossed signal moved by (a fall counts as its inverse).
    pub factor: f64,
    /// Its crossed signals.
    pub signals: Vec<&'static str>,
}

/// How a traffic spike showed: more arrivals per second (open loop), more requests in the
/// system (closed loop: more clients), or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadForm {
    Rate,
    Concurrency,
    RateAndConcurrency,
}

/// A scheduler setting that differs between the windows' engine processes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigChange {
    pub setting: String,
    pub baseline: Option<String>,
    pub window: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    pub baseline_window: TimeWindow,
    pub incident_window: TimeWindow,
    /// The first question: which of TTFT, TPOT, ITL, E2E and the success rate regressed.
    pub profiles: Vec<ProfileChange>,
    /// Some profile regressed (the fields below `requests` explain TTFT; `tpot` and `errors`
    /// the others).
    pub any_regression: bool,
    /// A regressed profile whose branch named no cause.
    pub unexplained: bool,
    /// Why TPOT or ITL regressed, where one did.
    pub tpot: Option<TpotBranch>,
    /// Why the success rate fell, where it did.
    pub errors: Option<ErrorBranch>,
    /// Requests with a TTFT that arrived in each window.
    pub requests: Pair<usize>,
    pub ttft_p99_ms: Pair<Option<f64>>,
    pub queue_wait_p99_ms: Pair<Option<f64>>,
    pub prefill_p99_ms: Pair<Option<f64>>,
    /// P99 TTFT crossed the regression thresholds.
    pub regression: bool,
    /// Requests in the incident window slower than the baseline's P99 TTFT.
    pub requests_over_baseline_p99: usize,
    pub dominant_phase: Phase,
    pub cause: Cause,
    /// 0..1: samples, the deciding signal's margin over its threshold, how clearly one phase
    /// dominates, and whether other causes' signals crossed too.
    pub confidence: f64,
    /// Other causes whose signals also crossed their thresholds, by their share.
    pub also_crossed: Vec<Cause>,
    /// The second cause, where it explains at least SECONDARY_MIN_SHARE of the growth.
    pub secondary_cause: Cause,
    /// Every crossed cause by how much of the growth it explains, largest first.
    pub causes: Vec<CauseShare>,
    /// Share of the P99 growth (queue wait + prefill) no crossed cause explains.
    pub unexplained_share: Option<f64>,
    /// How a traffic spike showed, where one is named.
    pub traffic_form: Option<LoadForm>,
    /// Requests the engine preempted in the incident window (ids, at most 20) and how many.
    pub preempted_requests: Vec<String>,
    pub preempted_count: usize,
    /// The engines' scheduler settings (from their command lines) that differ between windows.
    pub engine_config_changes: Vec<ConfigChange>,
    /// What the inputs lacked, and what could not be judged for it.
    pub missing: Vec<String>,
    /// One sentence for people.
    pub summary: String,
    /// The deciding signals first.
    pub evidence: Vec<Evidence>,
    pub notes: Vec<String>,
}

/// Compares the incident window with the baseline window: which profiles regressed, then each
/// regressed one's branch.
pub fn diagnose(inputs: &Inputs, baseline: TimeWindow, window: TimeWindow) -> Diagnosis {
    let b = evidence::measure(inputs, &baseline);
    let w = evidence::measure(inputs, &window);
    let coverage = decide::Coverage::of(inputs);
    let mut d = decide::decide(&b, &w, baseline, window, &coverage);
    d.profiles = profiles::compare(inputs, &baseline, &window, d.regression);
    let regressed = |p: Profile| d.profiles.iter().any(|c| c.profile == p && c.regressed);
    let decode: Vec<&str> = [Profile::Tpot, Profile::Itl]
        .into_iter()
        .filter(|p| regressed(*p))
        .map(Profile::as_str)
        .collect();
    if !decode.is_empty() {
        // Recorded steps come in start order; only out-of-order inputs pay for a sorted copy.
        let steps: std::borrow::Cow<'_, [StepSample]> =
            if inputs.steps.is_sorted_by_key(|s| s.start_mono_ns) {
                std::borrow::Cow::Borrowed(&inputs.steps)
            } else {
                let mut sorted = inputs.steps.clone();
                sorted.sort_by_key(|s| s.start_mono_ns);
                std::borrow::Cow::Owned(sorted)
            };
        let (bd, wd) = (
            tpot::measure(inputs, &steps, &baseline),
            tpot::measure(inputs, &steps, &window),
        );
        d.tpot = Some(tpot::explain(&bd, &wd, &d.evidence, &decode.join(" and ")));
    }
    if regressed(Profile::SuccessRate) {
        d.errors = Some(outcome::explain(inputs, &baseline, &window));
    }
    d.any_regression = d.profiles.iter().any(|p| p.regressed);
    d.unexplained = (d.regression && d.cause == Cause::None)
        || d.tpot.as_ref().is_some_and(|t| t.cause == Cause::None)
        || d.errors
            .as_ref()
            .is_some_and(|e| e.cause == ErrorCause::None);
    d.summary = profiles::headline(&d.profiles, &d.summary, d.tpot.as_ref(), d.errors.as_ref());
    d
}
