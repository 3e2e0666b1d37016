//! The incident suite: each scenario runs the real engine (llama.cpp, 2 slots) under the real
//! agent (`inferscope record --out --steps`, scheduler hooks on), sends a baseline phase and then
//! an incident phase of open-loop load, and runs `inferscope diagnose` on what was recorded.
pub mod cgroup;

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant, SystemTime},
};

use inferscope_integration_tests::{
    agent::{Recorder, binary},
    client::Client,
    engine::Engine,
    free_port,
};
use serde_json::Value;

/// Engine slots (n_parallel): concurrency above this queues.
pub const SLOTS: u32 = 2;

/// One phase of open-loop load: `requests` sent `every` apart, each on its own connection,
/// whatever the engine's pace (arrivals do not wait for earlier answers).
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    pub requests: usize,
    pub every: Duration,
    /// Words of filler text in each prompt (varied per request: the engine caches prefixes).
    pub prompt_words: usize,
    pub max_tokens: u32,
}

/// The baseline every scenario starts with: one short request every 800 ms, which two slots
/// serve without queueing (about 0.3 s each on an idle 2-core machine).
pub const BASELINE: Phase = Phase {
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
pub fn prompt(seed: u64, words: usize) -> String {
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
pub struct Span {
    pub start: SystemTime,
    pub end: SystemTime,
}

impl Span {
    pub fn arg(&self) -> String {
        format!(
            "{}..{}",
            humantime::format_rfc3339_nanos(self.start),
            humantime::format_rfc3339_nanos(self.end)
        )
    }
}

/// Sends a phase and waits for every answer; `seed0` keeps prompts distinct across phases.
pub fn send(port: u16, phase: Phase, seed0: u64) -> Span {
    let start = SystemTime::now();
    let t0 = Instant::now();
    let mut clients = Vec::new();
    for i in 0..phase.requests {
        let at = t0 + phase.every * i as u32;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let text = prompt(seed0 + i as u64, phase.prompt_words);
        clients.push(thread::spawn(move || {
            Client::connect(port).chat(&text, phase.max_tokens, None)
        }));
    }
    // The window closes one interval after the last send: every arrival of this phase is in it.
    let end = SystemTime::now() + phase.every.min(Duration::from_millis(200));
    for c in clients {
        let s = c.join().expect("client thread");
        assert!(s.completed, "a request did not complete: {s:?}");
    }
    Span { start, end }
}

pub struct Outcome {
    pub diagnosis: Value,
    pub report: String,
    pub exit_code: Option<i32>,
    pub dir: PathBuf,
}

/// Runs one scenario: engine, agent, baseline phase, `between` (e.g. throttle the engine),
/// incident phase, `after`, then `inferscope diagnose` over the two phases.
pub fn run<B>(name: &str, incident: Phase, between: B) -> Outcome
where
    B: FnOnce(&Engine) -> Option<cgroup::CpuLimit>,
{
    let dir =
        std::env::temp_dir().join(format!("inferscope-incident-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let port = free_port();
    // The engine runs before the agent: the scheduler hooks attach to a live process.
    let engine = Engine::start(port, SLOTS);
    prioritize(engine.pid());
    let steps = dir.join("steps.jsonl");
    let steps_arg = steps.to_string_lossy().into_owned();
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string(), "--steps", &steps_arg]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));
    thread::sleep(Duration::from_millis(300));
    // Warm-up outside both windows: the first request pays one-time costs.
    let _ = Client::connect(port).chat(&prompt(1, 4), 2, None);

    let baseline = send(port, BASELINE, 1_000);
    // A gap, so the two windows cannot overlap.
    thread::sleep(Duration::from_millis(300));
    let limit = between(&engine);
    let window = send(port, incident, 2_000);
    drop(limit);
    thread::sleep(Duration::from_millis(500));
    let log = recorder.log_text();
    let records_path = recorder.out.clone();
    let _ = recorder.stop();
    drop(engine);
    assert!(log.contains("scheduler hook attached"), "{log}");

    let diagnose = |json: bool| {
        let mut cmd = Command::new(binary());
        cmd.arg("diagnose")
            .arg("--records")
            .arg(&records_path)
            .arg("--steps")
            .arg(&steps)
            .arg("--baseline")
            .arg(baseline.arg())
            .arg("--window")
            .arg(window.arg());
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
    eprintln!("== {name} ==\n{report}");
    Outcome {
        diagnosis,
        report,
        exit_code: json_out.status.code(),
        dir,
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
pub fn evidence<'a>(d: &'a Value, signal: &str) -> &'a Value {
    d["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["signal"] == signal)
        .unwrap_or_else(|| panic!("no {signal} in the evidence: {d:#}"))
}

/// Checks the run produced enough requests per window and saved its files.
pub fn check_recorded(o: &Outcome, baseline: usize, incident: usize) {
    let d = &o.diagnosis;
    assert_eq!(d["requests"]["baseline"], baseline, "{d:#}");
    assert_eq!(d["requests"]["window"], incident, "{d:#}");
    assert!(Path::new(&o.dir).join("steps.jsonl").exists());
}
