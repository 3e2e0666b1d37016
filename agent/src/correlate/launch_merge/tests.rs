//! The merge of the launch uprobes' launches with the shim's kernel records (launch_merge).
use inferscope_model::{LaunchRecord, LaunchSources, StepRecord};

use super::{PAIR_WITHIN_NS, merge_step};
use crate::capture::gpu::KernelRecord;

fn launch(tid: u32, ts: u64, name: &str, graph: bool) -> LaunchRecord {
    LaunchRecord {
        pid: 7,
        tid,
        kind: if graph { "graph" } else { "kernel" },
        api: if graph {
            "cuGraphLaunch"
        } else {
            "cuLaunchKernel"
        },
        source: "uprobe",
        enqueue_mono_ns: ts,
        name: name.to_owned(),
        named: !name.contains('#'),
        handle: 0x10,
        stream: 0x55,
        grid: (!graph).then_some([64, 1, 1]),
        block: (!graph).then_some([128, 1, 1]),
        shared_mem_bytes: (!graph).then_some(0),
        stands_for: 1,
        sampled: false,
        args_unread: false,
    }
}

fn kernel(tid: u32, launch: u64, corr: u32, name: &str, graph_id: u32, node: u64) -> KernelRecord {
    KernelRecord {
        pid: 7,
        name: name.to_owned(),
        device_id: 0,
        context_id: 1,
        stream_id: 3,
        correlation_id: corr,
        launch_tid: tid,
        launch_api: "cuLaunchKernel".into(),
        launch_mono_ns: launch,
        start_mono_ns: launch + 50_000,
        end_mono_ns: launch + 60_000,
        grid: if graph_id == 0 { [64, 1, 1] } else { [1, 1, 1] },
        block: if graph_id == 0 {
            [128, 1, 1]
        } else {
            [32, 1, 1]
        },
        static_shared_bytes: 0,
        dynamic_shared_bytes: 0,
        graph_id,
        graph_node_id: node,
        tensor_core: false,
    }
}

fn step(start: u64, end: u64) -> StepRecord {
    StepRecord {
        pid: 7,
        engine: "llama.cpp".into(),
        tid: 1,
        start_mono_ns: start,
        end_mono_ns: end,
        ..StepRecord::default()
    }
}

#[test]
fn each_launch_counts_once_and_says_who_saw_it() {
    // The uprobes saw four launches on thread 1; the shim saw three of them (its callback a
    // few microseconds after the uprobe's entry), and one the uprobes did not (probes paused).
    let launches = [
        launch(1, 1_000_000, "unnamed#1", false),
        launch(1, 1_100_000, "late_kernel", false),
        launch(1, 1_200_000, "graph#1", true),
        launch(1, 1_300_000, "late_kernel", false),
    ];
    let kernels = [
        kernel(1, 1_000_004, 10, "early_kernel", 0, 0),
        kernel(1, 1_100_004, 11, "late_kernel", 0, 0),
        // One graph launch: three nodes, one correlation id.
        kernel(1, 1_200_004, 12, "rms_norm", 5, 3),
        kernel(1, 1_200_004, 12, "gemm", 5, 1),
        kernel(1, 1_200_004, 12, "gemm", 5, 2),
        // Beyond the pairing window after the uprobes' last, unpaired, launch.
        kernel(1, 1_300_001 + PAIR_WITHIN_NS, 13, "shim_only_kernel", 0, 0),
    ];
    let refs: Vec<&KernelRecord> = kernels.iter().collect();
    let end = 2_000_000 + PAIR_WITHIN_NS;
    let m = merge_step(&step(900_000, end), &launches, &refs).unwrap();
    assert_eq!(m.source, "both");
    assert_eq!(
        m.sources,
        Some(LaunchSources {
            both: 3,
            uprobe_only: 1,
            shim_only: 1,
            named_by_shim: 1,
        })
    );
    assert_eq!((m.kernel_launches, m.graph_launches), (4, 1));
    // The kernel loaded before the attach is named by the shim; every kernel is named.
    assert_eq!(m.named_launches, 4);
    let names: Vec<(&str, u64)> = m
        .kernels
        .iter()
        .map(|c| (c.name.as_str(), c.launches))
        .collect();
    assert_eq!(
        names,
        [
            ("late_kernel", 2),
            ("early_kernel", 1),
            ("shim_only_kernel", 1)
        ]
    );
    assert_eq!(m.graphs[0].name, "graph#1");
    assert_eq!(m.graph_kernels.len(), 1);
    let g = &m.graph_kernels[0];
    assert_eq!((g.graph.as_str(), g.nodes), ("graph#1", 3));
    assert_eq!(g.kernels[0].name, "gemm");
    assert_eq!(g.kernels[0].launches, 2);
    // The host time before the first launch is the uprobes' (enqueue at the call's entry).
    assert!((m.before_first_launch_ms - 0.1).abs() < 1e-9);
}

#[test]
fn another_thread_another_shape_or_too_far_apart_do_not_pair() {
    let launches = [launch(1, 1_000_000, "k", false)];
    // Same time, other thread; same thread, other grid; same thread, beyond the window.
    let mut other_grid = kernel(1, 1_000_003, 2, "k", 0, 0);
    other_grid.grid = [1, 1, 1];
    let kernels = [
        kernel(2, 1_000_002, 1, "k", 0, 0),
        other_grid,
        kernel(1, 1_000_001 + PAIR_WITHIN_NS, 3, "k", 0, 0),
    ];
    let refs: Vec<&KernelRecord> = kernels.iter().collect();
    let m = merge_step(&step(0, 2 * PAIR_WITHIN_NS), &launches, &refs).unwrap();
    let s = m.sources.unwrap();
    assert_eq!((s.both, s.uprobe_only, s.shim_only), (0, 1, 3));
    assert_eq!(m.kernel_launches, 4);
}

#[test]
fn a_sampled_launch_does_not_count_what_the_shim_lists() {
    // Above the cap the uprobes kept one launch in four (it stands for four); the shim saw
    // all four.
    let mut sampled = launch(1, 1_003_000, "k", false);
    sampled.stands_for = 4;
    sampled.sampled = true;
    let kernels: Vec<KernelRecord> = (0..4)
        .map(|i| kernel(1, 1_000_004 + i * 1000, 20 + i as u32, "k", 0, 0))
        .collect();
    let refs: Vec<&KernelRecord> = kernels.iter().collect();
    let m = merge_step(&step(0, 2_000_000), &[sampled], &refs).unwrap();
    assert_eq!(m.kernel_launches, 4);
    let s = m.sources.unwrap();
    assert_eq!((s.both, s.uprobe_only, s.shim_only), (1, 0, 3));
}

#[test]
fn shim_alone_or_uprobes_alone() {
    let kernels = [kernel(1, 10, 1, "k", 0, 0), kernel(1, 20, 2, "g", 9, 1)];
    let refs: Vec<&KernelRecord> = kernels.iter().collect();
    let m = merge_step(&step(0, 100), &[], &refs).unwrap();
    assert_eq!(m.source, "shim");
    assert_eq!((m.kernel_launches, m.graph_launches), (1, 1));
    assert_eq!(m.graphs[0].name, "cuda_graph_id:9");
    assert_eq!(m.graph_kernels[0].graph, "cuda_graph_id:9");
    let launches = [launch(1, 10, "k", false)];
    let m = merge_step(&step(0, 100), &launches, &[]).unwrap();
    assert_eq!(m.source, "uprobe");
    assert!(m.sources.is_none());
    assert!(merge_step(&step(0, 100), &[], &[]).is_none());
}

#[test]
fn a_shim_clock_slightly_behind_still_pairs() {
    // Offset calibration: the shim's launch time lies 10 us before the uprobe's entry.
    let launches = [
        launch(1, 1_000_000, "k", false),
        launch(1, 1_500_000, "k", false),
    ];
    let kernels = [
        kernel(1, 990_000, 1, "k", 0, 0),
        kernel(1, 1_490_000, 2, "k", 0, 0),
    ];
    let refs: Vec<&KernelRecord> = kernels.iter().collect();
    let m = merge_step(&step(0, 2_000_000), &launches, &refs).unwrap();
    let s = m.sources.unwrap();
    assert_eq!((s.both, s.uprobe_only, s.shim_only), (2, 0, 0));
}

/// The daemon's cost of the merge per launch (BENCHMARKS.md): an eager decode step of 1,000
/// kernel launches and 10 graph launches of 50 nodes, both sources seeing every launch.
#[test]
#[ignore = "a benchmark: cargo test --release -p inferscope --lib -- --ignored merge_cost --nocapture"]
fn merge_cost_per_launch() {
    let mut launches = Vec::new();
    let mut kernels = Vec::new();
    for i in 0..1010u64 {
        let ts = 1_000_000 + i * 10_000;
        let graph = i % 101 == 100;
        launches.push(launch(
            1,
            ts,
            if graph { "graph#1" } else { "unnamed#1" },
            graph,
        ));
        if graph {
            for node in 0..50 {
                kernels.push(kernel(1, ts + 4, i as u32 + 1, "node", 7, node));
            }
        } else {
            kernels.push(kernel(1, ts + 4, i as u32 + 1, "k", 0, 0));
        }
    }
    let refs: Vec<&KernelRecord> = kernels.iter().collect();
    let s = step(0, 20_000_000);
    let rounds = 200;
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        let m = merge_step(&s, &launches, &refs).unwrap();
        assert_eq!(m.sources.unwrap().both, 1010);
    }
    let per = started.elapsed().as_nanos() as f64 / f64::from(rounds) / launches.len() as f64;
    println!(
        "merge: {per:.0} ns per launch ({} launches, {} shim records per step)",
        launches.len(),
        kernels.len()
    );
}

#[test]
fn a_thread_preempted_between_the_trap_and_the_callback_still_pairs_in_call_order() {
    // Two launches of one shape on one thread; the first call's thread lost its CPU for 3 ms
    // between the uprobe's trap and the shim's callback (seen on a loaded 2-core machine).
    let launches = [
        launch(1, 1_000_000, "unnamed#1", false),
        launch(1, 4_100_000, "unnamed#1", false),
    ];
    let kernels = [
        kernel(1, 4_000_000, 1, "k", 0, 0),
        kernel(1, 4_100_004, 2, "k", 0, 0),
    ];
    let refs: Vec<&KernelRecord> = kernels.iter().collect();
    let m = merge_step(&step(0, 5_000_000), &launches, &refs).unwrap();
    let s = m.sources.unwrap();
    assert_eq!((s.both, s.uprobe_only, s.shim_only), (2, 0, 0));
    assert_eq!(m.kernel_launches, 2);
}
