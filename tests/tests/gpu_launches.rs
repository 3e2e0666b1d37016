//! GPU launch uprobes end to end, without a GPU and without the shim: the mock engine (real
//! mock libcuda with the driver's launch and naming entry points, mock libllama's llama_decode)
//! is started BEFORE the agent, loads a kernel and a graph and launches them, and only then is
//! the real agent attached to it (`record --pid`, no environment variable, no restart). The
//! launches it makes afterwards must all come back, named where the agent saw the name handed
//! out, `unnamed#N` where it could not, graphs as `graph#N`, and joined to the llama_decode step
//! that made them.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    fs,
    io::Read,
    path::Path,
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use inferscope_integration_tests::{agent, mock_cuda, test_dir};
use serde_json::Value;

/// Launches the mock engine makes per step: 6 kernels, 2 graphs.
const PER_STEP: u64 = 8;

struct Run {
    summary: Value,
    launches: Vec<Value>,
    steps: Vec<Value>,
    counters: agent::Counters,
    log: String,
}

/// Runs the mock engine (`steps` steps, `pre_us` of host work before each step's first
/// launch); with `agent_args`, the agent attaches to it after its early launches, before its
/// steps.
fn run(name: &str, steps: u32, pre_us: u32, agent_args: Option<&[&str]>) -> Run {
    run_until(name, steps, pre_us, agent_args, None)
}

/// [`run`], the agent stopped only once its log holds `until_log`.
fn run_until(
    name: &str,
    steps: u32,
    pre_us: u32,
    agent_args: Option<&[&str]>,
    until_log: Option<&str>,
) -> Run {
    let dir = test_dir(name);
    let go = dir.join("go");
    let mut engine = mock_cuda::start_launcher(&go, steps, pre_us);
    let pid = engine.id();
    let launches = dir.join("launches.jsonl");
    let steps_file = dir.join("steps.jsonl");
    let log = dir.join("agent.log");
    let recorder = agent_args.map(|extra| {
        let mut recorder = start_agent(&dir, pid, extra, &launches, &steps_file, &log);
        agent::wait_attached(&mut recorder, &log, pid, Duration::from_secs(30));
        let text = fs::read_to_string(&log).unwrap();
        assert!(text.contains("GPU launch probes attached"), "{text}");
        recorder
    });
    fs::write(&go, b"").unwrap();
    assert!(engine.wait().unwrap().success());
    let mut summary = String::new();
    engine
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut summary)
        .unwrap();
    let summary: Value = serde_json::from_str(summary.trim()).expect("the launcher's summary");
    let Some(mut recorder) = recorder else {
        return Run {
            summary,
            launches: vec![],
            steps: vec![],
            counters: agent::Counters::empty(),
            log: String::new(),
        };
    };
    // Every step the engine made has ended: its record is the agent's last word on it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent::read_records(&steps_file).len() < steps as usize && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    if let Some(needle) = until_log {
        agent::wait_log(&log, needle, Duration::from_secs(20));
    }
    agent::unsafe_sigint(recorder.id());
    let _ = recorder.wait();
    let run = Run {
        summary,
        launches: agent::read_records(&launches),
        steps: agent::read_records(&steps_file),
        counters: agent::Counters::read(&dir.join("counters.json")),
        log: fs::read_to_string(&log).unwrap(),
    };
    // Short of steps: the agent's own account of what it lost says where they went.
    assert_eq!(
        run.steps.len(),
        steps as usize,
        "step records within 20 s; ring drops {}, scheduler reads failed {}, agent log:\n{}",
        run.counters.get("kernel_ringbuf_full_drops"),
        run.counters.get("kernel_sched_read_failed"),
        run.log
    );
    run
}

fn start_agent(
    dir: &Path,
    pid: u32,
    extra: &[&str],
    launches: &Path,
    steps: &Path,
    log: &Path,
) -> Child {
    Command::new(agent::binary())
        .args(["record", "--pid", &pid.to_string(), "--out"])
        .arg(dir.join("records.jsonl"))
        .arg("--launches")
        .arg(launches)
        .arg("--steps")
        .arg(steps)
        .arg("--counters")
        .arg(dir.join("counters.json"))
        .args(extra)
        .env("INFERSCOPE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(log).unwrap())
        .spawn()
        .expect("starting inferscope")
}

#[test]
fn a_running_engine_gets_its_launches_names_graphs_and_steps_without_restart() {
    const STEPS: u32 = 20;
    const PRE_US: u32 = 3000;
    let r = run("gpu-launches", STEPS, PRE_US, Some(&[]));
    let (got, log) = (&r.launches, &r.log);
    let pid = r.summary["pid"].as_u64().unwrap();
    let tid = r.summary["tid"].as_u64().unwrap();
    let want = u64::from(STEPS) * PER_STEP;

    // Exactly the launches made after the attach: none before it was seen (it was not there),
    // none lost or counted twice.
    assert_eq!(got.len() as u64, want, "{got:#?}\n{log}");
    let mut by_api: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for l in got {
        assert_eq!(l["pid"].as_u64(), Some(pid));
        assert_eq!(l["tid"].as_u64(), Some(tid));
        assert_eq!(l["source"], "uprobe");
        assert_eq!(l["stands_for"], 1);
        by_api
            .entry(l["api"].as_str().unwrap().to_owned())
            .or_default()
            .push(l);
    }
    let steps_n = STEPS as usize;
    for api in [
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchKernelEx",
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuGraphLaunch",
        "cudaGraphLaunch",
    ] {
        assert_eq!(
            by_api.get(api).map_or(0, Vec::len),
            steps_n,
            "{api}: {by_api:#?}"
        );
    }
    // Names: loaded before the attach → unnamed (never a wrong name); loaded after → its own.
    let first = |api: &str| by_api[api][0];
    assert_eq!(first("cuLaunchKernel")["name"], "unnamed#1");
    assert_eq!(first("cuLaunchKernel")["named"], false);
    assert_eq!(first("cuLaunchKernel_ptsz")["name"], "late_kernel");
    assert_eq!(first("cuLaunchCooperativeKernel")["name"], "late_kernel");
    assert_eq!(first("cuLaunchKernelEx")["name"], "_Z10lib_kernelv");
    assert_eq!(
        first("cudaLaunchKernel")["name"],
        "flash_fwd_kernel(float*)"
    );
    // CUDA 13's way: a cudaKernel_t from cudaGetKernel (after the attach), launched through
    // the versioned libcudart.so.12's cudaLaunchKernelExC, named from the stub it was got for.
    assert_eq!(
        first("cudaLaunchKernelExC")["name"],
        "cuda13_kernel(float*)"
    );
    let exc = first("cudaLaunchKernelExC");
    assert_eq!(exc["grid"], serde_json::json!([3, 1, 1]));
    assert_eq!(exc["block"], serde_json::json!([96, 1, 1]));
    assert_eq!(exc["shared_mem_bytes"], 2048);
    assert_eq!(exc["stream"], 0x66);
    assert_eq!(first("cuGraphLaunch")["name"], "graph#1");
    assert_eq!(first("cudaGraphLaunch")["name"], "graph#2");
    // Arguments as the engine passed them (stack arguments, the launch config, dim3 pairs).
    let k = first("cuLaunchKernel");
    assert_eq!(k["grid"], serde_json::json!([11, 12, 13]));
    assert_eq!(k["block"], serde_json::json!([14, 15, 16]));
    assert_eq!(k["shared_mem_bytes"], 17);
    assert_eq!(k["stream"], 0x55);
    let ex = first("cuLaunchKernelEx");
    assert_eq!(ex["grid"], serde_json::json!([7, 8, 9]));
    assert_eq!(ex["block"], serde_json::json!([256, 2, 1]));
    assert_eq!(ex["shared_mem_bytes"], 4096);
    assert_eq!(ex["stream"], 0x77);
    let rt = first("cudaLaunchKernel");
    assert_eq!(rt["grid"], serde_json::json!([64, 2, 1]));
    assert_eq!(rt["block"], serde_json::json!([128, 1, 1]));
    assert_eq!(rt["shared_mem_bytes"], 8192);
    assert_eq!(rt["stream"], 0x66);
    assert!(got.iter().all(|l| l.get("args_unread").is_none()));

    // Steps: each llama_decode carries its 6 kernel and 2 graph launches, the host time before
    // the first launch (the engine sleeps PRE_US there), and its kernels by name.
    let with_launches: Vec<&Value> = r
        .steps
        .iter()
        .filter(|s| !s["gpu_launches"].is_null())
        .collect();
    assert_eq!(with_launches.len(), steps_n, "{:#?}", r.steps);
    for s in &with_launches {
        let g = &s["gpu_launches"];
        assert_eq!(g["source"], "uprobe");
        assert_eq!(g["kernel_launches"], 6, "{s:#}");
        assert_eq!(g["graph_launches"], 2);
        assert_eq!(g["named_launches"], 5);
        let before = g["before_first_launch_ms"].as_f64().unwrap();
        assert!(before >= f64::from(PRE_US) / 1e3, "{s:#}");
        let share = g["before_first_launch_share"].as_f64().unwrap();
        assert!(share > 0.5 && share <= 1.0, "{s:#}");
        let graphs: Vec<&str> = g["graphs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(graphs, ["graph#1", "graph#2"]);
        assert_eq!(g["kernels"][0]["name"], "late_kernel");
        assert_eq!(g["kernels"][0]["launches"], 2);
    }
    let c = &r.counters;
    assert_eq!(c.get("kernel_gpu_launches"), want);
    assert_eq!(c.get("kernel_gpu_launches_sampled_out"), 0);
    assert!(c.get("kernel_gpu_names") >= 4);
    assert_eq!(c.get("kernel_gpu_name_read_failed"), 0);
    // One kernel was looked up before the attach: one unnamed kernel, counted.
    assert_eq!(c.get("gpu_kernels_unnamed"), 1);
    // The runtime's hooks sit in the versioned libcudart.so.12, the driver's in libcuda.so.1.
    assert!(log.contains("cudaLaunchKernelExC"), "{log}");
}

/// A process that maps the CUDA driver only after the agent attached (dlopen, as a Python
/// engine importing torch) gets its launch probes then, and its launches named.
#[test]
fn a_driver_loaded_after_the_attach_is_probed_then() {
    let dir = test_dir("gpu-late-dlopen");
    let (go, stop) = (dir.join("go"), dir.join("stop"));
    let mut engine = mock_cuda::start_late_loader(&go, &stop);
    let pid = engine.id();
    let launches = dir.join("launches.jsonl");
    let log = dir.join("agent.log");
    let mut recorder = start_agent(&dir, pid, &[], &launches, &dir.join("steps.jsonl"), &log);
    agent::wait_attached(&mut recorder, &log, pid, Duration::from_secs(30));
    assert!(
        !fs::read_to_string(&log)
            .unwrap()
            .contains("GPU launch probes attached"),
        "nothing to probe before the driver is loaded"
    );
    fs::write(&go, b"").unwrap();
    let got = agent::wait_records(
        &launches,
        Duration::from_secs(20),
        "launches after the dlopen",
        |l| l.len() >= 5,
    );
    fs::write(&stop, b"").unwrap();
    assert!(engine.wait().unwrap().success());
    agent::unsafe_sigint(recorder.id());
    let _ = recorder.wait();
    // The probes attach one after another within a millisecond: a launch whose kernel was looked
    // up just before the naming probe was in place may be the one unnamed launch.
    assert!(got.iter().all(|l| l["api"] == "cuLaunchKernel"), "{got:#?}");
    assert!(
        got.iter()
            .skip(1)
            .all(|l| l["name"] == "late_loaded_kernel" && l["named"] == true),
        "{got:#?}"
    );
    let counters = agent::Counters::read(&dir.join("counters.json"));
    assert!(counters.get("gpu_launch_hooks_attached") > 0);
    assert_eq!(counters.get("kernel_gpu_name_read_failed"), 0);
}

/// An engine whose model runs in a worker it started (vLLM's EngineCore is a child of the API
/// server): the worker is not traced (it serves no requests) but its launches are probed, and
/// it loads CUDA only after the agent attached.
#[test]
fn an_engine_s_worker_process_is_probed() {
    use std::io::BufRead;
    let dir = test_dir("gpu-worker");
    let (go, stop) = (dir.join("go"), dir.join("stop"));
    let late = mock_cuda::mock_dir().join("late");
    // The shell stays the parent: the worker is its child, not an exec of it.
    let mut engine = Command::new("sh")
        .args(["-c", "\"$0\" \"$1\" \"$2\"; true"])
        .arg(&late)
        .arg(&go)
        .arg(&stop)
        .env("LD_LIBRARY_PATH", mock_cuda::mock_dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufReader::new(engine.stdout.as_mut().unwrap())
        .read_line(&mut ready)
        .unwrap();
    let worker: Value = serde_json::from_str(ready.trim()).unwrap();
    let worker = worker["pid"].as_u64().unwrap();
    let pid = engine.id();
    assert_ne!(u64::from(pid), worker);
    let launches = dir.join("launches.jsonl");
    let log = dir.join("agent.log");
    let mut recorder = start_agent(&dir, pid, &[], &launches, &dir.join("steps.jsonl"), &log);
    agent::wait_attached(&mut recorder, &log, pid, Duration::from_secs(30));
    fs::write(&go, b"").unwrap();
    let got = agent::wait_records(
        &launches,
        Duration::from_secs(20),
        "the worker's launches",
        |l| l.len() >= 5,
    );
    fs::write(&stop, b"").unwrap();
    assert!(engine.wait().unwrap().success());
    agent::unsafe_sigint(recorder.id());
    let _ = recorder.wait();
    assert!(
        got.iter().all(|l| l["pid"].as_u64() == Some(worker)),
        "{got:#?}"
    );
}

/// The GPU proof scripts refuse at once, saying what is missing, instead of hanging or
/// failing later (run on a machine without a GPU, or with a piece missing).
#[test]
fn the_gpu_proof_refuses_clearly_when_something_is_missing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = test_dir("gpu-proof-refusal");
    /// (script, environment on top, what its refusal must say)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
    );
    let cases: [Case; 3] = [
        (
            "tests/gpu/launches.sh",
            &[("INFERSCOPE_BIN", "/nonexistent/inferscope")],
            "refuses: no agent binary at /nonexistent/inferscope",
        ),
        (
            "tests/gpu/launches.sh",
            &[("INFERSCOPE_SHIM_LIB", "/nonexistent/libshim.so")],
            "refuses: no shim library at /nonexistent/libshim.so",
        ),
        (
            "tests/gpu/run.sh",
            &[("PYTHON", "/nonexistent/python3")],
            "refuses: no Python at /nonexistent/python3",
        ),
    ];
    for (script, env, want) in cases {
        let started = std::time::Instant::now();
        let out = Command::new(root.join(script))
            .arg(&dir)
            .env("INFERSCOPE_BIN", agent::binary())
            .env("INFERSCOPE_SHIM_LIB", mock_cuda::shim_library())
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{script}: {stderr}");
        assert!(stderr.contains(want), "{script}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{script} took {:?}",
            started.elapsed()
        );
    }
}

/// Above the per-process cap one launch in 16 is recorded, each record says how many it stands
/// for, and every launch is either recorded or counted: the counts stay exact.
#[test]
fn over_the_launch_cap_launches_are_sampled_and_counted() {
    const STEPS: u32 = 2000;
    let r = run(
        "gpu-launch-cap",
        STEPS,
        0,
        Some(&["--gpu-launch-cap", "1000", "--gpu-launch-budget", "0"]),
    );
    let total = u64::from(STEPS) * PER_STEP;
    let c = &r.counters;
    let emitted = c.get("kernel_gpu_launches");
    let skipped = c.get("kernel_gpu_launches_sampled_out");
    assert_eq!(emitted + skipped, total, "{}", r.log);
    assert!(
        skipped > total / 2,
        "the cap did not bite: {skipped} of {total}"
    );
    assert_eq!(r.launches.len() as u64, emitted);
    let stands_for: u64 = r
        .launches
        .iter()
        .map(|l| l["stands_for"].as_u64().unwrap())
        .sum();
    // Launches skipped after a CPU's last recorded one are in the counter only (at most 15 per
    // CPU the engine ran on).
    assert!(
        stands_for <= total && total - stands_for < 16 * 64,
        "{stands_for} of {total}"
    );
    assert!(r.launches.iter().any(|l| l["sampled"] == true));
    let sampled_steps = r
        .steps
        .iter()
        .filter(|s| s["gpu_launches"]["sampled"] == true)
        .count();
    assert!(sampled_steps > 0);
}

/// An eager engine whose launches would cost it more than the budget (2 % at 5 us a launch:
/// 4,000 launches a second) has its launch probes paused, says so, and counts it.
#[test]
fn an_engine_over_the_launch_budget_has_its_launch_probes_paused() {
    // About 3 s of steps of 8 launches each, 100 us apart: ~40,000 launches a second, for
    // longer than the agent takes to notice (its budget is checked every second).
    const STEPS: u32 = 20_000;
    let r = run_until(
        "gpu-launch-budget",
        STEPS,
        100,
        Some(&[]),
        Some("launch probes paused"),
    );
    assert!(r.counters.get("gpu_launch_probes_paused") >= 1, "{}", r.log);
    assert!(
        r.log.contains("--gpu-launch-budget 0 keeps them"),
        "{}",
        r.log
    );
}

/// Host cost of the launch uprobes per launch (BENCHMARKS.md): the mock engine's steps with no
/// agent, with the agent, and with the agent and a cap that samples. Prints a table; asserts
/// only that every launch was seen or counted.
#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn uprobe_cost_per_launch() {
    const STEPS: u32 = 20_000;
    let launches = f64::from(STEPS) * PER_STEP as f64;
    let wall = |r: &Run| r.summary["steps_wall_ns"].as_f64().unwrap();
    let mut rows = Vec::new();
    for round in 0..3 {
        let bare = run(&format!("bench-bare-{round}"), STEPS, 0, None);
        let probed = run(
            &format!("bench-probed-{round}"),
            STEPS,
            0,
            Some(&["--gpu-launch-cap", "0", "--gpu-launch-budget", "0"]),
        );
        let capped = run(
            &format!("bench-capped-{round}"),
            STEPS,
            0,
            Some(&["--gpu-launch-budget", "0"]),
        );
        assert_eq!(probed.counters.get("kernel_gpu_launches"), launches as u64);
        rows.push((wall(&bare), wall(&probed), wall(&capped)));
    }
    println!("| round | no agent ns/launch | probes ns/launch | probes + default cap ns/launch |");
    for (i, (b, p, c)) in rows.iter().enumerate() {
        println!(
            "| {i} | {:.0} | {:.0} | {:.0} |",
            b / launches,
            p / launches,
            c / launches
        );
    }
}
