//! TensorRT-LLM: `trtllm-serve`, or any process that loaded libtensorrt_llm.
use super::{Engine, MetricSource, MetricsEndpoint, ProcessInfo, Signal};

pub(super) struct TensorRtLlm;

impl Engine for TensorRtLlm {
    fn name(&self) -> &'static str {
        "tensorrt-llm"
    }

    fn package(&self) -> Option<&'static str> {
        Some("tensorrt_llm")
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("trtllm-serve") || p.maps_file("libtensorrt_llm")
    }

    fn metrics(&self) -> Option<&'static MetricsEndpoint> {
        Some(&METRICS)
    }
}

/// trtllm-serve's Prometheus endpoint (tensorrt_llm/metrics/collector.py; its plain `/metrics`
/// is JSON iteration stats). No preemption counter: paused requests are only a gauge.
static METRICS: MetricsEndpoint = MetricsEndpoint {
    path: "/prometheus/metrics",
    sources: &[
        // usedNumBlocks / maxNumBlocks.
        MetricSource::new("trtllm_kv_cache_utilization", Signal::KvCacheUsage),
        MetricSource::new("trtllm_num_requests_running", Signal::RequestsRunning),
        MetricSource::new("trtllm_num_requests_waiting", Signal::RequestsWaiting),
        MetricSource::new("trtllm_prompt_tokens_total", Signal::PromptTokensTotal),
        MetricSource::new(
            "trtllm_generation_tokens_total",
            Signal::GenerationTokensTotal,
        ),
    ],
    enable_hint: "iteration metrics need enable_iter_perf_stats: true in trtllm-serve's LLM options",
};

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_engine_fixture() {
        let got = super::super::fixture_signals(
            "tensorrt-llm",
            include_bytes!("../../../tests/fixtures/metrics/tensorrt_llm.txt"),
        );
        super::super::assert_signals(
            &got,
            // No preemption counter in TensorRT-LLM.
            [
                Some(0.25),
                Some(8.0),
                Some(3.0),
                None,
                Some(4096.0),
                Some(8192.0),
            ],
        );
    }
}
