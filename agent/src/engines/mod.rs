//! Engine plugins. Each engine module says how to recognise its processes; later stages (scheduler
//! probes, IPC decoders, metric names) hang off the same trait. Nothing engine-specific lives
//! outside these modules.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
pub(crate) mod config;
mod ipc_router;
mod kserve;
mod llamacpp;
mod package;
mod pd_proxy;
mod sglang;
mod tensorrt_llm;
mod triton;
mod vllm;
mod zmq_reader;

pub(crate) use inferscope_model::metric_names::{MetricSource, MetricsEndpoint, Signal};
use inferscope_model::{Counter, RequestRecord, StepRecord};
pub(crate) use ipc_router::{EngineWord, IpcRouter};

pub(crate) use crate::capture::{
    elf::sched_hooks::{HookLayout, HookSet, SchedulerHook, StructMember},
    process::discovery::ProcessInfo,
};

/// Which way bytes moved on a traced process's socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcDirection {
    Read,
    Write,
}

/// One captured syscall on a socket that may carry an engine's internal IPC.
#[derive(Debug, Clone, Copy)]
pub struct IpcBytes<'a> {
    pub tgid: u32,
    pub tid: u32,
    pub fd: i32,
    /// The fd's connection generation: a new value means a new socket on a reused fd.
    pub conn_gen: u64,
    pub direction: IpcDirection,
    pub data: &'a [u8],
    /// Bytes the syscall moved beyond `data` (not captured).
    pub lost: u64,
}

/// Whether a socket carries the engine's IPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcVerdict {
    Keep,
    /// Not this engine's IPC: the kernel can stop copying this socket's bytes.
    NotIpc,
}

/// An engine's IPC decoder: one per engine kind, fed every candidate socket of its processes
/// (Unix stream sockets, TCP connections that are not the HTTP server's).
pub trait EngineIpc {
    /// Discovery found a process of this engine (before any of its bytes).
    fn add_process(&mut self, _tgid: u32) {}
    fn on_bytes(&mut self, bytes: &IpcBytes<'_>, steps: &mut Vec<StepRecord>) -> IpcVerdict;
    /// [`Self::on_bytes`] for a syscall the kernel stamped at `at_ns` (its entry,
    /// CLOCK_MONOTONIC), for decoders that time steps by the capture itself (SGLang: the end
    /// of a step its outputs do not time is the capture of those outputs).
    fn on_bytes_at(
        &mut self,
        bytes: &IpcBytes<'_>,
        _at_ns: u64,
        steps: &mut Vec<StepRecord>,
    ) -> IpcVerdict {
        self.on_bytes(bytes, steps)
    }
    fn on_close(&mut self, tgid: u32, fd: i32);
    fn forget_process(&mut self, tgid: u32);
    /// Adds what the IPC said about the HTTP request `record` describes (it just finished).
    fn enrich(&mut self, record: &mut RequestRecord);
    /// Whether the engine may still tell about the finished `record`'s request (held back
    /// before [`Self::enrich`], briefly: see `ipc_router`).
    fn awaits_engine(&self, _record: &RequestRecord) -> bool {
        false
    }
    fn counters(&self) -> Vec<(Counter, u64)>;
}

pub trait Engine: Sync {
    /// Stable name used in records and metrics ("llamacpp", "vllm", ...).
    fn name(&self) -> &'static str;
    /// Whether `process` is this engine's serving process.
    fn claims(&self, process: &ProcessInfo) -> bool;
    /// Scheduler functions to uprobe, for native engines.
    fn scheduler_hooks(&self) -> &'static [SchedulerHook] {
        &[]
    }
    /// Which mapped files (by file-name substring) hold those functions.
    fn hook_objects(&self) -> &'static [&'static str] {
        &[]
    }
    /// Struct members the hook programs read, for engines whose programs read any.
    fn hook_layout(&self) -> Option<&'static HookLayout> {
        None
    }
    /// The engine's own Prometheus endpoint on its serving port, and which of its metrics give
    /// which of inferscope's signals.
    fn metrics(&self) -> Option<&'static MetricsEndpoint> {
        None
    }
    /// A decoder for the engine's internal IPC, for engines whose IPC the agent understands.
    fn ipc(&self) -> Option<Box<dyn EngineIpc>> {
        None
    }
    /// The command-line flags that set the engine's scheduler (slots, batch and token
    /// budgets), for `diagnose` to show a setting next to its effect.
    fn scheduler_flags(&self) -> &'static [config::ConfigFlag] {
        &[]
    }
    /// Which leg of a disaggregated (prefill/decode) request a record served, read from what
    /// its bodies said about the KV hand-off, for engines that serve disaggregated.
    fn disagg_leg(&self, _hints: &inferscope_model::DisaggHints) -> inferscope_model::LegParse {
        inferscope_model::LegParse::None
    }

    /// Whether this kind is a proxy (router) in front of disaggregated prefill/decode servers,
    /// whose records the stitcher joins to the decode leg they relayed.
    fn pd_proxy(&self) -> bool {
        false
    }

    /// Where this engine's `engine_kv_transfer_ms` comes from, named in the stitched record.
    fn kv_transfer_source(&self) -> Option<&'static str> {
        None
    }

    /// The Python distribution whose installed version is the engine's version, for engines
    /// shipped as one (`inferscope check` names the version).
    fn package(&self) -> Option<&'static str> {
        None
    }

    /// The gRPC methods of the engine's own gRPC server whose request message names the
    /// request as the engine's records do (the join key X-Request-Id is over HTTP).
    fn rpc_id_fields(&self) -> &'static [RpcIdField] {
        &[]
    }

    /// The bidirectional gRPC methods of the engine's server whose one stream carries many
    /// calls, one per request message (KServe's `ModelStreamInfer`): each becomes a record of its
    /// own.
    fn call_streams(&self) -> &'static [CallStream] {
        &[]
    }
}

/// A bidirectional gRPC method that carries one call per request message, and how its messages
/// name their call.
#[derive(Debug, Clone, Copy)]
pub struct CallStream {
    /// The method's `:path`.
    pub path: &'static str,
    /// The call id a request message's head carries, if it can be read.
    pub request_id: fn(&[u8]) -> Option<String>,
    /// What a response message's head says of its call.
    pub response: fn(&[u8]) -> StreamReply,
}

/// One response message of a call stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamReply {
    /// The id of the call it answers, where it carries one.
    pub id: Option<String>,
    pub last: LastReply,
    /// The engine answered with an error instead of a result.
    pub error: bool,
}

/// Whether a response ends its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastReply {
    Yes,
    No,
    /// Its head could not be read that far (compressed, cut, or lost).
    Unread,
}

/// The call stream whose `:path` is `path`, whichever engine serves it: the path names its
/// protocol, so a server not identified as that engine is decoded too.
pub fn call_stream(path: &str) -> Option<&'static CallStream> {
    ENGINES
        .iter()
        .flat_map(|e| e.call_streams())
        .find(|c| c.path == path)
}

/// Whether `path` is a call stream's (see [`call_stream`]).
pub(crate) fn is_call_stream(path: &str) -> bool {
    call_stream(path).is_some()
}

/// Whether a message head from `side` of call stream `path` names its call: a request with an
/// id, a response that echoes one. What a call stream whose message boundaries were lost takes
/// up again at.
pub(crate) fn names_a_call(path: &str, side: inferscope_decode::http2::Side, head: &[u8]) -> bool {
    use inferscope_decode::http2::Side;
    call_stream(path).is_some_and(|rpc| match side {
        Side::Client => (rpc.request_id)(head).is_some(),
        Side::Server => (rpc.response)(head).id.is_some(),
    })
}

/// A gRPC method whose request message carries the engine's request id in a top-level string
/// field.
#[derive(Debug, Clone, Copy)]
pub struct RpcIdField {
    /// The method's `:path` (`/package.Service/Method`).
    pub path: &'static str,
    /// The field number of the id in the method's request message.
    pub field: u32,
}

/// The field of `path`'s request message that names the engine's request, whichever engine
/// declares it: a gRPC path names its protocol (its package), so a server not identified as that
/// engine is read too.
pub(crate) fn rpc_id_field(path: &str) -> Option<u32> {
    ENGINES
        .iter()
        .flat_map(|e| e.rpc_id_fields())
        .find(|f| f.path == path)
        .map(|f| f.field)
}

/// The version of `engine` that process `tgid` runs, where its package metadata says it.
pub(crate) fn version_of(tgid: u32, engine: &str) -> Option<String> {
    package::process_version(tgid, by_name(engine)?.package()?)
}

/// Whether the agent decodes `engine`'s internal IPC (its decoder then needs the process's
/// Unix stream or ZeroMQ sockets).
pub(crate) fn decodes_ipc(engine: &str) -> bool {
    by_name(engine).is_some_and(|e| e.ipc().is_some())
}

/// The scheduler settings of `engine`'s process from its arguments (empty for engines without
/// a flag table, or none of those flags given: the engine's defaults).
pub(crate) fn scheduler_config<S: AsRef<str>>(
    engine: &str,
    args: &[S],
) -> std::collections::BTreeMap<String, String> {
    by_name(engine)
        .map(|e| config::parse(e.scheduler_flags(), args))
        .unwrap_or_default()
}

/// The plugin behind an engine name from discovery.
pub fn by_name(name: &str) -> Option<&'static dyn Engine> {
    ENGINES.iter().copied().find(|e| e.name() == name)
}

static ENGINES: &[&dyn Engine] = &[
    // First: a proxy's command line may name an engine (its flags, its script's folder).
    &pd_proxy::PdProxy,
    &llamacpp::LlamaCpp,
    &vllm::Vllm,
    &sglang::Sglang,
    &tensorrt_llm::TensorRtLlm,
    &triton::Triton,
];

/// The engine that claims `process`, else a user pattern that matches it (reported as "custom").
pub(crate) fn identify(process: &ProcessInfo, user_patterns: &[String]) -> Option<&'static str> {
    if let Some(engine) = ENGINES.iter().find(|e| e.claims(process)) {
        return Some(engine.name());
    }
    user_patterns
        .iter()
        .any(|p| process.cmdline_has(p) || process.maps_file(p))
        .then_some("custom")
}

/// Test support: an engine's committed exposition fixture read through its metric table.
#[cfg(test)]
pub(crate) fn fixture_signals(engine: &str, fixture: &[u8]) -> Vec<(Signal, Option<f64>)> {
    use inferscope_decode::prometheus::Limits;

    use crate::join::engine_metrics::snapshot;
    let endpoint = by_name(engine)
        .and_then(|e| e.metrics())
        .expect("engine has a metrics table");
    let (snap, stats) = snapshot(fixture, endpoint, &Limits::default());
    assert_eq!(stats.skipped(), 0, "{engine} fixture: {stats:?}");
    Signal::ALL.iter().map(|&s| (s, snap.get(s))).collect()
}

#[cfg(test)]
pub(crate) fn assert_signals(got: &[(Signal, Option<f64>)], want: [Option<f64>; 6]) {
    for ((signal, got), want) in got.iter().zip(want) {
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{signal:?}: {g} != {w}"),
            _ => assert_eq!(*got, want, "{signal:?}"),
        }
    }
}

/// What `engine` asks capture to hook in its processes, for engines with scheduler hooks.
pub(crate) fn hook_set(engine: &str) -> Option<HookSet> {
    let engine = by_name(engine)?;
    Some(HookSet {
        hooks: engine.scheduler_hooks(),
        objects: engine.hook_objects(),
        layout: engine.hook_layout(),
    })
}

/// The scheduler settings on a traced process's command line, as its engine plugin reads them.
pub(crate) fn scheduler_config_of(
    tgid: u32,
    engine: &str,
) -> std::collections::BTreeMap<String, String> {
    let args = crate::capture::process::procfs::cmdline_args(tgid).unwrap_or_default();
    scheduler_config(engine, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(cmdline: &str, maps: &[&str]) -> ProcessInfo {
        ProcessInfo {
            tgid: 1,
            cmdline: cmdline.into(),
            mapped_files: maps.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn identifies_each_engine() {
        let cases = [
            (
                process("/usr/bin/llama-server -m m.gguf", &[]),
                Some("llamacpp"),
            ),
            (
                process("python3 serve.py", &["/v/lib/xllamacpp/xllamacpp.abi3.so"]),
                Some("llamacpp"),
            ),
            (
                process("python3 app.py", &["/usr/lib/libllama.so"]),
                Some("llamacpp"),
            ),
            (
                process("/venv/bin/python3 /venv/bin/vllm serve m", &[]),
                Some("vllm"),
            ),
            (
                process("python -m vllm.entrypoints.openai.api_server", &[]),
                Some("vllm"),
            ),
            (process("VLLM::EngineCore", &[]), Some("vllm")),
            (
                process("python -m sglang.launch_server --model m", &[]),
                Some("sglang"),
            ),
            (process("trtllm-serve m", &[]), Some("tensorrt-llm")),
            (
                process("python3 toy_proxy_server.py --port 8000", &[]),
                Some("pd_proxy"),
            ),
            (
                process("python x.py", &["/x/libtensorrt_llm.so"]),
                Some("tensorrt-llm"),
            ),
            (
                process(
                    "/opt/tritonserver/bin/tritonserver --model-repository=/m",
                    &[],
                ),
                Some("triton"),
            ),
            (
                process("nginx: worker process", &["/usr/lib/libssl.so"]),
                None,
            ),
        ];
        for (p, expected) in cases {
            assert_eq!(identify(&p, &[]), expected, "{}", p.cmdline);
        }
    }

    #[test]
    fn user_patterns_claim_unknown_servers() {
        let p = process("/opt/my-llm-server --port 9000", &[]);
        assert_eq!(identify(&p, &["my-llm-server".into()]), Some("custom"));
        assert_eq!(identify(&p, &["other".into()]), None);
    }
}
