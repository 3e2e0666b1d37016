//! vLLM: the OpenAI-compatible API server (`vllm serve`, or the entrypoint module) and its
//! EngineCore process, and the V1 IPC between them (ZMQ + msgpack, see [`ipc`]).
mod disagg;
mod ipc;
mod layout;
mod messages;
mod state;

pub(super) use ipc::VllmIpc;

use super::{Engine, EngineIpc, MetricSource, MetricsEndpoint, ProcessInfo, RpcIdField, Signal};

pub(super) struct Vllm;

impl Engine for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn package(&self) -> Option<&'static str> {
        Some("vllm")
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

    fn scheduler_flags(&self) -> &'static [super::config::ConfigFlag] {
        FLAGS
    }

    fn disagg_leg(&self, hints: &inferscope_model::DisaggHints) -> inferscope_model::LegParse {
        disagg::leg(hints)
    }

    fn kv_transfer_source(&self) -> Option<&'static str> {
        // The scheduler stats' `kv_connector_stats` (NIXL's `transfer_duration`), read from
        // the engine's IPC.
        Some("vllm_kv_connector_stats")
    }

    fn rpc_id_fields(&self) -> &'static [RpcIdField] {
        // `vllm serve --grpc` (smg-grpc-servicer's VllmEngine, smg-grpc-proto's
        // vllm_engine.proto): `GenerateRequest.request_id`, the external id AsyncLLM's engine
        // requests carry (with their `-<8 chars>` suffix), as the OpenAI server's
        // `chatcmpl-<id>` is.
        &[
            RpcIdField {
                path: "/vllm.grpc.engine.VllmEngine/Generate",
                field: 1,
            },
            RpcIdField {
                path: "/vllm.grpc.engine.VllmEngine/Embed",
                field: 1,
            },
        ]
    }
}

/// `vllm serve`'s scheduler and KV-cache flags (vllm/engine/arg_utils.py).
static FLAGS: &[super::config::ConfigFlag] = &[
    flag("max_num_seqs", &["--max-num-seqs"], true),
    flag(
        "max_num_batched_tokens",
        &["--max-num-batched-tokens"],
        true,
    ),
    flag(
        "enable_chunked_prefill",
        &["--enable-chunked-prefill"],
        false,
    ),
    flag(
        "no_enable_chunked_prefill",
        &["--no-enable-chunked-prefill"],
        false,
    ),
    flag(
        "gpu_memory_utilization",
        &["--gpu-memory-utilization"],
        true,
    ),
    flag(
        "num_gpu_blocks_override",
        &["--num-gpu-blocks-override"],
        true,
    ),
    flag("block_size", &["--block-size"], true),
    flag("max_model_len", &["--max-model-len"], true),
    flag("scheduling_policy", &["--scheduling-policy"], true),
];

const fn flag(
    setting: &'static str,
    flags: &'static [&'static str],
    takes_value: bool,
) -> super::config::ConfigFlag {
    super::config::ConfigFlag {
        setting,
        flags,
        takes_value,
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
        // The NIXL connector's own transfer times (its KVConnectorPromMetrics; served only
        // with `--kv-transfer-config` naming NIXL, or a connector reporting NIXL's stats).
        MetricSource::new(
            "vllm:nixl_xfer_time_seconds_count",
            Signal::KvTransfersTotal,
        ),
        MetricSource::new(
            "vllm:nixl_xfer_time_seconds_sum",
            Signal::KvTransferSecondsTotal,
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
