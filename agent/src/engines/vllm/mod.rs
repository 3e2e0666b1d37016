//! vLLM: the OpenAI-compatible API server (`vllm serve`, or the entrypoint module) and its
//! EngineCore process, and the V1 IPC between them (ZMQ + msgpack, see [`ipc`]).
mod ipc;
mod layout;
mod messages;
mod package;
mod state;

use super::{Engine, EngineIpc, MetricSource, MetricsEndpoint, ProcessInfo, Signal};

pub use ipc::VllmIpc;

pub struct Vllm;

impl Engine for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("vllm serve")
            || p.cmdline_has("/vllm ")
            || p.cmdline.ends_with("/vllm")
            || p.cmdline_has("vllm.entrypoints")
            // The engine process names itself with setproctitle.
            || p.cmdline.starts_with("VLLM::EngineCore")
    }

    fn ipc(&self) -> Option<Box<dyn EngineIpc>> {
        Some(Box::new(VllmIpc::default()))
    }

    fn metrics(&self) -> Option<&'static MetricsEndpoint> {
        Some(&METRICS)
    }
}

/// vLLM's `/metrics` (on by default; vllm/v1/metrics/loggers.py). Series carry `model_name`
/// and `engine` (data-parallel rank): counts add up across engines, KV usage averages.
static METRICS: MetricsEndpoint = MetricsEndpoint {
    path: "/metrics",
    sources: &[
        MetricSource::new("vllm:kv_cache_usage_perc", Signal::KvCacheUsage),
        // The V0 name of the same 0..1 gauge.
        MetricSource::new("vllm:gpu_cache_usage_perc", Signal::KvCacheUsage),
        MetricSource::new("vllm:num_requests_running", Signal::RequestsRunning),
        MetricSource::new("vllm:num_requests_waiting", Signal::RequestsWaiting),
        MetricSource::new("vllm:num_preemptions_total", Signal::PreemptionsTotal),
        MetricSource::new("vllm:prompt_tokens_total", Signal::PromptTokensTotal),
        MetricSource::new(
            "vllm:generation_tokens_total",
            Signal::GenerationTokensTotal,
        ),
    ],
    enable_hint: "vLLM serves /metrics unless it runs with --disable-log-stats",
};

#[cfg(test)]
mod metrics_tests {
    #[test]
    fn reads_the_engine_fixture() {
        let got = crate::engines::fixture_signals(
            "vllm",
            include_bytes!("../../../../tests/fixtures/metrics/vllm.txt"),
        );
        crate::engines::assert_signals(
            &got,
            // Two data-parallel engines: KV usage 0.5 and 0.7, running 3+2, waiting 4+1, ...
            [
                Some(0.6),
                Some(5.0),
                Some(5.0),
                Some(10.0),
                Some(1500.0),
                Some(3000.0),
            ],
        );
    }
}

#[cfg(test)]
mod tests;
