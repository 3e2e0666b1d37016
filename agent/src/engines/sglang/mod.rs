//! SGLang's server (`python -m sglang.launch_server`, `sglang serve`), its scheduler and
//! detokenizer processes (which title themselves `sglang::scheduler…`, `sglang::detokenizer`),
//! and the pickled ZMQ IPC between them (see [`ipc`]).
mod ipc;
mod layout;
mod messages;
mod scheduler;
mod state;

use super::{Engine, EngineIpc, MetricSource, MetricsEndpoint, ProcessInfo, RpcIdField, Signal};

pub use ipc::SglangIpc;

pub struct Sglang;

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
mod tests {
    use super::{Engine, ProcessInfo, Sglang};

    #[test]
    fn claims_the_server_and_its_titled_processes() {
        let p = |cmdline: &str| ProcessInfo {
            tgid: 1,
            cmdline: cmdline.into(),
            mapped_files: Vec::new(),
        };
        assert!(Sglang.claims(&p("python -m sglang.launch_server --model-path m")));
        assert!(Sglang.claims(&p("/v/bin/sglang serve --model-path m")));
        assert!(Sglang.claims(&p("sglang::scheduler_TP0")));
        assert!(Sglang.claims(&p("sglang::detokenizer")));
        assert!(!Sglang.claims(&p("python serve.py sglang")));
        assert!(Sglang.ipc().is_some());
    }

    #[test]
    fn reads_the_engine_fixture() {
        let got = super::super::fixture_signals(
            "sglang",
            include_bytes!("../../../../tests/fixtures/metrics/sglang.txt"),
        );
        super::super::assert_signals(
            &got,
            // Prompt and generation counters are split by is_streaming: 800+200, 1500+500.
            [
                Some(0.42),
                Some(6.0),
                Some(2.0),
                Some(4.0),
                Some(1000.0),
                Some(2000.0),
            ],
        );
    }
}

#[cfg(test)]
mod ipc_tests;
