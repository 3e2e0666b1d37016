//! GPU launches from the launch uprobes: names each launch from the handle→name table the
//! naming probes teach (a kernel loaded before the agent attached stays `unnamed#N`, never a
//! guessed name), keeps recent launches per process, and sums them onto the engine steps that
//! made them (same process; same thread where the step was seen on the launching thread; inside
//! the step's time window).
use std::collections::VecDeque;

use inferscope_common::GpuApi;
use inferscope_model::{
    Counter, LaunchRecord, NamedCount, Stats, StepLaunches, StepRecord, clock::ns_to_ms,
    launch::STEP_KERNELS_KEPT,
};
use rustc_hash::FxHashMap;

use crate::capture::kernel::gpu_records::{LaunchEvent, NameEvent};

#[derive(Debug, Clone, Copy)]
pub(crate) struct LaunchLimits {
    /// Names kept per process (kernel handles a process looked up).
    pub names_per_process: usize,
    /// Launches kept per process for the step join.
    pub launches_per_process: usize,
    /// Launches older than this (behind the process's newest) are not kept for the join.
    pub keep_ns: u64,
}

impl Default for LaunchLimits {
    fn default() -> Self {
        Self {
            names_per_process: 1 << 16,
            launches_per_process: 1 << 16,
            keep_ns: 30_000_000_000,
        }
    }
}

#[derive(Default)]
struct Process {
    names: FxHashMap<u64, String>,
    /// Handles with no name, numbered in first-seen order.
    unnamed: FxHashMap<u64, u32>,
    graphs: FxHashMap<u64, u32>,
    recent: VecDeque<LaunchRecord>,
    /// Per thread: its last launch if it was a runtime one, whose own driver call may follow.
    runtime_call: FxHashMap<u32, LaunchEvent>,
}

/// Threads per process remembered with a pending runtime launch (cleared when full).
const RUNTIME_CALLS: usize = 4096;
/// How long after a runtime launch's entry its own driver call may come (the driver probe's
/// trap included).
const NESTED_WITHIN_NS: u64 = 1_000_000;

/// Whether driver launch `driver` is runtime launch `runtime`'s own call into the driver: the
/// thread's next launch, at once, with the same configuration (same graph) on the same stream.
fn nested(runtime: &LaunchEvent, driver: &LaunchEvent) -> bool {
    if driver.ts_ns.saturating_sub(runtime.ts_ns) > NESTED_WITHIN_NS
        || runtime.stream != driver.stream
        || runtime.api.is_graph() != driver.api.is_graph()
    {
        return false;
    }
    if runtime.api.is_graph() {
        runtime.handle == driver.handle
    } else {
        runtime.grid == driver.grid
            && runtime.block == driver.block
            && runtime.shared_mem == driver.shared_mem
    }
}

#[derive(Default)]
pub(crate) struct Launches {
    limits: LaunchLimits,
    processes: FxHashMap<u32, Process>,
    /// Worker processes of an engine (vLLM's EngineCore) → the engine process whose steps
    /// their launches belong to.
    owners: FxHashMap<u32, u32>,
    stats: Stats,
}

impl Launches {
    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The driver handed out a kernel handle under a name (or said a function handle is a
    /// named kernel, or the runtime a kernel handle is a host stub's: `stub_name` names the
    /// stub from the process's symbols).
    pub(crate) fn on_name(
        &mut self,
        event: &NameEvent<'_>,
        stub_name: impl FnOnce(u32, u64) -> Option<String>,
    ) {
        let limit = self.limits.names_per_process;
        let process = self.processes.entry(event.tgid).or_default();
        let name = if event.api == GpuApi::CudaGetKernel {
            match process.names.get(&event.alias) {
                Some(name) => name.clone(),
                None => match stub_name(event.tgid, event.alias) {
                    Some(name) => name,
                    // A stub with no symbol: its launches stay unnamed#N.
                    None => return,
                },
            }
        } else if event.alias != 0 {
            match process.names.get(&event.alias) {
                Some(name) => name.clone(),
                // The kernel was named before the agent attached.
                None => return,
            }
        } else {
            String::from_utf8_lossy(event.name).into_owned()
        };
        if name.is_empty() {
            return;
        }
        if process.names.len() >= limit && !process.names.contains_key(&event.handle) {
            // Bounded: a process that keeps loading modules sheds old names (counted).
            if let Some(old) = process.names.keys().next().copied() {
                process.names.remove(&old);
                self.stats.bump(Counter::GpuLaunchNamesEvicted);
            }
        }
        // A handle reused for another kernel (module unloaded, another loaded) takes the new name.
        process.names.insert(event.handle, name);
    }

    /// A launch: named, kept for the step join, and returned for whoever writes launches.
    /// `stub_name` names a runtime launch's host stub from the process's symbols (called once
    /// per unknown stub). None for a runtime launch's own call into the driver (probed at both
    /// levels, it is one launch): counted, and its function handle learns the runtime's name.
    pub(crate) fn on_launch(
        &mut self,
        event: &LaunchEvent,
        stub_name: impl FnOnce(u32, u64) -> Option<String>,
    ) -> Option<LaunchRecord> {
        let limits = self.limits;
        let process = self.processes.entry(event.tgid).or_default();
        if !event.api.is_runtime()
            && let Some(runtime) = process.runtime_call.remove(&event.tid)
            && nested(&runtime, event)
        {
            if !event.api.is_graph()
                && let Some(name) = process.names.get(&runtime.handle).cloned()
                && process.names.len() < limits.names_per_process
            {
                process.names.insert(event.handle, name);
            }
            self.stats.bump(Counter::GpuLaunchesNested);
            return None;
        }
        let graph = event.api.is_graph();
        let (name, named) = if graph {
            let next = process.graphs.len() as u32 + 1;
            let n = *process.graphs.entry(event.handle).or_insert(next);
            (format!("graph#{n}"), false)
        } else if let Some(name) = process.names.get(&event.handle) {
            (name.clone(), true)
        } else if let Some(name) = event
            .api
            .is_runtime()
            .then(|| stub_name(event.tgid, event.handle))
            .flatten()
        {
            if process.names.len() < limits.names_per_process {
                process.names.insert(event.handle, name.clone());
            }
            (name, true)
        } else {
            let next = process.unnamed.len() as u32 + 1;
            let n = *process.unnamed.entry(event.handle).or_insert_with(|| {
                // A kernel whose handle was looked up before the agent attached.
                self.stats.bump(Counter::GpuKernelsUnnamed);
                next
            });
            (format!("unnamed#{n}"), false)
        };
        let record = LaunchRecord {
            pid: event.tgid,
            tid: event.tid,
            kind: if graph { "graph" } else { "kernel" },
            api: event.api.symbol(),
            source: "uprobe",
            enqueue_mono_ns: event.ts_ns,
            name,
            named,
            handle: event.handle,
            stream: event.stream,
            grid: (!graph).then_some(event.grid),
            block: (!graph).then_some(event.block),
            shared_mem_bytes: (!graph).then_some(event.shared_mem),
            stands_for: event.skipped.saturating_add(1),
            sampled: event.sampled,
            args_unread: event.read_failed,
        };
        self.stats.bump(Counter::GpuLaunchRecords);
        if process.recent.len() >= limits.launches_per_process {
            process.recent.pop_front();
            self.stats.bump(Counter::GpuLaunchesEvicted);
        }
        while process
            .recent
            .front()
            .is_some_and(|l| event.ts_ns.saturating_sub(l.enqueue_mono_ns) > limits.keep_ns)
        {
            process.recent.pop_front();
        }
        process.recent.push_back(record.clone());
        if event.api.is_runtime() {
            if process.runtime_call.len() >= RUNTIME_CALLS {
                process.runtime_call.clear();
            }
            process.runtime_call.insert(event.tid, *event);
        }
        Some(record)
    }

    /// Launches of `worker` belong to the steps of engine process `engine` (a step seen in the
    /// engine's process whose kernels run in a worker it started: vLLM's EngineCore).
    pub(crate) fn set_owner(&mut self, worker: u32, engine: u32) {
        self.owners.insert(worker, engine);
    }

    /// Sums the launches `step` made onto it, inside the step's window: those of the launching
    /// process, on the step's own thread where the step was seen on the launching thread
    /// (llama.cpp's llama_decode launches on its thread), and those of the engine's workers.
    pub(crate) fn annotate(&self, step: &mut StepRecord) {
        let pid = step.gpu_pid();
        let from = step.kernels_from();
        let to = step.end_mono_ns;
        let in_window = |process: &'_ Process| -> Vec<LaunchRecord> {
            let start = process.recent.partition_point(|l| l.enqueue_mono_ns < from);
            process
                .recent
                .iter()
                .skip(start)
                .take_while(|l| l.enqueue_mono_ns <= to)
                .cloned()
                .collect()
        };
        let mut mine: Vec<LaunchRecord> = Vec::new();
        if let Some(process) = self.processes.get(&pid) {
            let same_thread = step.kernel_pid.is_none() && step.tid != 0;
            mine.extend(
                in_window(process)
                    .into_iter()
                    .filter(|l| !same_thread || l.tid == step.tid),
            );
        }
        if step.kernel_pid.is_none() {
            for (worker, _) in self.owners.iter().filter(|(_, owner)| **owner == pid) {
                if let Some(process) = self.processes.get(worker) {
                    mine.extend(in_window(process));
                }
            }
        }
        if mine.is_empty() {
            return;
        }
        mine.sort_by_key(|l| l.enqueue_mono_ns);
        let items: Vec<Item<'_>> = mine.iter().map(Item::of).collect();
        step.gpu_launches = Some(summarise(&items, from, to, step.start_mono_ns, "uprobe"));
        // Kept for the merge with the shim's records of the step (the timeline drops it at
        // once where the process has no shim).
        step.launch_list = Some(mine.into());
    }

    pub(crate) fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
        self.owners.remove(&tgid);
    }
}

/// One launch as a step summary counts it, whichever source saw it.
#[derive(Debug, Clone)]
pub(crate) struct Item<'a> {
    pub enqueue_ns: u64,
    pub graph: bool,
    pub name: &'a str,
    pub named: bool,
    /// Launches it stands for (above the launch-rate cap, a sampled record counts those
    /// skipped before it).
    pub stands_for: u64,
    pub sampled: bool,
}

impl<'a> Item<'a> {
    pub(crate) fn of(l: &'a LaunchRecord) -> Self {
        Self {
            enqueue_ns: l.enqueue_mono_ns,
            graph: l.is_graph(),
            name: &l.name,
            named: l.named,
            stands_for: u64::from(l.stands_for),
            sampled: l.sampled,
        }
    }
}

/// The step summary of `launches` (sorted by enqueue time) in the window `from..=to` of a step
/// that started at `start`; its source is `source`.
pub(crate) fn summarise(
    launches: &[Item<'_>],
    from: u64,
    to: u64,
    start: u64,
    source: &'static str,
) -> StepLaunches {
    let mut kernels: Vec<NamedCount> = Vec::new();
    let mut graphs: Vec<NamedCount> = Vec::new();
    let (mut kernel_launches, mut graph_launches, mut named) = (0u64, 0u64, 0u64);
    let mut sampled = false;
    for l in launches {
        let n = l.stands_for;
        sampled |= l.sampled;
        let list = if l.graph {
            graph_launches += n;
            &mut graphs
        } else {
            kernel_launches += n;
            if l.named {
                named += n;
            }
            &mut kernels
        };
        count(list, l.name, n);
    }
    kernels.sort_by(|a, b| b.launches.cmp(&a.launches).then(a.name.cmp(&b.name)));
    let kernels_not_listed = kernels.len().saturating_sub(STEP_KERNELS_KEPT) as u64;
    kernels.truncate(STEP_KERNELS_KEPT);
    graphs.truncate(STEP_KERNELS_KEPT);
    let first = launches.first().map_or(from, |l| l.enqueue_ns);
    let last = launches.last().map_or(to, |l| l.enqueue_ns);
    let span = to.saturating_sub(start.min(from)).max(1);
    let before = first.saturating_sub(start.min(from));
    let gaps: Vec<u64> = launches
        .windows(2)
        .map(|w| w[1].enqueue_ns.saturating_sub(w[0].enqueue_ns))
        .collect();
    let max_gap = gaps.iter().copied().max().unwrap_or(0);
    let mean_gap = if gaps.is_empty() {
        0.0
    } else {
        gaps.iter().sum::<u64>() as f64 / gaps.len() as f64
    };
    StepLaunches {
        source,
        kernel_launches,
        graph_launches,
        named_launches: named,
        before_first_launch_ms: ns_to_ms(before),
        before_first_launch_share: before as f64 / span as f64,
        max_launch_gap_us: max_gap as f64 / 1e3,
        mean_launch_gap_us: mean_gap / 1e3,
        after_last_launch_ms: ns_to_ms(to.saturating_sub(last)),
        kernels,
        graphs,
        kernels_not_listed,
        sampled,
        sources: None,
        graph_kernels: Vec::new(),
    }
}

/// Adds `n` launches of `name` to `list` (a bounded number of names is listed by the caller).
pub(crate) fn count(list: &mut Vec<NamedCount>, name: &str, n: u64) {
    match list.iter_mut().find(|c| c.name == name) {
        Some(c) => c.launches += n,
        None => list.push(NamedCount {
            name: name.to_owned(),
            launches: n,
        }),
    }
}

impl inferscope_model::PerProcess for Launches {
    fn process_gone(&mut self, tgid: u32) {
        self.forget(tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Launches {
        fn on_name_plain(&mut self, event: &NameEvent<'_>) {
            self.on_name(event, |_, _| None);
        }
    }

    fn launch(api: GpuApi, tid: u32, ts: u64, handle: u64) -> LaunchEvent {
        LaunchEvent {
            api,
            tgid: 7,
            tid,
            ts_ns: ts,
            handle,
            stream: 1,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem: 0,
            skipped: 0,
            sampled: false,
            read_failed: false,
        }
    }

    fn name(handle: u64, alias: u64, text: &'static str) -> NameEvent<'static> {
        NameEvent {
            api: GpuApi::CuModuleGetFunction,
            tgid: 7,
            handle,
            alias,
            name: text.as_bytes(),
            truncated: false,
        }
    }

    fn step(tid: u32, start: u64, end: u64) -> StepRecord {
        StepRecord {
            pid: 7,
            engine: "llama.cpp".into(),
            tid,
            start_mono_ns: start,
            end_mono_ns: end,
            duration_ms: ns_to_ms(end - start),
            sequences: 1,
            prefilling: 0,
            ..StepRecord::default()
        }
    }

    #[test]
    fn kernels_loaded_before_attach_stay_unnamed_and_learnt_ones_are_named() {
        let mut l = Launches::default();
        let none = |_, _| None;
        let before = l
            .on_launch(&launch(GpuApi::CuLaunchKernel, 1, 10, 0xa), none)
            .unwrap();
        assert_eq!((before.name.as_str(), before.named), ("unnamed#1", false));
        l.on_name_plain(&name(0xb, 0, "_Z4gemmv"));
        let after = l
            .on_launch(&launch(GpuApi::CuLaunchKernel, 1, 11, 0xb), none)
            .unwrap();
        assert_eq!((after.name.as_str(), after.named), ("_Z4gemmv", true));
        // The unnamed handle keeps its number; a second unknown one gets the next.
        assert_eq!(
            l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 12, 0xa), none)
                .unwrap()
                .name,
            "unnamed#1"
        );
        assert_eq!(
            l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 13, 0xc), none)
                .unwrap()
                .name,
            "unnamed#2"
        );
        // cuKernelGetFunction: a function handle is a kernel named through the library.
        l.on_name_plain(&name(0xd, 0, "lib_kernel"));
        l.on_name_plain(&name(0xe, 0xd, ""));
        assert_eq!(
            l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 14, 0xe), none)
                .unwrap()
                .name,
            "lib_kernel"
        );
        // An alias of a kernel the agent never saw named teaches nothing.
        l.on_name_plain(&name(0xf, 0x99, ""));
        assert_eq!(
            l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 15, 0xf), none)
                .unwrap()
                .name,
            "unnamed#3"
        );
    }

    #[test]
    fn a_cuda13_kernel_handle_is_named_from_the_stub_it_was_got_for() {
        let mut l = Launches::default();
        let none = |_, _| None;
        // cudaGetKernel(&handle 0x70, stub 0x40): named from the stub's symbol.
        let got = NameEvent {
            api: GpuApi::CudaGetKernel,
            tgid: 7,
            handle: 0x70,
            alias: 0x40,
            name: b"",
            truncated: false,
        };
        l.on_name(&got, |tgid, stub| {
            assert_eq!((tgid, stub), (7, 0x40));
            Some("cuda13_kernel(float*)".into())
        });
        let r = l
            .on_launch(&launch(GpuApi::CudaLaunchKernelExC, 1, 10, 0x70), none)
            .unwrap();
        assert_eq!((r.name.as_str(), r.named), ("cuda13_kernel(float*)", true));
        // A stub with no symbol teaches nothing: its launches stay unnamed, and are counted.
        let unknown = NameEvent {
            handle: 0x71,
            alias: 0x41,
            ..got
        };
        l.on_name(&unknown, |_, _| None);
        // (Another thread: on this one it would be the runtime launch's own driver call.)
        let r = l
            .on_launch(&launch(GpuApi::CuLaunchKernel, 2, 11, 0x71), none)
            .unwrap();
        assert_eq!(r.name, "unnamed#1");
        assert_eq!(l.stats().get(Counter::GpuKernelsUnnamed), 1);
    }

    #[test]
    fn runtime_stubs_are_named_from_symbols_once() {
        let mut l = Launches::default();
        let mut asked = 0;
        let r = l
            .on_launch(&launch(GpuApi::CudaLaunchKernel, 1, 10, 0x40), |_, _| {
                asked += 1;
                Some("flash_fwd_kernel(float*)".into())
            })
            .unwrap();
        assert_eq!(r.name, "flash_fwd_kernel(float*)");
        let r = l
            .on_launch(&launch(GpuApi::CudaLaunchKernel, 1, 11, 0x40), |_, _| {
                asked += 1;
                None
            })
            .unwrap();
        assert!(r.named);
        assert_eq!(asked, 1);
    }

    #[test]
    fn steps_get_their_own_thread_and_window_and_graphs_by_first_launch() {
        let mut l = Launches::default();
        let none = |_, _| None;
        l.on_name_plain(&name(0xb, 0, "k"));
        // Another thread's launch inside the window is not this step's.
        l.on_launch(&launch(GpuApi::CuLaunchKernel, 2, 150, 0xb), none)
            .unwrap();
        l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 50, 0xb), none)
            .unwrap();
        l.on_launch(&launch(GpuApi::CuGraphLaunch, 1, 99, 0x100), none)
            .unwrap();
        l.on_launch(&launch(GpuApi::CuGraphLaunch, 1, 120, 0x200), none)
            .unwrap();
        l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 130, 0xb), none)
            .unwrap();
        l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 160, 0xa), none)
            .unwrap();
        let mut event = launch(GpuApi::CuLaunchKernel, 1, 190, 0xb);
        event.skipped = 15;
        event.sampled = true;
        l.on_launch(&event, none).unwrap();
        l.on_launch(&launch(GpuApi::CuLaunchKernel, 1, 250, 0xb), none)
            .unwrap();
        let mut s = step(1, 100, 200);
        l.annotate(&mut s);
        let g = s.gpu_launches.expect("the step made launches");
        assert_eq!(g.kernel_launches, 1 + 1 + 16);
        assert_eq!(g.graph_launches, 1);
        assert_eq!(g.named_launches, 17);
        assert!(g.sampled);
        assert_eq!(g.graphs[0].name, "graph#2");
        assert_eq!(g.kernels[0].name, "k");
        assert_eq!(g.kernels[0].launches, 17);
        assert!((g.before_first_launch_share - 0.2).abs() < 1e-9);
        assert!((g.max_launch_gap_us - 0.03).abs() < 1e-9);
        assert!((g.after_last_launch_ms - 10e-6).abs() < 1e-12);
        // A step with no launch of its thread gets no summary.
        let mut idle = step(3, 100, 200);
        l.annotate(&mut idle);
        assert!(idle.gpu_launches.is_none());
    }

    #[test]
    fn a_runtime_launch_s_own_driver_call_is_not_a_second_launch() {
        let mut l = Launches::default();
        let stub = |_, _| Some("flash_fwd_kernel(float*)".to_owned());
        let none = |_, _| None;
        let mut rt = launch(GpuApi::CudaLaunchKernel, 1, 100, 0x40);
        rt.grid = [64, 2, 1];
        assert!(l.on_launch(&rt, stub).is_some());
        // The runtime calls the driver with the same configuration right after: not counted,
        // and its function handle learns the runtime's name.
        let mut nested = launch(GpuApi::CuLaunchKernel, 1, 105, 0x900);
        nested.grid = [64, 2, 1];
        assert!(l.on_launch(&nested, none).is_none());
        assert_eq!(l.stats().get(Counter::GpuLaunchesNested), 1);
        // A later driver launch of that function is a launch of its own, named.
        let mut own = launch(GpuApi::CuLaunchKernel, 1, 300, 0x900);
        own.grid = [64, 2, 1];
        assert_eq!(
            l.on_launch(&own, none).unwrap().name,
            "flash_fwd_kernel(float*)"
        );
        // Another thread's, or another configuration's, driver launch is not nested.
        assert!(l.on_launch(&rt, stub).is_some());
        let mut other = launch(GpuApi::CuLaunchKernel, 1, 310, 0x901);
        other.grid = [1, 1, 1];
        assert!(l.on_launch(&other, none).is_some());
        // Graphs: cudaGraphLaunch then cuGraphLaunch of the same graph on the same stream.
        assert!(
            l.on_launch(&launch(GpuApi::CudaGraphLaunch, 2, 400, 0x77), none)
                .is_some()
        );
        assert!(
            l.on_launch(&launch(GpuApi::CuGraphLaunch, 2, 404, 0x77), none)
                .is_none()
        );
        assert_eq!(l.stats().get(Counter::GpuLaunchesNested), 2);
    }

    #[test]
    fn a_worker_process_launches_for_its_engine_s_steps() {
        let mut l = Launches::default();
        let none = |_, _| None;
        let mut worker = launch(GpuApi::CuGraphLaunch, 90, 150, 0x100);
        worker.tgid = 9;
        l.on_launch(&worker, none).unwrap();
        let mut s = step(1, 100, 200);
        l.annotate(&mut s);
        assert!(s.gpu_launches.is_none(), "not this engine's worker yet");
        l.set_owner(9, 7);
        l.annotate(&mut s);
        assert_eq!(s.gpu_launches.map(|g| g.graph_launches), Some(1));
        l.forget(9);
        let mut again = step(1, 100, 200);
        l.annotate(&mut again);
        assert!(again.gpu_launches.is_none());
    }
}
