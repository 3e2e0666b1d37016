//! A real OTLP receiver: rotel (PyPI `rotel`, an OpenTelemetry collector in Rust) with its debug
//! exporter, which prints every span it receives; the tests read the spans back from its log.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub struct Rotel {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

#[derive(Debug, Clone, Default)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub parent_id: String,
    pub id: String,
    pub name: String,
    pub kind: String,
    pub attributes: BTreeMap<String, String>,
    pub resource: BTreeMap<String, String>,
    pub events: usize,
}

fn rotel_binary() -> PathBuf {
    let python = crate::engine::python();
    let venv = python
        .parent()
        .and_then(Path::parent)
        .expect("the venv python is VENV/bin/python3");
    let lib = venv.join("lib");
    for entry in fs::read_dir(&lib)
        .expect("reading the venv's lib")
        .flatten()
    {
        let candidate = entry.path().join("site-packages/rotel/rotel-agent");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "rotel is not installed in {} (run scripts/setup.sh)",
        venv.display()
    );
}

impl Rotel {
    pub fn start(dir: &Path, port: u16) -> Rotel {
        Self::start_logging(dir, port, &["traces"])
    }

    /// `what`: the signals rotel prints ("traces", "metrics", "logs").
    pub fn start_logging(dir: &Path, port: u16, what: &[&str]) -> Rotel {
        let log = dir.join(format!("rotel-{port}.log"));
        let http_port = crate::free_port();
        let child = Command::new(rotel_binary())
            .args(["start", "--otlp-grpc-endpoint"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--otlp-http-endpoint")
            .arg(format!("127.0.0.1:{http_port}"))
            .args([
                "--exporter",
                "blackhole",
                "--debug-log-verbosity",
                "detailed",
            ])
            .args(what.iter().flat_map(|w| ["--debug-log", w]))
            .stdout(fs::File::create(&log).expect("creating the rotel log"))
            .stderr(Stdio::null())
            .spawn()
            .expect("starting rotel-agent");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "rotel did not listen on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Rotel { child, port, log }
    }

    /// Everything rotel printed (log records included).
    pub fn text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        parse_spans(&fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Waits until `done` holds for the spans received so far.
    pub fn wait_for(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() >= deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Rotel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `     -> key: Type(value)` → (key, value).
fn attribute(line: &str) -> Option<(String, String)> {
    let rest = line.trim_start().strip_prefix("-> ")?;
    let (key, value) = rest.split_once(": ")?;
    let value = value
        .split_once('(')
        .map(|(_, v)| v.strip_suffix(')').unwrap_or(v))
        .unwrap_or(value);
    Some((key.to_string(), value.to_string()))
}

pub fn parse_spans(log: &str) -> Vec<ReceivedSpan> {
    let mut spans = Vec::new();
    let mut resource = BTreeMap::new();
    let mut in_resource = false;
    let mut in_events = false;
    let mut current: Option<ReceivedSpan> = None;
    for line in log.lines() {
        if line.starts_with("ResourceSpans #") {
            spans.extend(current.take());
            resource = BTreeMap::new();
            in_resource = true;
            continue;
        }
        if line.starts_with("ScopeSpans #") {
            in_resource = false;
            continue;
        }
        if line.starts_with("Span #") {
            spans.extend(current.take());
            current = Some(ReceivedSpan {
                resource: resource.clone(),
                ..Default::default()
            });
            in_events = false;
            continue;
        }
        if in_resource {
            if let Some((k, v)) = attribute(line) {
                resource.insert(k, v);
            }
            continue;
        }
        let Some(span) = current.as_mut() else {
            continue;
        };
        let field = |name: &str| {
            line.trim_start()
                .strip_prefix(name)
                .and_then(|r| r.trim_start().strip_prefix(": "))
                .map(str::to_string)
        };
        if line.starts_with("Events:") {
            in_events = true;
        } else if line.starts_with("SpanEvent #") {
            span.events += 1;
        } else if let Some(v) = field("Trace ID") {
            span.trace_id = v;
        } else if let Some(v) = field("Parent ID") {
            span.parent_id = v;
        } else if let Some(v) = field("ID") {
            span.id = v;
        } else if let Some(v) = field("Name") {
            span.name = v;
        } else if let Some(v) = field("Kind") {
            span.kind = v;
        } else if !in_events && let Some((k, v)) = attribute(line) {
            span.attributes.insert(k, v);
        }
    }
    spans.extend(current);
    spans
}
