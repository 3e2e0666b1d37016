//! The vocabulary engines use to describe their metrics endpoint: each engine module maps its own
//! metric names onto these signals, so nothing downstream knows any engine's names.

/// A quantity inferscope reads from every engine that exposes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// Fraction of the KV cache in use, 0..1.
    KvCacheUsage,
    /// Requests admitted and running in the engine's batch.
    RequestsRunning,
    /// Requests waiting for admission.
    RequestsWaiting,
    /// Requests evicted to free KV memory, since the engine started (counter).
    PreemptionsTotal,
    /// Prompt tokens prefilled since the engine started (counter).
    PromptTokensTotal,
    /// Tokens generated since the engine started (counter).
    GenerationTokensTotal,
    /// KV-cache transfers the engine's KV connector finished, and the seconds they took by
    /// its own measure, since the engine started (a histogram's count and sum: vLLM's
    /// `vllm:nixl_xfer_time_seconds`).
    KvTransfersTotal,
    KvTransferSecondsTotal,
}

impl Signal {
    pub const ALL: [Signal; 8] = [
        Signal::KvCacheUsage,
        Signal::RequestsRunning,
        Signal::RequestsWaiting,
        Signal::PreemptionsTotal,
        Signal::PromptTokensTotal,
        Signal::GenerationTokensTotal,
        Signal::KvTransfersTotal,
        Signal::KvTransferSecondsTotal,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether series of this signal add up (counts across data-parallel engines, label
    /// values) or average (a usage fraction per engine).
    pub fn sums(self) -> bool {
        !matches!(self, Signal::KvCacheUsage)
    }
}

/// One engine metric that gives a signal.
#[derive(Debug, Clone, Copy)]
pub struct MetricSource {
    /// The sample name as served (counters with their `_total`).
    pub metric: &'static str,
    pub signal: Signal,
    /// Factor to the signal's unit (e.g. 0.01 for a percentage).
    pub scale: f64,
}

impl MetricSource {
    pub const fn new(metric: &'static str, signal: Signal) -> Self {
        Self {
            metric,
            signal,
            scale: 1.0,
        }
    }
}

/// Where an engine serves its metrics, and what they mean.
#[derive(Debug)]
pub struct MetricsEndpoint {
    /// HTTP path on the engine's serving port.
    pub path: &'static str,
    /// In preference order: when several metrics give the same signal (a renamed metric kept
    /// for older versions), the first one present in a scrape wins.
    pub sources: &'static [MetricSource],
    /// What the user does when the endpoint is off, for the warning.
    pub enable_hint: &'static str,
}
