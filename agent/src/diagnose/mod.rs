//! Diagnose stage: names the branch of a TTFT regression between a baseline window and an
//! incident window, with the measured evidence. A pure function of its inputs: the CLI feeds it
//! recorded files, a daemon can feed it the records it holds.
//!
//! The playbook it automates: split P99 TTFT into queue wait and prefill; if queue wait grew,
//! compare arrivals (a traffic spike) with KV usage and preemptions (memory pressure starving
//! admission); if prefill grew, compare prompt sizes (prompts grew) with the device's speed at
//! unchanged work (a slower device) and with how the scheduler splits prefills. Every threshold
//! lives in [`thresholds`].
mod decide;
pub mod history;
mod input;
mod report;
mod signals;
#[cfg(test)]
mod tests;
pub mod thresholds;
pub mod watch;
mod window;

use serde::Serialize;

pub use input::{
    DeviceSample, EngineSample, InputError, Inputs, MAX_LINE_BYTES, MAX_LINES, ReadStats,
    RequestSample, StepSample, read_jsonl, read_steps,
};
pub use report::render;
pub use signals::WindowSignals;
pub use window::{
    Bound, TimeWindow, Timeline, WindowError, WindowSpec, human_ns, parse_bound, parse_window,
};

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
    TrafficSpike,
    PromptGrowth,
    DegradedDevice,
    SchedulerConfig,
    None,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::KvPressure => "kv_pressure",
            Cause::TrafficSpike => "traffic_spike",
            Cause::PromptGrowth => "prompt_growth",
            Cause::DegradedDevice => "degraded_device",
            Cause::SchedulerConfig => "scheduler_config",
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

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    pub baseline_window: TimeWindow,
    pub incident_window: TimeWindow,
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
    /// Other causes whose signals also crossed their thresholds.
    pub also_crossed: Vec<Cause>,
    /// One sentence for people.
    pub summary: String,
    /// The deciding signals first.
    pub evidence: Vec<Evidence>,
    pub notes: Vec<String>,
}

/// Compares the incident window with the baseline window.
pub fn diagnose(inputs: &Inputs, baseline: TimeWindow, window: TimeWindow) -> Diagnosis {
    let b = signals::measure(inputs, &baseline);
    let w = signals::measure(inputs, &window);
    decide::decide(&b, &w, baseline, window)
}
