//! The CUPTI shim end to end without a GPU: the mock libcuda's cuInit loads the real
//! `libinferscope_cupti.so` through CUDA_INJECTION64_PATH, the shim loads the mock libcupti through
//! cudarc's real dynamic loader, the mock engine launches kernels (runtime, driver, _ptsz, Ex and
//! CUDA graph launches), and the real `inferscope gpu` agent receives them over a real socket.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use inferscope_integration_tests::{agent, mock_cuda};
use serde_json::Value;

struct Agent {
    child: Child,
    out: PathBuf,
    socket: PathBuf,
}

impl Agent {
    fn start(dir: &Path) -> Agent {
        let socket = dir.join("run/shim.sock");
        let out = dir.join("gpu.jsonl");
        let child = Command::new(agent::binary())
            .args(["gpu", "--no-nvml", "--socket"])
            .arg(&socket)
            .arg("--out")
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("agent.log")).unwrap())
            .spawn()
            .expect("starting inferscope gpu");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "the agent never created {socket:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Agent { child, out, socket }
    }

    fn lines(&self) -> Vec<Value> {
        fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn kernels(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|v| v["type"] == "kernel")
            .collect()
    }

    fn wait_kernels(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let k = self.kernels();
            if k.len() >= n || Instant::now() > deadline {
                return k;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the agent (SIGTERM) and returns its final counters.
    fn stop(mut self) -> HashMap<String, u64> {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let _ = self.child.wait();
        let last = self
            .lines()
            .into_iter()
            .find(|v| v["type"] == "counters")
            .expect("the agent printed its counters at exit");
        last["counters"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect()
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

fn tempdir(name: &str) -> PathBuf {
    inferscope_integration_tests::test_dir(&format!("shim-{name}"))
}

/// Records the shim says it sent (its exit summary: "<pid> ... <sent> records sent, ...").
fn shim_sent(out: &std::process::Output) -> u64 {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stderr
        .lines()
        .find(|l| l.contains("records sent"))
        .unwrap_or_else(|| panic!("no shim summary: {stderr}"));
    summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .nth(1)
        .unwrap_or_else(|| panic!("no count in {summary}"))
}

fn engine_json(out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "engine failed: {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!("engine output not JSON ({e}): {stdout}\nstderr: {stderr}");
    })
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

#[test]
fn injection_entry_point_is_exported() {
    let lib = mock_cuda::shim_library();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("running nm (binutils)");
    let syms = String::from_utf8_lossy(&out.stdout);
    assert!(
        syms.lines().any(|l| l.ends_with(" T InitializeInjection")),
        "InitializeInjection not exported by {lib:?}:\n{syms}"
    );
}

#[test]
fn kernels_arrive_with_launch_graph_and_clock_details() {
    let dir = tempdir("full");
    let agent = Agent::start(&dir);
    let (rounds, graphs) = (50u64, 20u64);
    let out = mock_cuda::run_engine(
        &["run", &rounds.to_string(), &graphs.to_string()],
        &agent.socket,
        &[],
    );
    let engine = engine_json(&out);
    let expected = (rounds * 4 + graphs * 3) as usize;
    let kernels = agent.wait_kernels(expected);
    assert_eq!(kernels.len(), expected, "kernel records received");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{expected} records sent, 0 dropped")),
        "shim summary: {stderr}"
    );

    let pid = u(&engine, "pid");
    let (eager_tid, main_tid) = (u(&engine, "eager_tid"), u(&engine, "main_tid"));
    let by_name = |n: &str| -> Vec<&Value> { kernels.iter().filter(|k| k["name"] == n).collect() };
    // (demangled name, count, launch API, tensor cores, launching thread)
    let expect = [
        (
            "flash_fwd_kernel(float*)",
            rounds,
            "cudaLaunchKernel",
            true,
            eager_tid,
        ),
        (
            "rms_norm_kernel(float*, float*)",
            rounds + graphs,
            "",
            false,
            0,
        ),
        (
            "elementwise_add",
            rounds,
            "cuLaunchKernel_ptsz",
            false,
            eager_tid,
        ),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32",
            rounds,
            "cuLaunchKernelEx",
            true,
            eager_tid,
        ),
        (
            "ampere_bf16_s16816gemm_bf16_tn",
            graphs,
            "cudaGraphLaunch",
            true,
            main_tid,
        ),
        (
            "silu_and_mul_k(float*, float*)",
            graphs,
            "cudaGraphLaunch",
            false,
            main_tid,
        ),
    ];
    for (name, count, api, tensor, tid) in expect {
        let ks = by_name(name);
        assert_eq!(ks.len() as u64, count, "{name}");
        for k in ks {
            assert_eq!(k["tensor_core"], tensor, "{name} tensor-core flag");
            if !api.is_empty() {
                assert_eq!(k["launch_api"], api, "{name}");
                assert_eq!(u(k, "launch_tid"), tid, "{name} launch thread");
            }
        }
    }
    for k in &kernels {
        assert_eq!(u(k, "pid"), pid);
        let (launch, start, end) = (
            u(k, "launch_mono_ns"),
            u(k, "start_mono_ns"),
            u(k, "end_mono_ns"),
        );
        assert!(
            launch > 0 && launch < start && start < end,
            "clock order in {k}"
        );
        assert!(
            start - launch < 5_000_000,
            "start within 5 ms of launch: {k}"
        );
    }
    // Graph kernels: one correlation id per graph launch, shared by its three node kernels.
    let graph: Vec<&Value> = kernels.iter().filter(|k| u(k, "graph_id") != 0).collect();
    assert_eq!(graph.len() as u64, graphs * 3);
    let mut per_launch: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for k in &graph {
        per_launch
            .entry(u(k, "correlation_id"))
            .or_default()
            .insert(u(k, "graph_node_id"));
    }
    assert_eq!(per_launch.len() as u64, graphs);
    assert!(per_launch.values().all(|nodes| nodes.len() == 3));
    // Eager kernels: one launch each, each its own correlation id.
    let eager: BTreeSet<u64> = kernels
        .iter()
        .filter(|k| u(k, "graph_id") == 0)
        .map(|k| u(k, "correlation_id"))
        .collect();
    assert_eq!(eager.len() as u64, rounds * 4);
    let shim = agent
        .lines()
        .into_iter()
        .find(|v| v["type"] == "shim")
        .expect("shim hello");
    assert_eq!(shim["clock_source"], "timestamp_callback");
    assert_eq!(u(&shim, "pid"), pid);

    // Copies are recorded only when asked for (INFERSCOPE_SHIM_MEMCPY=1).
    assert!(!agent.lines().iter().any(|v| v["type"] == "memcpy"));
    let counters = agent.stop();
    assert_eq!(counters["shim_kernels_received"], expected as u64);
    assert_eq!(counters["shim_dropped_records"], 0);
    assert_eq!(counters["shim_parse_failures"], 0);
}

#[test]
fn offset_calibration_when_the_timestamp_callback_is_refused() {
    let dir = tempdir("calib");
    let agent = Agent::start(&dir);
    let out = mock_cuda::run_engine(
        &["run", "20", "5"],
        &agent.socket,
        &[("MOCK_CUPTI_NO_TIMESTAMP_CALLBACK", "1")],
    );
    engine_json(&out);
    let kernels = agent.wait_kernels(95);
    assert_eq!(kernels.len(), 95);
    for k in &kernels {
        let (launch, start) = (u(k, "launch_mono_ns"), u(k, "start_mono_ns"));
        // CUPTI's clock here is CLOCK_REALTIME; after calibration it must land near the launch.
        assert!(
            launch.abs_diff(start) < 5_000_000,
            "calibrated start near launch: {k}"
        );
    }
    let shim = agent
        .lines()
        .into_iter()
        .find(|v| v["type"] == "shim")
        .expect("shim hello");
    assert_eq!(shim["clock_source"], "offset_calibration");
    agent.stop();
}

#[test]
fn another_cupti_subscriber_makes_the_shim_step_aside() {
    let dir = tempdir("multi");
    let agent = Agent::start(&dir);
    let out = mock_cuda::run_engine(
        &["run", "10", "2"],
        &agent.socket,
        &[("MOCK_CUPTI_OTHER_SUBSCRIBER", "1")],
    );
    let engine = engine_json(&out);
    assert_eq!(
        u(&engine, "eager_kernels"),
        40,
        "the engine ran all its work"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("steps aside").count(),
        1,
        "logged once: {stderr}"
    );
    // A window for a connection that must not come: nothing to wait for.
    std::thread::sleep(Duration::from_millis(300));
    let counters = agent.stop();
    assert_eq!(counters["shim_connections"], 0);
    assert_eq!(counters["shim_kernels_received"], 0);
}

#[test]
fn absent_agent_leaves_the_engine_unharmed_and_counts_drops() {
    let dir = tempdir("absent");
    let socket = dir.join("nobody/shim.sock");
    let out = mock_cuda::run_engine(&["run", "25", "4"], &socket, &[]);
    engine_json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("0 records sent, 112 dropped (agent absent or slow)"),
        "shim summary: {stderr}"
    );
}

#[test]
fn activity_buffer_overflow_is_counted_not_lost() {
    let dir = tempdir("overflow");
    let agent = Agent::start(&dir);
    // One 4 KiB buffer (19 kernel records) outstanding at a time, and a slow CUPTI worker: most
    // records find no buffer, and CUPTI drops and counts them.
    let out = mock_cuda::run_engine(
        &["run", "100", "0"],
        &agent.socket,
        &[
            ("INFERSCOPE_SHIM_BUFFER_KIB", "4"),
            ("INFERSCOPE_SHIM_MAX_BUFFERS", "1"),
            ("MOCK_CUPTI_WORKER_DELAY_MS", "200"),
        ],
    );
    engine_json(&out);
    let received = agent.wait_kernels(shim_sent(&out) as usize).len() as u64;
    let counters = agent.stop();
    let dropped = counters["shim_cupti_dropped_records"];
    assert!(dropped > 0, "CUPTI drops counted: {counters:?}");
    assert!(received > 0, "some records still arrive");
    assert_eq!(received + dropped, 400, "every kernel received or counted");
}

#[test]
fn late_agent_gets_the_rest_and_the_count_of_what_it_missed() {
    let dir = tempdir("late");
    let socket = dir.join("run/shim.sock");
    // 150 rounds 10 ms apart (~1.5 s); small buffers so records complete while nobody listens.
    let engine = {
        let socket = socket.clone();
        std::thread::spawn(move || {
            mock_cuda::run_engine(
                &["run", "150", "0", "10000"],
                &socket,
                &[("INFERSCOPE_SHIM_BUFFER_KIB", "4")],
            )
        })
    };
    // Traffic shaping: the engine completes kernels before the agent exists.
    std::thread::sleep(Duration::from_millis(400));
    let agent = Agent::start(&dir);
    let out = engine.join().unwrap();
    engine_json(&out);
    let received = agent.wait_kernels(shim_sent(&out) as usize).len() as u64;
    let counters = agent.stop();
    let missed = counters["shim_dropped_records"];
    assert!(received > 0, "the shim reconnected: {counters:?}");
    assert!(
        missed > 0,
        "records completed before the agent came are counted: {counters:?}"
    );
    assert_eq!(received + missed, 600, "every kernel received or counted");
}

#[test]
fn memcpy_records_when_enabled() {
    let dir = tempdir("memcpy");
    let agent = Agent::start(&dir);
    let out = mock_cuda::run_engine(
        &["run", "10", "2"],
        &agent.socket,
        &[("INFERSCOPE_SHIM_MEMCPY", "1")],
    );
    let engine = engine_json(&out);
    let kernels = agent.wait_kernels(46);
    assert_eq!(kernels.len(), 46);
    let copies: Vec<Value> = agent
        .lines()
        .into_iter()
        .filter(|v| v["type"] == "memcpy")
        .collect();
    assert_eq!(copies.len() as u64, u(&engine, "memcpys"));
    for c in &copies {
        assert_eq!(c["kind"], "HtoD");
        assert_eq!(u(c, "bytes"), 4096);
        assert_eq!(u(c, "pid"), u(&engine, "pid"));
        assert!(u(c, "start_mono_ns") < u(c, "end_mono_ns"));
    }
    agent.stop();
}

#[test]
fn agent_dying_mid_run_leaves_the_engine_unharmed() {
    let dir = tempdir("dies");
    let mut agent = Agent::start(&dir);
    let socket = agent.socket.clone();
    // ~1.5 s of launches with small buffers, so batches keep flowing while the agent goes away.
    // The mock engine keeps the default SIGPIPE disposition: a write to the dead socket without
    // MSG_NOSIGNAL would kill it.
    let engine = std::thread::spawn(move || {
        mock_cuda::run_engine(
            &["run", "150", "0", "10000"],
            &socket,
            &[("INFERSCOPE_SHIM_BUFFER_KIB", "4")],
        )
    });
    // The agent dies once records are flowing.
    agent.wait_kernels(1);
    agent.child.kill().unwrap();
    let _ = agent.child.wait();
    let out = engine.join().unwrap();
    engine_json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // "<sent> records sent, <dropped> dropped (agent absent or slow), ..."
    let summary = stderr
        .lines()
        .find(|l| l.contains("records sent"))
        .unwrap_or_else(|| panic!("no shim summary: {stderr}"));
    let numbers: Vec<u64> = summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // [pid, sent, dropped, cupti dropped, unjoined]
    assert!(numbers.len() >= 3, "{summary}");
    assert!(
        numbers[1] > 0,
        "some records went out before the agent died: {summary}"
    );
    assert!(
        numbers[2] > 0,
        "the rest were counted as dropped: {summary}"
    );
}
