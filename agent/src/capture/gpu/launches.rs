//! Launch uprobes on the CUDA driver (`libcuda.so.1`) and runtime (`libcudart.so.*`): every
//! kernel and graph launch of a traced process at its host-side entry, and the names the driver
//! hands kernel handles out under. Needs no environment variable and no restart: the probes
//! attach to a running process, and to one that loads CUDA later (late attach).
use std::path::PathBuf;

use inferscope_common::GpuApi;
use tracing::{debug, info, warn};

use crate::capture::{
    SocketProbes,
    elf::{sched_hooks::HookOutcome, symbols::ElfSymbols},
    process::procfs,
};

/// Mapped files that may hold the hooked functions (by file-name substring).
pub(crate) const OBJECTS: &[&str] = &["libcuda.so", "libcudart.so"];

/// One hooked entry point: the kernel program and whether it is a return probe.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuHook {
    pub api: GpuApi,
    pub program: &'static str,
}

/// Every hook, in attach order; late attach names them by index. Naming calls have an entry
/// and a return probe. `_ptds` forms exist only for copies and memsets, not for launches, so
/// the per-thread default stream forms hooked are the `_ptsz` ones.
pub(crate) const HOOKS: &[GpuHook] = &[
    hook(GpuApi::CuModuleGetFunction, "cuda_name_call"),
    hook(GpuApi::CuModuleGetFunction, "cuda_name_return"),
    hook(GpuApi::CuLibraryGetKernel, "cuda_name_call"),
    hook(GpuApi::CuLibraryGetKernel, "cuda_name_return"),
    hook(GpuApi::CuKernelGetFunction, "cuda_name_call"),
    hook(GpuApi::CuKernelGetFunction, "cuda_name_return"),
    hook(GpuApi::CudaGetKernel, "cuda_name_call"),
    hook(GpuApi::CudaGetKernel, "cuda_name_return"),
    hook(GpuApi::CuLaunchKernel, "cuda_launch"),
    hook(GpuApi::CuLaunchKernelPtsz, "cuda_launch"),
    hook(GpuApi::CuLaunchCooperativeKernel, "cuda_launch"),
    hook(GpuApi::CuLaunchCooperativeKernelPtsz, "cuda_launch"),
    hook(GpuApi::CuLaunchKernelEx, "cuda_launch_ex"),
    hook(GpuApi::CuLaunchKernelExPtsz, "cuda_launch_ex"),
    hook(GpuApi::CuGraphLaunch, "cuda_graph_launch"),
    hook(GpuApi::CuGraphLaunchPtsz, "cuda_graph_launch"),
    hook(GpuApi::CudaGraphLaunch, "cuda_graph_launch"),
    hook(GpuApi::CudaGraphLaunchPtsz, "cuda_graph_launch"),
    hook(GpuApi::CudaLaunchKernel, "cudart_launch"),
    hook(GpuApi::CudaLaunchKernelPtsz, "cudart_launch"),
    hook(GpuApi::CudaLaunchKernelExC, "cuda_launch_ex"),
    hook(GpuApi::CudaLaunchKernelExCPtsz, "cuda_launch_ex"),
];

const fn hook(api: GpuApi, program: &'static str) -> GpuHook {
    GpuHook { api, program }
}

/// The launch probes' programs (not the naming ones): what the launch budget pauses.
pub(crate) const LAUNCH_PROGRAMS: &[&str] = &[
    "cuda_launch",
    "cuda_launch_ex",
    "cuda_graph_launch",
    "cudart_launch",
];

/// Indices (in [`HOOKS`]) of the launch probes.
pub(crate) fn launch_hooks() -> Vec<usize> {
    HOOKS
        .iter()
        .enumerate()
        .filter(|(_, h)| LAUNCH_PROGRAMS.contains(&h.program))
        .map(|(i, _)| i)
        .collect()
}

/// What one launch costs the launching thread (the uprobe trap), as measured on the project's
/// CI VM (BENCHMARKS.md §18; bare metal is faster): the launch budget's unit.
pub(crate) const TRAP_COST_NS: u64 = 5_000;
/// How long a process over its launch budget goes without launch probes before they are
/// tried again.
pub(crate) const BUDGET_PAUSE: std::time::Duration = std::time::Duration::from_secs(30);

/// The launch budget: a process whose launches cost its threads more than `percent` of a
/// second per second (at [`TRAP_COST_NS`] a launch) has its launch probes detached for
/// [`BUDGET_PAUSE`], then attached again, so an eager engine is slowed by at most about that
/// share (plus the second it took to notice).
#[derive(Default)]
pub(crate) struct LaunchBudget {
    percent: f64,
    /// Per process: launches since the last check, and until when its probes are paused.
    processes: rustc_hash::FxHashMap<u32, (u64, Option<std::time::Instant>)>,
}

impl LaunchBudget {
    pub(crate) fn new(percent: f64) -> Self {
        Self {
            percent,
            processes: rustc_hash::FxHashMap::default(),
        }
    }

    pub(crate) fn count(&mut self, tgid: u32, launches: u64) {
        if self.percent > 0.0 {
            self.processes.entry(tgid).or_default().0 += launches;
        }
    }

    /// Called about once per `elapsed`: (processes to pause now, processes to resume now).
    pub(crate) fn check(
        &mut self,
        elapsed: std::time::Duration,
        now: std::time::Instant,
    ) -> (Vec<u32>, Vec<u32>) {
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        let budget_ns = elapsed.as_nanos() as f64 * self.percent / 100.0;
        for (tgid, (launches, paused_until)) in self.processes.iter_mut() {
            match paused_until {
                Some(until) if now >= *until => {
                    *paused_until = None;
                    resume.push(*tgid);
                }
                Some(_) => {}
                None if (*launches * TRAP_COST_NS) as f64 > budget_ns => {
                    *paused_until = Some(now + BUDGET_PAUSE);
                    pause.push(*tgid);
                }
                None => {}
            }
            *launches = 0;
        }
        (pause, resume)
    }

    pub(crate) fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }
}

impl inferscope_model::PerProcess for LaunchBudget {
    fn process_gone(&mut self, tgid: u32) {
        self.forget(tgid);
    }
}

/// Whether a mapped file could hold a GPU hook.
pub(crate) fn could_hold(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    OBJECTS.iter().any(|o| name.contains(o))
}

/// Attaches the GPU hooks (all, or those in `only`) to `tgid`. Hooks whose function no mapped
/// CUDA library has are returned as not found: a process that has not loaded CUDA yet has
/// none, and a driver without `_ptsz` or cooperative forms lacks those for good (both are
/// tried again when the process maps a new CUDA library).
pub(crate) fn attach(probes: &mut SocketProbes, tgid: u32, only: Option<&[usize]>) -> HookOutcome {
    let mut outcome = HookOutcome::default();
    let objects: Vec<(String, PathBuf)> = procfs::mapped_files(tgid)
        .into_iter()
        .filter(|p| could_hold(p))
        .map(|p| {
            // Paths in /proc/PID/maps are in the process's mount namespace.
            let through_root = PathBuf::from(format!("/proc/{tgid}/root{p}"));
            (p, through_root)
        })
        .collect();
    let mut tables = Vec::new();
    for (path, readable) in &objects {
        match ElfSymbols::load(readable) {
            Ok(table) => tables.push((readable.clone(), table)),
            Err(e) => {
                warn!(pid = tgid, object = %path, "cannot read the CUDA library's symbols: {e}")
            }
        }
    }
    let mut attached = Vec::new();
    for (index, hook) in HOOKS.iter().enumerate() {
        if only.is_some_and(|only| !only.contains(&index)) {
            continue;
        }
        let symbol = hook.api.symbol();
        let found = tables.iter().find_map(|(path, table)| {
            let symbols = table.resolve(symbol);
            (symbols.len() == 1).then(|| (path, symbols[0].file_offset))
        });
        let Some((path, offset)) = found else {
            outcome.not_found.push(index);
            continue;
        };
        match probes.attach_uprobe(hook.program, path, offset, tgid, hook.api as u64) {
            Ok(()) => {
                outcome.live += 1;
                attached.push(symbol);
            }
            Err(e) => warn!(
                pid = tgid,
                symbol, "attaching the GPU launch probe failed: {e}; its launches are not seen"
            ),
        }
    }
    if !attached.is_empty() {
        attached.dedup();
        info!(pid = tgid, functions = ?attached, "GPU launch probes attached");
    } else if !objects.is_empty() {
        debug!(
            pid = tgid,
            "no GPU launch function found in the mapped CUDA libraries"
        );
    }
    outcome
}

/// Names runtime launches' host stubs (`cudaLaunchKernel`'s `func`) from the ELF symbols of the
/// file mapped at the stub's address: the stub carries the kernel's (mangled) name. Symbol
/// tables are read once per file and kept (a bounded number of files).
#[derive(Default)]
pub(crate) struct StubNames {
    tables: rustc_hash::FxHashMap<PathBuf, Option<ElfSymbols>>,
}

/// Files whose symbol tables are kept at once.
const STUB_TABLES: usize = 32;

impl StubNames {
    pub(crate) fn name(&mut self, tgid: u32, address: u64) -> Option<String> {
        let (path, file_offset) = procfs::mapping_of(tgid, address)?;
        let readable = PathBuf::from(format!("/proc/{tgid}/root{path}"));
        if !self.tables.contains_key(&readable) && self.tables.len() >= STUB_TABLES {
            self.tables.clear();
        }
        let table = self
            .tables
            .entry(readable.clone())
            .or_insert_with(|| ElfSymbols::load(&readable).ok());
        table.as_ref()?.function_at_file_offset(file_offset)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_process_over_its_launch_budget_is_paused_then_resumed() {
        let mut budget = LaunchBudget::new(2.0);
        let now = Instant::now();
        // 2 % of a second at 5 us a launch: 4,000 launches.
        budget.count(1, 3_999);
        budget.count(2, 4_001);
        assert_eq!(budget.check(Duration::from_secs(1), now), (vec![2], vec![]));
        // While paused nothing more is decided; after the pause, the probes come back.
        budget.count(1, 10);
        assert_eq!(
            budget.check(Duration::from_secs(1), now + Duration::from_secs(1)),
            (vec![], vec![])
        );
        assert_eq!(
            budget.check(Duration::from_secs(1), now + BUDGET_PAUSE),
            (vec![], vec![2])
        );
        // Off: nothing is counted or paused.
        let mut off = LaunchBudget::new(0.0);
        off.count(3, 1_000_000);
        assert_eq!(off.check(Duration::from_secs(1), now), (vec![], vec![]));
    }

    #[test]
    fn the_launch_hooks_are_the_launch_programs_only() {
        let hooks = launch_hooks();
        assert_eq!(hooks.len(), 14);
        assert!(
            hooks
                .iter()
                .all(|&i| !HOOKS[i].api.symbol().contains("Get"))
        );
    }
}
