//! SGLang's server (`python -m sglang.launch_server`, `sglang serve`), its scheduler and
//! detokenizer processes (which title themselves `sglang::scheduler…`, `sglang::detokenizer`),
//! and the pickled ZMQ IPC between them (see [`ipc`]).
mod ipc;
mod layout;
mod messages;
mod scheduler;
mod state;

pub(super) use ipc::SglangIpc;

use super::{Engine, EngineIpc, MetricSource, MetricsEndpoint, ProcessInfo, RpcIdField, Signal};

pub(super) struct Sglang;

impl Engine for Sglang {
    fn name(&self) -> &'static str {
        "sglang"
    }

    fn package(&self) -> Option<&'static str> {
        Some("sglang")
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("sglang.launch_server")
            || p.cmdline_has("sglang serve")
            || p.cmdline.starts_with("sglang::")
    }

    fn ipc(&self) -> Option<Box<dyn EngineIpc>> {
        Some(Box::new(SglangIpc::default()))
    }

    fn metrics(&self) -> Option<&'static MetricsEndpoint> {
        Some(&METRICS)
    }

    fn rpc_id_fields(&self) -> &'static [RpcIdField] {
        // `--smg-grpc-mode` (smg-grpc-servicer's SglangScheduler, smg-grpc-proto's
        // sglang_scheduler.proto): `GenerateRequest.request_id` is the scheduler's rid. The
        // native server of `--grpc-port` (Rust, proto/sglang/runtime/v1/sglang.proto): `rid`,
        // after the prompt's token ids or text.
        &[
            RpcIdField {
                path: "/sglang.runtime.v1.SglangService/Generate",
                field: 7,
            },
            RpcIdField {
                path: "/sglang.runtime.v1.SglangService/TextGenerate",
                field: 8,
            },
            RpcIdField {
                path: "/sglang.runtime.v1.SglangService/Embed",
                field: 2,
            },
            RpcIdField {
                path: "/sglang.runtime.v1.SglangService/TextEmbed",
                field: 2,
            },
            RpcIdField {
                path: "/sglang.runtime.v1.SglangService/Classify",
                field: 3,
            },
            RpcIdField {
                path: "/sglang.grpc.scheduler.SglangScheduler/Generate",
                field: 1,
            },
            RpcIdField {
                path: "/sglang.grpc.scheduler.SglangScheduler/Embed",
                field: 1,
            },
        ]
    }
}

/// SGLang's `/metrics` with `--enable-metrics` (sglang/srt/observability/metrics_collector.py).
/// Preemption is "retraction": decode requests pushed back to the queue when KV runs out.
static METRICS: MetricsEndpoint = MetricsEndpoint {
    path: "/metrics",
    sources: &[
        MetricSource::new("sglang:token_usage", Signal::KvCacheUsage),
        MetricSource::new("sglang:num_running_reqs", Signal::RequestsRunning),
        MetricSource::new("sglang:num_queue_reqs", Signal::RequestsWaiting),
        MetricSource::new(
            "sglang:num_retracted_requests_total",
            Signal::PreemptionsTotal,
        ),
        MetricSource::new("sglang:prompt_tokens_total", Signal::PromptTokensTotal),
        MetricSource::new(
            "sglang:generation_tokens_total",
            Signal::GenerationTokensTotal,
        ),
    ],
    enable_hint: "start SGLang with --enable-metrics",
};

#[cfg(test)]
mod tests;
