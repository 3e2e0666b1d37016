//! GPU launch uprobes end to end, without a GPU and without the shim: the mock engine (real
//! mock libcuda with the driver's launch and naming entry points, mock libllama's llama_decode)
//! is started BEFORE the agent, loads a kernel and a graph and launches them, and only then is
//! the real agent attached to it (`record --pid`, no environment variable, no restart). The
//! launches it makes afterwards must all come back, named where the agent saw the name handed
//! out, `unnamed#N` where it could not, graphs as `graph#N`, and joined to the llama_decode step
//! that made them.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, fs, io::Read, process::Command, time::Duration};

use inferscope_integration_tests::{agent, mock_cuda, test_dir};
use serde_json::Value;

const STEPS: u32 = 20;
const PRE_US: u32 = 3000;

#[test]
fn a_running_engine_gets_its_launches_names_graphs_and_steps_without_restart() {
    let dir = test_dir("gpu-launches");
    let go = dir.join("go");
    let mut engine = mock_cuda::start_launcher(&go, STEPS, PRE_US);
    let pid = engine.id();
    let launches = dir.join("launches.jsonl");
    let steps = dir.join("steps.jsonl");
    let log = dir.join("agent.log");
    let mut recorder = Command::new(agent::binary())
        .args(["record", "--pid", &pid.to_string(), "--out"])
        .arg(dir.join("records.jsonl"))
        .arg("--launches")
        .arg(&launches)
        .arg("--steps")
        .arg(&steps)
        .arg("--counters")
        .arg(dir.join("counters.json"))
        .env("INFERSCOPE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting inferscope");
    agent::wait_attached(&mut recorder, &log, pid, Duration::from_secs(30));
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("GPU launch probes attached"), "{text}");
    fs::write(&go, b"").unwrap();
    let status = engine.wait().unwrap();
    assert!(status.success());
    let mut summary = String::new();
    engine
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut summary)
        .unwrap();
    let summary: Value = serde_json::from_str(summary.trim()).expect("the launcher's summary");
    let tid = summary["tid"].as_u64().unwrap();
    let want = u64::from(STEPS) * 7;
    let got = agent::wait_records(&launches, Duration::from_secs(20), "every launch", |l| {
        l.len() as u64 >= want
    });
    agent::unsafe_sigint(recorder.id());
    let _ = recorder.wait();
    let log_text = fs::read_to_string(&log).unwrap();

    // Exactly the launches made after the attach: none before it was seen (it was not there),
    // none lost or counted twice.
    assert_eq!(got.len() as u64, want, "{got:#?}\n{log_text}");
    let mut by_api: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for l in &got {
        assert_eq!(l["pid"].as_u64(), Some(u64::from(pid)));
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

    // Steps: each llama_decode carries its 5 kernel and 2 graph launches, the host time before
    // the first launch (the engine sleeps PRE_US there), and its kernels by name.
    let steps = agent::read_records(&steps);
    let with_launches: Vec<&Value> = steps
        .iter()
        .filter(|s| !s["gpu_launches"].is_null())
        .collect();
    assert_eq!(with_launches.len(), steps_n, "{steps:#?}");
    for s in &with_launches {
        let g = &s["gpu_launches"];
        assert_eq!(g["source"], "uprobe");
        assert_eq!(g["kernel_launches"], 5, "{s:#}");
        assert_eq!(g["graph_launches"], 2);
        assert_eq!(g["named_launches"], 4);
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
    let counters = agent::Counters::read(&dir.join("counters.json"));
    assert_eq!(counters.get("kernel_gpu_launches"), want);
    assert_eq!(counters.get("kernel_gpu_launches_sampled_out"), 0);
    assert!(counters.get("kernel_gpu_names") >= 3);
    assert_eq!(counters.get("kernel_gpu_name_read_failed"), 0);
}
