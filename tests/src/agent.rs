//! The real `inferscope` binary, run as a child process the way a user runs it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("INFERSCOPE_BIN") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for profile in ["release", "debug"] {
        let p = root.join("target").join(profile).join("inferscope");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "inferscope binary not built: run `cargo build --release -p inferscope` or set INFERSCOPE_BIN"
    );
}

pub struct Recorder {
    child: Child,
    pub out: PathBuf,
    pub log: PathBuf,
}

impl Recorder {
    /// `inferscope record <target args> --out DIR/records.jsonl --counters DIR/counters.json`,
    /// logs to DIR/agent.log.
    pub fn start(dir: &Path, target: &[&str]) -> Recorder {
        Self::start_with_env(dir, target, &[])
    }

    /// [`Recorder::start`] with extra environment variables.
    pub fn start_with_env(dir: &Path, target: &[&str], env: &[(&str, &str)]) -> Recorder {
        let out = dir.join("records.jsonl");
        let log = dir.join("agent.log");
        let child = Command::new(binary())
            .envs(env.iter().copied())
            .arg("record")
            .args(target)
            .arg("--out")
            .arg(&out)
            .arg("--counters")
            .arg(dir.join("counters.json"))
            .env("INFERSCOPE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("creating the agent log"))
            .spawn()
            .expect("starting inferscope");
        Recorder { child, out, log }
    }

    /// CPU seconds (user + system) the agent has used so far, from /proc (100 ticks a second).
    pub fn cpu_seconds(&self) -> f64 {
        let stat =
            fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (ticks(11) + ticks(12)) / 100.0
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's pid (to signal it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the agent reports it attached to `pid`.
    pub fn wait_attached(&mut self, pid: u32, timeout: Duration) {
        wait_attached(&mut self.child, &self.log, pid, timeout);
    }

    /// SIGINT, as a user's Ctrl-C; returns the records written.
    pub fn stop(self) -> Vec<Value> {
        self.stop_with("-INT")
    }

    /// Stops the agent with `signal` (a `kill` option such as "-TERM"); returns the records.
    pub fn stop_with(mut self, signal: &str) -> Vec<Value> {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success());
        let status = self.child.wait().expect("waiting for inferscope");
        assert!(
            status.success(),
            "inferscope failed ({status}):\n{}",
            self.log_text()
        );
        read_records(&self.out)
    }

    /// [`wait_records`] on this agent's records file.
    pub fn wait_records(
        &self,
        timeout: Duration,
        what: &str,
        done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        wait_records(&self.out, timeout, what, done)
    }

    /// Waits for `n` records of chat completions (the test engines' streams).
    pub fn wait_chat_records(&self, n: usize) -> Vec<Value> {
        self.wait_records(
            Duration::from_secs(30),
            &format!("{n} chat completions' records"),
            |records| {
                records
                    .iter()
                    .filter(|r| r["path"] == "/v1/chat/completions")
                    .count()
                    >= n
            },
        )
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The records in `path` once `done` holds for them (the agent writes each record as its request
/// ends); panics with the records seen so far after `timeout`.
pub fn wait_records(
    path: &Path,
    timeout: Duration,
    what: &str,
    mut done: impl FnMut(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        // Whole lines only: a record may be half written at the moment of reading.
        let text = fs::read_to_string(path).unwrap_or_default();
        let records: Vec<Value> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if done(&records) {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "waited {timeout:?} for {what} in {}: {records:#?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the agent's log at `log` holds `needle`; returns the log.
pub fn wait_log(log: &Path, needle: &str, timeout: Duration) -> String {
    let mut text = String::new();
    crate::wait_until(timeout, needle, || {
        text = fs::read_to_string(log).unwrap_or_default();
        text.contains(needle)
    });
    text
}

pub fn read_records(path: &Path) -> Vec<Value> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every record line is JSON"))
        .collect()
}

pub fn unsafe_sigint(pid: u32) {
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success());
}

/// The agent's counters as it wrote them at exit (`record --counters FILE`).
#[derive(Debug)]
pub struct Counters(std::collections::BTreeMap<String, u64>);

impl Counters {
    pub fn read(path: &Path) -> Counters {
        let text = fs::read_to_string(path).unwrap_or_else(|e| {
            panic!(
                "reading the agent's counters {}: {e} (did it exit cleanly?)",
                path.display()
            )
        });
        let v: Value = serde_json::from_str(&text).expect("the counters file is JSON");
        let map = v["counters"]
            .as_object()
            .expect("a counters object")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().expect("a counter is a number")))
            .collect();
        Counters(map)
    }

    /// No counters (a run without the agent).
    pub fn empty() -> Counters {
        Counters(std::collections::BTreeMap::new())
    }

    /// The counters file [`Recorder::start`] asks for, beside the agent's log `log`.
    pub fn beside(log: &Path) -> Counters {
        Counters::read(&log.with_file_name("counters.json"))
    }

    /// A counter's value; a name the agent does not have fails the test (no silent 0).
    pub fn get(&self, name: &str) -> u64 {
        match self.0.get(name) {
            Some(v) => *v,
            None => panic!(
                "the agent has no counter {name:?}; it has: {:?}",
                self.0.keys()
            ),
        }
    }
}

/// Waits until the agent `child`, logging to `log`, reports it attached to `pid`; panics with its
/// log if it exits first or the time runs out.
pub fn wait_attached(child: &mut Child, log: &Path, pid: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    // The agent's own line, logged once every probe for the process is in place (not a
    // "scheduler hook attached pid=…" line, which comes before the others are).
    let needle = format!(": attached pid={pid} ");
    let text = || fs::read_to_string(log).unwrap_or_default();
    while Instant::now() < deadline {
        if text().contains(&needle) {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("inferscope exited early ({status}):\n{}", text());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "inferscope did not attach to pid {pid} in {timeout:?}:\n{}",
        text()
    );
}
