//! `inferscope record`: one JSON line per finished request.
use std::{
    io::IsTerminal,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Args;
use inferscope_model::{LaunchRecord, StepRecord, clock::monotonic_now_ns};
use tracing::info;

use super::{shutdown, target::TargetArgs};
use crate::{
    capture::{DiscoveryChange, elf::user_probes::ProbeSpec, metrics::ScrapeConfig},
    diagnose::EngineConfigSample,
    export::{counters_file, jsonl::JsonlWriter, live},
    join::{EngineMetricsRecord, RequestTimeline},
    pipeline::{Pipeline, Sink},
};

#[derive(Args, Debug)]
pub(super) struct RecordArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Stop after this long (e.g. 30s, 5m); without it, record until Ctrl-C.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Where to write the records (JSON Lines).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Also write one JSON line per engine step (needs an engine with scheduler hooks).
    #[arg(long)]
    pub steps: Option<PathBuf>,
    /// Also write one JSON line per GPU kernel or graph launch (launch uprobes on the CUDA
    /// driver and runtime of engine processes that map libcuda; host enqueue times).
    #[arg(long)]
    pub launches: Option<PathBuf>,
    /// Also scrape each engine's own metrics endpoint (KV cache use, running and waiting
    /// requests, preemptions, token counters) and write one JSON line per scrape.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// How often --metrics scrapes each engine (1s to 5s suits engines' own update rates).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub metrics_interval: Duration,
    /// Also write one JSON line per engine process attached: its scheduler settings from its
    /// command line (slots, batch and token budgets), for `diagnose --engine-config`.
    #[arg(long, value_name = "FILE")]
    pub engines: Option<PathBuf>,
    /// Probe spec (TOML) with user-defined scheduler probes for a native engine inferscope has
    /// no profile for (see docs/src/engines/user-probes.md).
    #[arg(long)]
    pub probes: Option<PathBuf>,
    /// At exit, write every counter of the agent (drops, truncations, losses, parse failures,
    /// kernel counters) to this file as one JSON object, `{"counters": {"name": value}}`.
    #[arg(long, value_name = "FILE")]
    pub counters: Option<PathBuf>,
}

struct RecordObserver {
    writer: JsonlWriter,
    steps: Option<JsonlWriter>,
    launches: Option<JsonlWriter>,
    metrics: Option<JsonlWriter>,
    engines: Option<JsonlWriter>,
    live: bool,
}

impl Sink for RecordObserver {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        if self.live {
            println!("{}", live::line(&timeline.request));
        }
        self.writer.write_or_report(&timeline.request, "a record");
    }

    fn on_step(&mut self, step: &StepRecord) {
        if let Some(w) = self.steps.as_mut() {
            w.write_or_report(step, "a step record");
        }
    }

    fn on_launch(&mut self, launch: &LaunchRecord) {
        if let Some(w) = self.launches.as_mut() {
            w.write_or_report(launch, "a launch record");
        }
    }

    fn on_engine_metrics(&mut self, record: &EngineMetricsRecord) {
        if let Some(w) = self.metrics.as_mut() {
            w.write_or_report(record, "an engine metrics record");
        }
    }

    fn on_discovery(&mut self, change: &DiscoveryChange) {
        for p in &change.added {
            info!(pid = p.tgid, engine = p.engine, ports = ?p.ports, "attached");
            let Some(w) = self.engines.as_mut() else {
                continue;
            };
            let sample = EngineConfigSample {
                mono_ns: monotonic_now_ns(),
                pid: p.tgid,
                engine: p.engine.to_owned(),
                settings: crate::engines::scheduler_config_of(p.tgid, p.engine),
            };
            w.write_or_report(&sample, "an engine config record");
        }
    }
}

pub(super) fn run(args: RecordArgs) -> anyhow::Result<()> {
    shutdown::install();
    let spec = match &args.probes {
        Some(path) => Some(ProbeSpec::load(path).context("the probe spec is not usable")?),
        None => None,
    };
    let mut pipeline = Pipeline::new(args.target.pipeline_config())
        .context("starting the socket probes failed")?;
    if let Some(spec) = spec {
        pipeline
            .use_probe_spec(spec)
            .context("setting up the user-defined probes failed")?;
    }
    if args.metrics.is_some() {
        anyhow::ensure!(
            args.metrics_interval >= Duration::from_millis(100),
            "--metrics-interval must be at least 100ms"
        );
        pipeline
            .scrape_engine_metrics(ScrapeConfig {
                interval: args.metrics_interval,
                // A scrape must not outlast its interval, nor wait long on a stuck engine.
                timeout: (args.metrics_interval / 2).min(Duration::from_secs(2)),
                ..ScrapeConfig::default()
            })
            .context("starting the metrics scraper thread failed")?;
    }
    let writer = JsonlWriter::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let steps = match &args.steps {
        Some(path) => Some(
            JsonlWriter::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => None,
    };
    let launches = match &args.launches {
        Some(path) => Some(
            JsonlWriter::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => None,
    };
    let metrics = match &args.metrics {
        Some(path) => Some(
            JsonlWriter::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => None,
    };
    let engines = match &args.engines {
        Some(path) => Some(
            JsonlWriter::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => None,
    };
    let live = std::io::stdout().is_terminal();
    if live {
        println!("{}", live::header());
    }
    let mut observer = RecordObserver {
        writer,
        steps,
        launches,
        metrics,
        engines,
        live,
    };
    info!(out = %args.out.display(), "recording");
    pipeline
        .run(
            &mut observer,
            &shutdown::STOP,
            args.duration.map(|d| Instant::now() + d),
        )
        .context("the capture loop failed")?;
    pipeline.log_counters();
    if let Some(path) = &args.counters {
        let mut counters = pipeline.counters();
        // As `run` exports it: JSONL lines dropped whole because their write failed.
        counters.push((
            inferscope_model::Counter::RecordsWriteFailed,
            observer.writer.failed,
        ));
        counters_file::write(path, &counters)
            .with_context(|| format!("writing the counters to {}", path.display()))?;
    }
    info!(records = observer.writer.written, "done");
    let other_failures = [
        &observer.steps,
        &observer.launches,
        &observer.metrics,
        &observer.engines,
    ]
    .into_iter()
    .flatten()
    .any(|w| w.failed > 0);
    if observer.writer.failed > 0 || other_failures {
        anyhow::bail!(
            "{} records could not be written to {} (each was dropped whole; the file holds only complete lines)",
            observer.writer.failed,
            args.out.display()
        );
    }
    Ok(())
}
