//! Where the CUPTI shim runs in a process whose CUDA library is also probed, a step's launches
//! are seen twice: by the launch uprobes (host enqueue at the call's entry, the step join) and
//! by the shim (device start and end, names of every kernel, a graph's nodes). This pairs the
//! two launch by launch so that each launch is counted once, and says which source saw what.
//!
//! The shim's kernel records of one launch share its CUPTI correlation id (a graph launch
//! yields one record per node; a runtime launch and its own driver call one id): grouped by it,
//! they are one launch, stamped with the launching thread and the time of the launch API's
//! entry callback. A uprobe launch and a shim launch pair when they are on the same thread,
//! the uprobe's entry at most [`PAIR_WITHIN_NS`] before the shim's callback (or
//! [`CLOCK_SKEW_NS`] after it, for a shim whose clock offset is calibrated rather than
//! CLOCK_MONOTONIC itself), of the same kind, and — for kernels whose arguments the uprobe
//! read — with the same grid, block and dynamic shared memory. Streams are not compared: the
//! uprobe sees the `CUstream` handle, CUPTI a stream number.
use inferscope_model::{
    GraphKernels, LaunchRecord, LaunchSources, NamedCount, StepLaunches, StepRecord,
    launch::STEP_KERNELS_KEPT,
};
use rustc_hash::FxHashMap;

use super::launches::{Item, count, summarise};
use crate::capture::gpu::KernelRecord;

/// Longest time from a launch function's entry (the uprobe) to the shim's API callback for the
/// same call: the callback runs inside the call, microseconds after the trap, unless the thread
/// is preempted in between — on a loaded 2-core machine that is milliseconds (a pairing miss at
/// 100 µs was seen in CI). Pairing follows each thread's call order (a shim launch takes the
/// thread's last unpaired uprobe launch at or before it), so the window only matters where both
/// sources missed a different call of the same shape on one thread within it.
pub(crate) const PAIR_WITHIN_NS: u64 = 10_000_000;
/// How far the shim's launch time may lie before the uprobe's for the same call (a shim that
/// calibrates CUPTI's clock against CLOCK_MONOTONIC carries a small offset error).
pub(crate) const CLOCK_SKEW_NS: u64 = 50_000;

/// One launch as the shim saw it: the kernel records of one correlation id.
#[derive(Debug)]
struct ShimLaunch<'a> {
    tid: u32,
    mono_ns: u64,
    graph_id: u32,
    /// Records in node order (graph) or the one kernel.
    kernels: Vec<&'a KernelRecord>,
}

impl ShimLaunch<'_> {
    fn is_graph(&self) -> bool {
        self.graph_id != 0
    }

    fn first(&self) -> Option<&KernelRecord> {
        self.kernels.first().copied()
    }
}

/// The shim's records grouped into launches, in launch order. Records without a correlation id
/// (0), or whose launch the shim could not place (no thread), are a launch each.
fn group<'a>(kernels: &[&'a KernelRecord]) -> Vec<ShimLaunch<'a>> {
    let mut launches: Vec<ShimLaunch<'a>> = Vec::new();
    let mut by_id: FxHashMap<u32, usize> = FxHashMap::default();
    for k in kernels {
        if k.correlation_id != 0
            && let Some(&at) = by_id.get(&k.correlation_id)
        {
            launches[at].kernels.push(k);
            continue;
        }
        if k.correlation_id != 0 {
            by_id.insert(k.correlation_id, launches.len());
        }
        launches.push(ShimLaunch {
            tid: k.launch_tid,
            mono_ns: k.launch_mono_ns,
            graph_id: k.graph_id,
            kernels: vec![k],
        });
    }
    for l in &mut launches {
        l.kernels.sort_by_key(|k| k.graph_node_id);
    }
    launches.sort_by_key(|l| l.mono_ns);
    launches
}

/// Whether uprobe launch `u` and shim launch `s` can be the same call (time aside).
fn same_call(u: &LaunchRecord, s: &ShimLaunch<'_>) -> bool {
    if u.is_graph() != s.is_graph() {
        return false;
    }
    if u.is_graph() || u.args_unread {
        return true;
    }
    let Some(k) = s.first() else {
        return false;
    };
    u.grid == Some(k.grid)
        && u.block == Some(k.block)
        && u.shared_mem_bytes == Some(k.dynamic_shared_bytes)
}

/// For each shim launch, the index (in `launches`) of the uprobe launch it pairs with. Each
/// thread's launches are one sequence of calls that both sources see in call order (each call's
/// shim callback before the next call's entry), so the two sequences are aligned by walking
/// them together: a shim launch after the thread's next uprobe entry is not the current
/// call's (which the shim missed); one more than [`CLOCK_SKEW_NS`] before the current entry is
/// a call the uprobes missed; otherwise the two are one call when [`same_call`] and at most
/// [`PAIR_WITHIN_NS`] apart. Where the shim's clock lies a little behind, of two shim launches
/// that could both be the current call the later (at or after its entry, as with an exact
/// clock) is taken.
fn pair(launches: &[LaunchRecord], shim: &[ShimLaunch<'_>]) -> Vec<Option<usize>> {
    let mut pairs: Vec<Option<usize>> = vec![None; shim.len()];
    // Per thread, its uprobe and shim launches, each in time order (call order).
    let mut threads: FxHashMap<u32, (Vec<usize>, Vec<usize>)> = FxHashMap::default();
    for (i, l) in launches.iter().enumerate() {
        threads.entry(l.tid).or_default().0.push(i);
    }
    for (j, s) in shim.iter().enumerate() {
        if s.tid != 0
            && let Some((_, list)) = threads.get_mut(&s.tid)
        {
            list.push(j);
        }
    }
    for (ups, shims) in threads.values_mut() {
        ups.sort_by_key(|&i| launches[i].enqueue_mono_ns);
        shims.sort_by_key(|&j| shim[j].mono_ns);
        let (mut a, mut b) = (0, 0);
        while let (Some(&i), Some(&j)) = (ups.get(a), shims.get(b)) {
            let (u, s) = (&launches[i], &shim[j]);
            let next_entry = ups
                .get(a + 1)
                .map_or(u64::MAX, |&n| launches[n].enqueue_mono_ns);
            if s.mono_ns > next_entry {
                // The shim's next launch came after the next call began: it missed this one.
                a += 1;
                continue;
            }
            if s.mono_ns.saturating_add(CLOCK_SKEW_NS) < u.enqueue_mono_ns {
                b += 1;
                continue;
            }
            let later_fits = s.mono_ns < u.enqueue_mono_ns
                && shims.get(b + 1).is_some_and(|&k| {
                    let t = &shim[k];
                    t.mono_ns.saturating_add(CLOCK_SKEW_NS) < next_entry
                        && t.mono_ns.saturating_sub(u.enqueue_mono_ns) <= PAIR_WITHIN_NS
                        && same_call(u, t)
                });
            if later_fits {
                b += 1;
                continue;
            }
            if same_call(u, s) && s.mono_ns.saturating_sub(u.enqueue_mono_ns) <= PAIR_WITHIN_NS {
                pairs[j] = Some(i);
                a += 1;
                b += 1;
            } else if s.mono_ns >= u.enqueue_mono_ns {
                // Not this call, and after its entry: the shim missed this call.
                a += 1;
            } else {
                b += 1;
            }
        }
    }
    pairs
}

/// The step's launch summary with the shim's `kernels` (those launched in the step's window,
/// by launch time) merged into the uprobes' `launches` (the step's own, by enqueue time):
/// `source` says `both`, `uprobe` (no shim record in the step) or `shim` (no uprobe launch).
/// The skipped launches a sampled uprobe record stands for are not added where the shim saw
/// launches the uprobes did not: those are the ones it lists.
pub(crate) fn merge_step(
    step: &StepRecord,
    launches: &[LaunchRecord],
    kernels: &[&KernelRecord],
) -> Option<StepLaunches> {
    let (from, to, start) = (step.kernels_from(), step.end_mono_ns, step.start_mono_ns);
    if kernels.is_empty() {
        if launches.is_empty() {
            return None;
        }
        let items: Vec<Item<'_>> = launches.iter().map(Item::of).collect();
        return Some(summarise(&items, from, to, start, "uprobe"));
    }
    let shim = group(kernels);
    let pairs = pair(launches, &shim);
    // A graph only the shim saw launched is named by the shim's graph id (the uprobes'
    // graph#N needs the graph's handle).
    let shim_graph_names: Vec<String> = shim
        .iter()
        .map(|s| format!("cuda_graph_id:{}", s.graph_id))
        .collect();
    let mut paired_uprobe = vec![false; launches.len()];
    let mut sources = LaunchSources::default();
    let mut items: Vec<Item<'_>> = Vec::with_capacity(launches.len() + shim.len());
    // Per shim launch of a graph, the graph's name.
    let mut graph_of_shim: Vec<Option<&str>> = Vec::with_capacity(shim.len());
    for ((s, paired), graph_name) in shim.iter().zip(&pairs).zip(&shim_graph_names) {
        let Some(first) = s.first() else {
            graph_of_shim.push(None);
            continue;
        };
        let Some(i) = *paired else {
            sources.shim_only += 1;
            graph_of_shim.push(s.is_graph().then_some(graph_name.as_str()));
            items.push(Item {
                enqueue_ns: s.mono_ns,
                graph: s.is_graph(),
                name: if s.is_graph() {
                    graph_name
                } else {
                    &first.name
                },
                named: !s.is_graph(),
                stands_for: 1,
                sampled: false,
            });
            continue;
        };
        let u = &launches[i];
        paired_uprobe[i] = true;
        sources.both += 1;
        graph_of_shim.push(u.is_graph().then_some(u.name.as_str()));
        // The shim names every kernel (also those loaded before the agent attached); a graph
        // keeps the uprobes' name, stable across steps.
        let (name, named) = if u.is_graph() {
            (u.name.as_str(), false)
        } else {
            if !u.named {
                sources.named_by_shim += 1;
            }
            (first.name.as_str(), true)
        };
        items.push(Item {
            enqueue_ns: u.enqueue_mono_ns,
            graph: u.is_graph(),
            name,
            named,
            stands_for: 1,
            sampled: u.sampled,
        });
    }
    for (u, paired) in launches.iter().zip(&paired_uprobe) {
        if *paired {
            continue;
        }
        sources.uprobe_only += 1;
        let mut item = Item::of(u);
        if sources.shim_only > 0 {
            item.stands_for = 1;
        }
        items.push(item);
    }
    items.sort_by_key(|i| i.enqueue_ns);
    let source = if launches.is_empty() { "shim" } else { "both" };
    let mut summary = summarise(&items, from, to, start, source);
    summary.graph_kernels = graph_kernels(&shim, &graph_of_shim);
    summary.sources = Some(sources);
    Some(summary)
}

/// Per graph, the kernels its first launch in the step ran (graphs in first-launch order).
fn graph_kernels(shim: &[ShimLaunch<'_>], graph_of_shim: &[Option<&str>]) -> Vec<GraphKernels> {
    let mut out: Vec<GraphKernels> = Vec::new();
    for (s, graph) in shim.iter().zip(graph_of_shim) {
        let Some(graph) = *graph else { continue };
        if out.iter().any(|g| g.graph == graph) {
            continue;
        }
        if out.len() >= STEP_KERNELS_KEPT {
            break;
        }
        let mut kernels: Vec<NamedCount> = Vec::new();
        for k in &s.kernels {
            count(&mut kernels, &k.name, 1);
        }
        kernels.sort_by(|a, b| b.launches.cmp(&a.launches).then(a.name.cmp(&b.name)));
        kernels.truncate(STEP_KERNELS_KEPT);
        out.push(GraphKernels {
            graph: graph.to_owned(),
            nodes: s.kernels.len() as u64,
            kernels,
        });
    }
    out
}

#[cfg(test)]
mod tests;
