//! The incident suite: each scenario runs a real engine (llama.cpp with 2 slots, or vLLM's real
//! scheduler, through a [`Launcher`]) under the real agent (`inferscope record --out --steps --engines`, scheduler
//! hooks on), sends a baseline phase and then an incident phase of open-loop or closed-loop load,
//! and runs `inferscope diagnose` on what was recorded.
pub(crate) mod cgroup;
pub(crate) mod vllm;

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant, SystemTime},
};

use inferscope_integration_tests::{
    agent::{Recorder, binary, read_records},
    client::Client,
    engine::Engine,
    free_port,
};
use serde_json::Value;

/// Engine slots (n_parallel): concurrency above this queues.
pub(crate) const SLOTS: u32 = 2;

/// One phase of open-loop load: `requests` sent `every` apart, each on its own connection,
/// whatever the engine's pace (arrivals do not wait for earlier answers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phase {
    pub requests: usize,
    pub every: Duration,
    /// Words of filler text in each prompt (varied per request: the engine caches prefixes).
    pub prompt_words: usize,
    pub max_tokens: u32,
}

/// The baseline every scenario starts with: one short request every 800 ms, which two slots
/// serve without queueing (about 0.3 s each on an idle 2-core machine).
pub(crate) const BASELINE: Phase = Phase {
    requests: 12,
    every: Duration::from_millis(800),
    prompt_words: 6,
    max_tokens: 8,
};

const WORDS: &[&str] = &[
    "river", "owl", "glacier", "piano", "comet", "garden", "lantern", "harbor", "meadow", "canyon",
    "violin", "thunder", "maple", "desert", "orchard", "falcon", "copper", "willow", "beacon",
    "pebble", "saddle", "tunnel", "marble", "cactus",
];

/// A prompt that starts differently for every `seed`, so no two share a cached prefix.
pub(crate) fn prompt(seed: u64, words: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut text = format!("({seed}) Summarize in one sentence:");
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push(' ');
        text.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    text
}

/// When a phase sent its requests, in RFC 3339 (the clock `diagnose` maps onto the records').
pub(crate) struct Span {
    pub start: SystemTime,
    pub end: SystemTime,
}

impl Span {
    pub(crate) fn arg(&self) -> String {
        format!(
            "{}..{}",
            humantime::format_rfc3339_nanos(self.start),
            humantime::format_rfc3339_nanos(self.end)
        )
    }
}

/// Sends a phase to llama.cpp and waits for every answer; `seed0` keeps prompts distinct across
/// phases.
pub(crate) fn send(port: u16, phase: Phase, seed0: u64) -> Span {
    send_to(&LlamaCpp, port, phase, seed0)
}

/// Sends a phase to the engine `to` launched and waits for every answer.
pub(crate) fn send_to(to: &'static dyn Launcher, port: u16, phase: Phase, seed0: u64) -> Span {
    let start = SystemTime::now();
    let t0 = Instant::now();
    let mut clients = Vec::new();
    for i in 0..phase.requests {
        let at = t0 + phase.every * i as u32;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let seed = seed0 + i as u64;
        clients.push(thread::spawn(move || {
            to.ask(port, seed, phase.prompt_words, phase.max_tokens)
        }));
    }
    // The window closes one interval after the last send: every arrival of this phase is in it.
    let end = SystemTime::now() + phase.every.min(Duration::from_millis(200));
    for c in clients {
        c.join().expect("client thread");
    }
    Span { start, end }
}

/// One phase of closed-loop load: `clients` each send `requests_each` requests one after another,
/// waiting for each answer and then `think` before the next (chat UIs, agents, batch jobs). The
/// arrival rate can never outrun the service rate: more clients show as concurrency.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clients {
    pub clients: usize,
    pub requests_each: usize,
    pub think: Duration,
    pub prompt_words: usize,
    pub max_tokens: u32,
}

/// How a phase offers its load.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Load {
    Open(Phase),
    Closed(Clients),
    /// Open-loop chat requests whose clients give up (close the connection) when no byte came
    /// for `patience`, as users and gateways with timeouts do.
    Impatient {
        phase: Phase,
        patience: Duration,
    },
    /// Open-loop chat requests whose prompts open with `prefix_words` words before their own
    /// `phase.prompt_words`: one prefix shared by every request (`shared`: the engine's prefix
    /// cache serves it), or a prefix of the same length distinct per request.
    Prefixed {
        phase: Phase,
        prefix_words: usize,
        shared: bool,
    },
}

impl Load {
    pub(crate) fn requests(&self) -> usize {
        match self {
            Load::Open(p) => p.requests,
            Load::Closed(c) => c.clients * c.requests_each,
            Load::Impatient { phase, .. } | Load::Prefixed { phase, .. } => phase.requests,
        }
    }
}

/// Two clients, each asking again 50 ms after its answer: both slots busy, nobody waits.
pub(crate) const CLOSED_BASELINE: Clients = Clients {
    clients: 2,
    requests_each: 7,
    think: Duration::from_millis(50),
    prompt_words: 6,
    max_tokens: 8,
};

/// Sends a closed-loop phase; the window closes just after the last request was sent.
pub(crate) fn send_closed(to: &'static dyn Launcher, port: u16, c: Clients, seed0: u64) -> Span {
    let start = SystemTime::now();
    let workers: Vec<_> = (0..c.clients)
        .map(|k| {
            thread::spawn(move || {
                let mut last = SystemTime::now();
                for i in 0..c.requests_each {
                    let seed = seed0 + (k * c.requests_each + i) as u64;
                    last = SystemTime::now();
                    to.ask(port, seed, c.prompt_words, c.max_tokens);
                    if i + 1 < c.requests_each {
                        thread::sleep(c.think);
                    }
                }
                last
            })
        })
        .collect();
    let last = workers
        .into_iter()
        .map(|w| w.join().expect("client thread"))
        .max()
        .unwrap_or(start);
    Span {
        start,
        end: last + Duration::from_millis(20),
    }
}

fn send_load(to: &'static dyn Launcher, port: u16, load: Load, seed0: u64) -> Span {
    match load {
        Load::Open(p) => send_to(to, port, p, seed0),
        Load::Closed(c) => send_closed(to, port, c, seed0),
        Load::Impatient { phase, patience } => send_impatient(port, phase, patience, seed0),
        Load::Prefixed {
            phase,
            prefix_words,
            shared,
        } => send_prefixed(port, phase, prefix_words, shared, seed0),
    }
}

/// Sends an open-loop phase of OpenAI chat requests with a long prefix before each prompt (see
/// [`Load::Prefixed`]) and waits for every answer.
fn send_prefixed(port: u16, phase: Phase, prefix_words: usize, shared: bool, seed0: u64) -> Span {
    if shared {
        // A steady state's warm cache: every slot has computed the shared prefix once, before
        // the window opens (each llama.cpp slot keeps its own).
        let warm: Vec<_> = (0..u64::from(SLOTS))
            .map(|k| {
                let text = format!(
                    "{} {}",
                    prompt(900_000, prefix_words),
                    prompt(seed0 + 500 + k, phase.prompt_words)
                );
                thread::spawn(move || Client::connect(port).chat(&text, 2, None))
            })
            .collect();
        for w in warm {
            w.join().expect("warm-up client");
        }
        thread::sleep(Duration::from_millis(300));
    }
    let start = SystemTime::now();
    let t0 = Instant::now();
    let mut clients = Vec::new();
    for i in 0..phase.requests {
        let at = t0 + phase.every * i as u32;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let seed = seed0 + i as u64;
        // The same digits' count in both forms, so prompts tokenize to the same length.
        let prefix = prompt(if shared { 900_000 } else { 900_000 + seed }, prefix_words);
        let text = format!("{prefix} {}", prompt(seed, phase.prompt_words));
        clients.push(thread::spawn(move || {
            let s = Client::connect(port).chat(&text, phase.max_tokens, None);
            assert!(s.completed, "a request did not complete: {s:?}");
        }));
    }
    let end = SystemTime::now() + phase.every.min(Duration::from_millis(200));
    for c in clients {
        c.join().expect("client thread");
    }
    Span { start, end }
}

/// Sends an open-loop phase of OpenAI chat requests whose clients give up after `patience`
/// without a byte; returns when every client finished or gave up.
fn send_impatient(port: u16, phase: Phase, patience: Duration, seed0: u64) -> Span {
    let start = SystemTime::now();
    let t0 = Instant::now();
    let mut clients = Vec::new();
    for i in 0..phase.requests {
        let at = t0 + phase.every * i as u32;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let seed = seed0 + i as u64;
        clients.push(thread::spawn(move || {
            let mut c = Client::connect(port);
            c.set_read_timeout(patience);
            c.chat(&prompt(seed, phase.prompt_words), phase.max_tokens, None)
        }));
    }
    let end = SystemTime::now() + phase.every.min(Duration::from_millis(200));
    for c in clients {
        let s = c.join().expect("client thread");
        assert!(s.completed || s.timed_out, "{s:?}");
    }
    Span { start, end }
}

/// Engine settings in the engines' common terms; each launcher spells them with its own flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineSettings {
    /// Requests the engine runs at once (llama.cpp n_parallel, vLLM max_num_seqs).
    pub slots: u32,
    /// Tokens one step may carry (llama.cpp n_batch, vLLM max_num_batched_tokens); None: the
    /// engine's default.
    pub batch_tokens: Option<u32>,
    /// Tokens the KV cache holds (llama.cpp --ctx-size, vLLM blocks x block size); None: the
    /// launcher's default.
    pub kv_tokens: Option<u32>,
}

pub(crate) const DEFAULT_ENGINE: EngineSettings = EngineSettings {
    slots: SLOTS,
    batch_tokens: None,
    kv_tokens: None,
};

/// A running engine process, whatever launched it.
pub(crate) trait Running {
    fn pid(&self) -> u32;
}

impl Running for Engine {
    fn pid(&self) -> u32 {
        Engine::pid(self)
    }
}

/// Starts an engine with given settings and talks to it: the one place a scenario meets a
/// particular engine.
pub(crate) trait Launcher: Sync {
    fn name(&self) -> &'static str;
    fn start(&self, port: u16, settings: EngineSettings) -> Box<dyn Running>;
    /// Sends one streaming chat request of `words` words (distinct per `seed`) and reads it to
    /// the end; panics unless it completed.
    fn ask(&self, port: u16, seed: u64, words: usize, max_tokens: u32);
    /// A line the agent logs once the engine's scheduler is observed (None: the steps file
    /// shows it).
    fn scheduler_seen_line(&self) -> Option<&'static str> {
        None
    }
    /// Whether the engine serves Prometheus metrics (KV cache use) for `record --metrics`.
    fn serves_metrics(&self) -> bool {
        false
    }
    /// How long to let the machine settle once the agent attached (loading its probes costs
    /// CPU that a phase must not pay).
    fn settle(&self) -> Duration {
        Duration::from_millis(300)
    }
}

/// llama.cpp (xllamacpp) through tests/engine/llamacpp_server.py, with llama-server's flags.
pub(crate) struct LlamaCpp;

impl Launcher for LlamaCpp {
    fn name(&self) -> &'static str {
        "llamacpp"
    }

    fn start(&self, port: u16, settings: EngineSettings) -> Box<dyn Running> {
        let slots = settings.slots.to_string();
        let batch = settings.batch_tokens.map(|b| b.to_string());
        let ctx = settings.kv_tokens.map(|c| c.to_string());
        let mut flags = vec!["--parallel", slots.as_str()];
        if let Some(b) = batch.as_deref() {
            flags.extend(["--batch-size", b, "--ubatch-size", b]);
        }
        if let Some(c) = ctx.as_deref() {
            flags.extend(["--ctx-size", c]);
        }
        let engine = Engine::start_with(port, &flags);
        prioritize(engine.pid());
        Box::new(engine)
    }

    fn ask(&self, port: u16, seed: u64, words: usize, max_tokens: u32) {
        let s = Client::connect(port).chat(&prompt(seed, words), max_tokens, None);
        assert!(s.completed, "a request did not complete: {s:?}");
    }

    fn scheduler_seen_line(&self) -> Option<&'static str> {
        Some("scheduler hook attached")
    }
}

/// Something done to the engine between the phases (e.g. a CPU limit), undone when dropped.
pub(crate) type Between = Box<dyn FnOnce(u32) -> Option<cgroup::CpuLimit>>;

pub(crate) struct Scenario {
    pub name: &'static str,
    pub launcher: &'static dyn Launcher,
    pub engine: EngineSettings,
    pub baseline: Load,
    pub incident: Load,
    /// Restart the engine with these settings between the phases (same port).
    pub incident_engine: Option<EngineSettings>,
    pub between: Option<Between>,
}

impl Scenario {
    /// On llama.cpp with the default settings, open-loop baseline.
    pub(crate) fn new(name: &'static str, incident: Load) -> Scenario {
        Scenario {
            name,
            launcher: &LlamaCpp,
            engine: DEFAULT_ENGINE,
            baseline: Load::Open(BASELINE),
            incident,
            incident_engine: None,
            between: None,
        }
    }
}

pub(crate) struct Outcome {
    pub diagnosis: Value,
    pub report: String,
    pub exit_code: Option<i32>,
    pub dir: PathBuf,
}

/// Runs one open-loop scenario on llama.cpp: engine, agent, baseline phase, `between` (e.g.
/// throttle the engine), incident phase, then `inferscope diagnose` over the two phases.
pub(crate) fn run<B>(name: &'static str, incident: Phase, between: B) -> Outcome
where
    B: FnOnce(u32) -> Option<cgroup::CpuLimit> + 'static,
{
    let mut s = Scenario::new(name, Load::Open(incident));
    s.between = Some(Box::new(between));
    run_scenario(s)
}

pub(crate) fn run_scenario(s: Scenario) -> Outcome {
    // Baseline and incident windows are compared: another test's engine must not load one.
    let _machine = inferscope_integration_tests::exclusive();
    let name = s.name;
    let dir = inferscope_integration_tests::test_dir(&format!("incident-{name}"));
    let port = free_port();
    // The engine runs before the agent: the scheduler hooks attach to a live process.
    let mut engine = s.launcher.start(port, s.engine);
    let steps = dir.join("steps.jsonl");
    let engines = dir.join("engines.jsonl");
    let steps_arg = steps.to_string_lossy().into_owned();
    let engines_arg = engines.to_string_lossy().into_owned();
    let metrics = dir.join("metrics.jsonl");
    let metrics_arg = metrics.to_string_lossy().into_owned();
    let port_arg = port.to_string();
    let mut args = vec![
        "--port",
        &port_arg,
        "--steps",
        &steps_arg,
        "--engines",
        &engines_arg,
    ];
    if s.launcher.serves_metrics() {
        args.extend(["--metrics", &metrics_arg, "--metrics-interval", "250ms"]);
    }
    let mut recorder = Recorder::start(&dir, &args);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));
    thread::sleep(s.launcher.settle());
    // Warm-up outside both windows: the first request pays one-time costs.
    s.launcher.ask(port, 1, 4, 2);

    let baseline = send_load(s.launcher, port, s.baseline, 1_000);
    // A gap, so the two windows cannot overlap.
    thread::sleep(Duration::from_millis(300));
    if let Some(settings) = s.incident_engine {
        drop(engine);
        engine = s.launcher.start(port, settings);
        recorder.wait_attached(engine.pid(), Duration::from_secs(30));
        thread::sleep(s.launcher.settle());
        s.launcher.ask(port, 2, 4, 2);
        thread::sleep(Duration::from_millis(200));
    }
    let limit = s.between.and_then(|f| f(engine.pid()));
    let window = send_load(s.launcher, port, s.incident, 2_000);
    drop(limit);
    wait_records(&recorder.out, window.start, s.incident.requests());
    thread::sleep(Duration::from_millis(500));
    let log = recorder.log_text();
    let records_path = recorder.out.clone();
    let _ = recorder.stop();
    drop(engine);
    if let Some(line) = s.launcher.scheduler_seen_line() {
        assert!(log.contains(line), "{log}");
    }

    let diagnose = |json: bool| {
        let mut cmd = Command::new(binary());
        cmd.arg("diagnose")
            .arg("--records")
            .arg(&records_path)
            .arg("--steps")
            .arg(&steps)
            .arg("--engine-config")
            .arg(&engines)
            .arg("--baseline")
            .arg(baseline.arg())
            .arg("--window")
            .arg(window.arg());
        if s.launcher.serves_metrics() {
            cmd.arg("--engine-metrics").arg(&metrics);
        }
        if json {
            cmd.arg("--json");
        }
        cmd.output().expect("running inferscope diagnose")
    };
    let json_out = diagnose(true);
    let text_out = diagnose(false);
    let report = String::from_utf8_lossy(&text_out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&json_out.stderr).into_owned();
    let diagnosis: Value = serde_json::from_slice(&json_out.stdout)
        .unwrap_or_else(|e| panic!("diagnose --json printed no JSON ({e}): {stderr}"));
    assert_eq!(json_out.status.code(), text_out.status.code());
    std::fs::write(dir.join("report.txt"), &report).expect("saving the report");
    eprintln!("== {name} ({}) ==\n{report}", s.launcher.name());
    Outcome {
        diagnosis,
        report,
        exit_code: json_out.status.code(),
        dir,
    }
}

/// Waits (up to 10 s) until the agent wrote `n` POST records that arrived from `since` on: on
/// a loaded machine the last answers' records may trail the clients by more than a moment.
fn wait_records(out: &Path, since: SystemTime, n: usize) {
    let since_ns = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let got = read_records(out)
            .iter()
            .filter(|r| r["method"] == "POST" && r["arrival_unix_ns"].as_u64() >= Some(since_ns))
            .count();
        if got >= n {
            return;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Raises every engine thread's CPU priority (nice -10): on a machine shared with other work, a
/// burst of someone else's CPU use would otherwise stall the engine for a second and put a real
/// but unplanned TTFT regression into a phase. The cgroup limit of the degraded-device scenario
/// is an absolute quota, which priority does not lift.
fn prioritize(pid: u32) {
    let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(!tids.is_empty(), "no threads listed for engine pid {pid}");
    let status = Command::new("renice")
        .args(["-n", "-10", "-p"])
        .args(&tids)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("running renice (util-linux)");
    assert!(status.success(), "renice of the engine's threads failed");
}

/// The evidence line for `signal`, which must be there.
pub(crate) fn evidence<'a>(d: &'a Value, signal: &str) -> &'a Value {
    d["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["signal"] == signal)
        .unwrap_or_else(|| panic!("no {signal} in the evidence: {d:#}"))
}

/// Checks the run produced enough requests per window and saved its files.
pub(crate) fn check_recorded(o: &Outcome, baseline: usize, incident: usize) {
    let d = &o.diagnosis;
    assert_eq!(d["requests"]["baseline"], baseline, "{d:#}");
    assert_eq!(d["requests"]["window"], incident, "{d:#}");
    assert!(Path::new(&o.dir).join("steps.jsonl").exists());
}
