//! llama.cpp's HTTP server: the `llama-server` binary, or the library loaded into another
//! process (libllama, or the xllamacpp Python extension).
use super::{
    Engine, HookLayout, MetricSource, MetricsEndpoint, ProcessInfo, SchedulerHook, Signal,
    StructMember, config::ConfigFlag,
};

static HOOKS: &[SchedulerHook] = &[
    SchedulerHook {
        program: "llamacpp_post_tasks",
        // The HTTP handler posts its tasks as a vector, on the thread that read the request.
        symbol: "server_queue::post(std::vector<server_task, std::allocator<server_task> >&&, bool)",
        gives: "the join from HTTP request to engine task",
        per_token: false,
    },
    SchedulerHook {
        program: "llamacpp_defer",
        symbol: "server_queue::defer(server_task&&)",
        gives: "the time a request was parked for want of a free slot",
        per_token: false,
    },
    SchedulerHook {
        program: "llamacpp_requeue",
        symbol: "server_queue::pop_deferred_task",
        gives: "the time a freed slot took a parked request back",
        per_token: false,
    },
    SchedulerHook {
        program: "llamacpp_admit",
        symbol: "server_context_impl::launch_slot_with_task",
        gives: "admission (queue wait vs prefill)",
        per_token: false,
    },
    // Fires for every streamed token (one uprobe hit: ~10 us of the engine thread on the
    // benchmark VM); only the first per admission leaves the kernel. Off unless asked for;
    // without it, prefill ends at the first token written to the socket.
    SchedulerHook {
        program: "llamacpp_partial",
        symbol: "server_context_impl::send_partial_response",
        gives: "the engine's own first-token time",
        per_token: true,
    },
    SchedulerHook {
        program: "llamacpp_final",
        symbol: "server_context_impl::send_final_response",
        gives: "the engine's own finish time",
        per_token: false,
    },
    SchedulerHook {
        program: "llamacpp_release",
        symbol: "server_slot::release()",
        gives: "the time each slot became free",
        per_token: false,
    },
    // Engine steps: older builds run each batch through llama_decode, newer ones through
    // llama_process; both are exported C functions, so stripped builds keep them.
    SchedulerHook {
        program: "llamacpp_decode_begin",
        symbol: "llama_decode",
        gives: "engine step starts (llama_decode builds)",
        per_token: false,
    },
    SchedulerHook {
        program: "llamacpp_step_end",
        symbol: "llama_decode",
        gives: "engine step ends (llama_decode builds)",
        per_token: false,
    },
    SchedulerHook {
        program: "llamacpp_process_begin",
        symbol: "llama_process",
        gives: "engine step starts (llama_process builds)",
        per_token: false,
    },
    SchedulerHook {
        program: "llamacpp_step_end",
        symbol: "llama_process",
        gives: "engine step ends (llama_process builds)",
        per_token: false,
    },
];

pub(super) struct LlamaCpp;

impl Engine for LlamaCpp {
    fn name(&self) -> &'static str {
        "llamacpp"
    }

    fn package(&self) -> Option<&'static str> {
        Some("xllamacpp")
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("llama-server")
            || p.maps_file("xllamacpp")
            || p.maps_file("libllama")
            || p.maps_file("llama-server")
    }

    fn scheduler_hooks(&self) -> &'static [SchedulerHook] {
        HOOKS
    }

    fn hook_objects(&self) -> &'static [&'static str] {
        &["xllamacpp", "llama-server", "libllama"]
    }

    fn hook_layout(&self) -> Option<&'static HookLayout> {
        Some(&LAYOUT)
    }

    fn metrics(&self) -> Option<&'static MetricsEndpoint> {
        Some(&METRICS)
    }

    fn scheduler_flags(&self) -> &'static [ConfigFlag] {
        FLAGS
    }
}

/// llama-server's scheduler flags (tools/server: common/arg.cpp). A prompt longer than n_batch
/// is prefilled over several steps; n_parallel is the number of slots.
static FLAGS: &[ConfigFlag] = &[
    ConfigFlag {
        setting: "n_parallel",
        flags: &["-np", "--parallel"],
        takes_value: true,
    },
    ConfigFlag {
        setting: "n_batch",
        flags: &["-b", "--batch-size"],
        takes_value: true,
    },
    ConfigFlag {
        setting: "n_ubatch",
        flags: &["-ub", "--ubatch-size"],
        takes_value: true,
    },
    ConfigFlag {
        setting: "n_ctx",
        flags: &["-c", "--ctx-size"],
        takes_value: true,
    },
    ConfigFlag {
        setting: "cont_batching",
        flags: &["-cb", "--cont-batching"],
        takes_value: false,
    },
    ConfigFlag {
        setting: "no_cont_batching",
        flags: &["-nocb", "--no-cont-batching"],
        takes_value: false,
    },
    ConfigFlag {
        setting: "n_threads",
        flags: &["-t", "--threads"],
        takes_value: true,
    },
];

/// The ids the hook programs read: both are their struct's first member in the source
/// (tools/server), which DWARF confirms where the build has it.
static LAYOUT: HookLayout = HookLayout {
    members: &[
        StructMember {
            structure: "server_task",
            member: "id",
            assumed_offset: 0,
        },
        StructMember {
            structure: "server_slot",
            member: "id",
            assumed_offset: 0,
        },
    ],
    unit_hint: "server-",
};

/// llama-server `--metrics` (xllamacpp: `endpoint_metrics = True`). No preemption: a full KV
/// cache fails the slot instead.
static METRICS: MetricsEndpoint = MetricsEndpoint {
    path: "/metrics",
    sources: &[
        // Builds before the unified KV cache; current ones serve no KV usage at all.
        MetricSource::new("llamacpp:kv_cache_usage_ratio", Signal::KvCacheUsage),
        MetricSource::new("llamacpp:requests_processing", Signal::RequestsRunning),
        MetricSource::new("llamacpp:requests_deferred", Signal::RequestsWaiting),
        MetricSource::new("llamacpp:prompt_tokens_total", Signal::PromptTokensTotal),
        // Counted when a request finishes, not per token.
        MetricSource::new(
            "llamacpp:tokens_predicted_total",
            Signal::GenerationTokensTotal,
        ),
    ],
    enable_hint: "start llama-server with --metrics (xllamacpp: endpoint_metrics = True)",
};

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_engine_fixture() {
        let got = super::super::fixture_signals(
            "llamacpp",
            include_bytes!("../../../tests/fixtures/metrics/llamacpp.txt"),
        );
        super::super::assert_signals(
            &got,
            // Captured from the real server with 2 slots busy and a third request deferred; this build
            // serves no KV usage, and counts generated tokens only when a request finishes.
            [None, Some(2.0), Some(1.0), None, Some(88.0), Some(0.0)],
        );
    }
}
