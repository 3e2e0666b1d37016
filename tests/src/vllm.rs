//! vLLM's real serving stack on CPU (tests/engine/vllm): `vllm serve` with vLLM's own API
//! server, AsyncLLM, EngineCore, Scheduler, KV cache manager and ZeroMQ IPC; only the model's
//! forward pass sleeps. Its scheduler writes what it did (ground truth, CLOCK_MONOTONIC) to a
//! JSON-lines file read by [`Truth`]. Reusable by any test that needs a vLLM under load: the
//! KV pool, batch and sequence limits are options.
use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The vLLM venv's Python (scripts/setup.sh): INFERSCOPE_VLLM_PYTHON, else .venv-vllm.
pub fn vllm_python() -> PathBuf {
    std::env::var_os("INFERSCOPE_VLLM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-vllm/bin/python3"))
}

#[derive(Debug, Clone)]
pub struct VllmOptions {
    /// KV pool in blocks of `block_size` tokens (must hold one `max_model_len` request).
    pub kv_blocks: u32,
    pub block_size: u32,
    pub max_num_seqs: u32,
    /// 0: vLLM's default.
    pub max_num_batched_tokens: u32,
    pub max_model_len: u32,
    /// The fake forward pass: fixed time per step plus time per scheduled token.
    pub step_ms: f64,
    pub token_us: f64,
    /// More `vllm serve` arguments.
    pub extra: Vec<String>,
    /// More environment for `vllm serve` and its EngineCore (e.g. the mock CUDA stack).
    pub env: Vec<(String, String)>,
    /// Served over HTTPS (`extra` names the certificate): readiness is then uvicorn's start-up
    /// line and an open port, not a plain-HTTP /health.
    pub https: bool,
    /// `vllm serve --grpc`: readiness is then an open port (the gRPC server binds once the
    /// engine is up).
    pub grpc: bool,
}

impl Default for VllmOptions {
    fn default() -> Self {
        VllmOptions {
            kv_blocks: 256,
            block_size: 16,
            max_num_seqs: 16,
            max_num_batched_tokens: 0,
            max_model_len: 3200,
            step_ms: 4.0,
            token_us: 20.0,
            extra: Vec::new(),
            env: Vec::new(),
            https: false,
            grpc: false,
        }
    }
}

pub struct VllmServer {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    /// The scheduler's ground truth (JSON lines).
    pub truth: PathBuf,
    pub log: PathBuf,
}

impl VllmServer {
    /// Starts `vllm serve` (in a process group of its own, with its EngineCore) and waits
    /// until /health answers 200.
    pub fn start(dir: &Path, port: u16, o: &VllmOptions) -> VllmServer {
        std::fs::create_dir_all(dir).expect("vLLM work dir");
        let truth = dir.join("truth.jsonl");
        let _ = std::fs::remove_file(&truth);
        let log = dir.join("vllm.log");
        let mut cmd = Command::new(vllm_python());
        cmd.arg(repo_root().join("tests/engine/vllm/serve.py"))
            .args(["--port", &port.to_string()])
            .arg("--workdir")
            .arg(dir)
            .arg("--truth")
            .arg(&truth)
            .args(["--kv-blocks", &o.kv_blocks.to_string()])
            .args(["--block-size", &o.block_size.to_string()])
            .args(["--max-num-seqs", &o.max_num_seqs.to_string()])
            .args(["--max-model-len", &o.max_model_len.to_string()])
            .args([
                "--max-num-batched-tokens",
                &o.max_num_batched_tokens.to_string(),
            ])
            .env("INFERSCOPE_VLLM_STEP_MS", o.step_ms.to_string())
            .env("INFERSCOPE_VLLM_TOKEN_US", o.token_us.to_string())
            .envs(o.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("vLLM log"))
            .process_group(0);
        if !o.extra.is_empty() || o.grpc {
            cmd.arg("--").args(&o.extra);
        }
        if o.grpc {
            cmd.arg("--grpc");
        }
        let child = cmd
            .spawn()
            .expect("starting vLLM (run scripts/setup.sh for .venv-vllm)");
        let mut server = VllmServer {
            child,
            port,
            dir: dir.to_path_buf(),
            truth,
            log,
        };
        server.wait_ready(o.https, o.grpc);
        server
    }

    /// The API server's pid (the launcher execs `vllm serve`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(&mut self, https: bool, grpc: bool) {
        let deadline = Instant::now() + Duration::from_secs(240);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("waiting on vLLM") {
                panic!(
                    "vLLM exited during start-up ({status}):\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if grpc {
                if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                    return;
                }
            } else if https {
                let started = std::fs::read_to_string(&self.log)
                    .is_ok_and(|log| log.contains("Application startup complete"));
                if started && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                    return;
                }
            } else if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ =
                    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                if text.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "vLLM on port {} not ready within 240 s:\n{}",
            self.port,
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// The EngineCore process (the API server's child titled `VLLM::EngineCore`), which runs
    /// the scheduler and the worker: the process whose kernels a step launches.
    pub fn engine_core_pid(&self) -> Option<u32> {
        let server = self.pid().to_string();
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat.rsplit_once(") ")?.1.split_whitespace().nth(1)?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (ppid == server && cmdline.starts_with(b"VLLM::EngineCore")).then_some(pid)
        })
    }

    pub fn read_truth(&self) -> Truth {
        Truth::read(&self.truth, 0)
    }

    /// Where the ground truth ends now: [`VllmServer::read_truth_since`] reads what follows.
    pub fn truth_mark(&self) -> u64 {
        std::fs::metadata(&self.truth).map_or(0, |m| m.len())
    }

    pub fn read_truth_since(&self, mark: u64) -> Truth {
        Truth::read(&self.truth, mark)
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        // The API server and its EngineCore: the whole group, politely, then not.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// One engine request as vLLM's scheduler saw it.
#[derive(Debug, Default, Clone)]
pub struct TruthRequest {
    pub prompt_tokens: u64,
    /// SCHEDULED and PREEMPTED event stamps (CLOCK_MONOTONIC ns).
    pub scheduled: Vec<u64>,
    pub preempted: Vec<u64>,
    /// Finished from outside (the client went away).
    pub aborted: bool,
}

#[derive(Debug, Clone)]
pub struct TruthStep {
    pub start_ns: u64,
    pub end_ns: u64,
    pub ids: Vec<String>,
    /// Engine ids the step sent an output for (a token, or the request's end).
    pub outputs: Vec<String>,
    pub running: Option<u64>,
    pub waiting: Option<u64>,
}

/// The ground truth vLLM's scheduler wrote (tests/engine/vllm/inferscope_vllm/scheduler.py).
#[derive(Debug, Default)]
pub struct Truth {
    pub requests: HashMap<String, TruthRequest>,
    pub steps: Vec<TruthStep>,
}

pub fn ns(seconds: f64) -> u64 {
    (seconds * 1e9 + 0.5).floor() as u64
}

impl Truth {
    /// The lines of `path` from byte `from` on.
    pub fn read(path: &Path, from: u64) -> Truth {
        let text = std::fs::read(path).unwrap_or_default();
        let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
        let mut truth = Truth::default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let id = v["id"].as_str().unwrap_or_default().to_owned();
            let t = v["t"].as_f64().map(ns).unwrap_or(0);
            match v["ev"].as_str() {
                Some("add") => {
                    truth.requests.entry(id).or_default().prompt_tokens =
                        v["prompt_tokens"].as_u64().unwrap_or(0)
                }
                Some("scheduled") => truth.requests.entry(id).or_default().scheduled.push(t),
                Some("preempted") => truth.requests.entry(id).or_default().preempted.push(t),
                Some("finish") if v["status"].as_str().is_some_and(|s| s.contains("ABORT")) => {
                    for id in v["ids"].as_array().into_iter().flatten() {
                        if let Some(id) = id.as_str() {
                            truth.requests.entry(id.to_owned()).or_default().aborted = true;
                        }
                    }
                }
                Some("step") => truth.steps.push(TruthStep {
                    start_ns: v["start"].as_f64().map(ns).unwrap_or(0),
                    end_ns: v["end"].as_f64().map(ns).unwrap_or(0),
                    ids: v["ids"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect(),
                    outputs: v["outputs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect(),
                    running: v["running"].as_u64(),
                    waiting: v["waiting"].as_u64(),
                }),
                _ => {}
            }
        }
        truth
    }

    /// The steps (by end) any of `ids` was scheduled in, each with `true` where one of them
    /// was prefilling: its first output (token) came in that step or later.
    pub fn steps_of(&self, ids: &[&String]) -> Vec<(u64, bool)> {
        let mut first_output: HashMap<&str, u64> = HashMap::new();
        for st in &self.steps {
            for id in &st.outputs {
                first_output.entry(id.as_str()).or_insert(st.end_ns);
            }
        }
        let mut out = Vec::new();
        for st in &self.steps {
            let mine: Vec<&&String> = ids.iter().filter(|id| st.ids.contains(id)).collect();
            if mine.is_empty() {
                continue;
            }
            let prefill = mine.iter().any(|id| {
                first_output
                    .get(id.as_str())
                    .is_none_or(|&f| st.end_ns <= f)
            });
            out.push((st.end_ns, prefill));
        }
        out
    }

    /// Engine requests serving the HTTP request whose external id is `external`
    /// (`chatcmpl-<id>`, or `cmpl-<id>` with one engine request per prompt, `-<index>`), with
    /// `n > 1` children (`<k>_…`).
    pub fn members(&self, external: &str) -> Vec<(&String, &TruthRequest)> {
        self.requests
            .iter()
            .filter(|(id, _)| {
                let base = match id.split_once('_') {
                    Some((k, rest)) if k.bytes().all(|b| b.is_ascii_digit()) => rest,
                    _ => id.as_str(),
                };
                let Some((head, tail)) = base.rsplit_once('-') else {
                    return false;
                };
                tail.len() == 8
                    && (head == external
                        || head.strip_prefix(external).is_some_and(|rest| {
                            rest.strip_prefix('-').is_some_and(|i| {
                                !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit())
                            })
                        }))
            })
            .collect()
    }
}
