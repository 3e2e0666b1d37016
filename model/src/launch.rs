//! GPU launches seen at the host (uprobes on the CUDA driver and runtime), one record per launch
//! and a summary per engine step. Their times are host enqueue times: when the engine thread
//! called the launch function, never when the GPU ran the kernel (only the CUPTI shim's kernel
//! records carry device start and end).
use serde::Serialize;

/// One kernel or graph launch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchRecord {
    pub pid: u32,
    pub tid: u32,
    /// `kernel` or `graph`.
    pub kind: &'static str,
    /// The CUDA function called (`cuLaunchKernel`, `cudaGraphLaunch_ptsz`, ...).
    pub api: &'static str,
    /// Where the record comes from: `uprobe` (the launch function's entry). Step summaries
    /// say `uprobe`, `shim` or `both` (see [`StepLaunches::source`]).
    pub source: &'static str,
    /// Host enqueue time (CLOCK_MONOTONIC ns): the call's entry, not GPU execution.
    pub enqueue_mono_ns: u64,
    /// The kernel's name as the driver was given it (mangled), the demangled host stub of a
    /// runtime launch, `unnamed#N` for a kernel loaded before the agent attached (N counts the
    /// process's distinct unnamed kernels), or `graph#N` for a graph (N: the order in which the
    /// process first launched it since the agent attached).
    pub name: String,
    /// Whether `name` is a real name (not `unnamed#N` / `graph#N`).
    pub named: bool,
    /// `CUfunction`, `CUkernel`, host stub or `CUgraphExec` handle.
    pub handle: u64,
    /// `CUstream` (0: the legacy default stream).
    pub stream: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grid: Option<[u32; 3]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<[u32; 3]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_mem_bytes: Option<u32>,
    /// Launches this record stands for: 1, or more above the launch-rate cap, where only one
    /// launch in 16 is recorded and each record counts those skipped before it.
    pub stands_for: u32,
    /// The process was over its launch-rate cap: this launch was sampled.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sampled: bool,
    /// Reading the launch's arguments failed: grid, block, shared memory or stream are 0.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub args_unread: bool,
}

impl LaunchRecord {
    pub fn is_graph(&self) -> bool {
        self.kind == "graph"
    }
}

/// How many launches of one kernel (or graph) a step made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NamedCount {
    pub name: String,
    pub launches: u64,
}

/// The GPU launches an engine step made, from the launch uprobes, the CUPTI shim, or both.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepLaunches {
    /// Where the figures come from: `uprobe` (host-side launches, no device times), `shim`
    /// (the shim's kernel records: launch times from its API callbacks), or `both` (the two
    /// merged launch by launch, each launch counted once; see [`LaunchSources`]).
    pub source: &'static str,
    /// Kernel launches (eager), sampled records counted for what they stand for.
    pub kernel_launches: u64,
    pub graph_launches: u64,
    /// Kernel launches whose kernel has a name (the rest are `unnamed#N`).
    pub named_launches: u64,
    /// Host time from the step's start to its first launch, and its share of the step: the
    /// CPU-side work (scheduling, batch preparation) before the GPU gets anything.
    pub before_first_launch_ms: f64,
    pub before_first_launch_share: f64,
    /// Largest and mean gap between consecutive launches of the step (host side).
    pub max_launch_gap_us: f64,
    pub mean_launch_gap_us: f64,
    /// Time from the last launch to the step's end (host side: synchronisation, sampling).
    pub after_last_launch_ms: f64,
    /// Kernels by launches, most first (at most [`STEP_KERNELS_KEPT`]).
    pub kernels: Vec<NamedCount>,
    /// Graphs in the order the step first launched them.
    pub graphs: Vec<NamedCount>,
    /// Distinct kernels beyond [`STEP_KERNELS_KEPT`], not listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub kernels_not_listed: u64,
    /// Some of the step's launches were sampled (the process was over its launch-rate cap).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sampled: bool,
    /// Where the shim's records were merged in: which launches each source saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sources: Option<LaunchSources>,
    /// The kernels each graph ran, from the shim's records of the graph's first launch in the
    /// step (at most [`STEP_KERNELS_KEPT`] graphs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub graph_kernels: Vec<GraphKernels>,
}

impl StepLaunches {
    /// Launches the step made, kernels and graphs.
    pub fn launches(&self) -> u64 {
        self.kernel_launches + self.graph_launches
    }
}

/// A step's launches by the source that saw them, where the shim's kernel records were merged
/// with the launch uprobes' launches (kernels and graphs; `both` + `uprobe_only` + `shim_only`
/// is the step's launch count).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LaunchSources {
    /// Seen by both (paired by the shim's launch thread and time, kind, grid, block and
    /// shared memory).
    pub both: u64,
    /// Seen by the launch uprobes only (the shim's record was dropped or not yet flushed).
    pub uprobe_only: u64,
    /// Seen by the shim only (the launch probes were paused, sampled, or not attached yet).
    pub shim_only: u64,
    /// Kernel launches the uprobes could not name (`unnamed#N`) that the shim named.
    pub named_by_shim: u64,
}

/// The kernels one CUDA graph ran, by name (from the shim's per-node kernel records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraphKernels {
    /// `graph#N` as the launch uprobes name it, or `cuda_graph_id:N` (the shim's graph id)
    /// for a graph the uprobes did not see launched.
    pub graph: String,
    /// Kernel nodes the launch ran.
    pub nodes: u64,
    /// By name, most run first (at most [`STEP_KERNELS_KEPT`]).
    pub kernels: Vec<NamedCount>,
}

/// Distinct kernels listed per step.
pub const STEP_KERNELS_KEPT: usize = 32;

fn is_zero(v: &u64) -> bool {
    *v == 0
}
