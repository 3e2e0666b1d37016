//! `inferscope diagnose`: why did P99 TTFT regress between two windows of a recording.
use std::{
    fs::File,
    io::{BufReader, IsTerminal as _},
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context as _;
use clap::Args;
use tracing::warn;

use super::progress::{self, Progress};
use crate::diagnose::{self, Inputs, ReadStats, Timeline, parse_window, read_jsonl, read_steps};

/// Exit statuses, for scripts and alerting.
pub(super) const EXIT_NO_REGRESSION: u8 = 0;
pub(super) const EXIT_ERROR: u8 = 1;
pub(super) const EXIT_REGRESSION: u8 = 3;
pub(super) const EXIT_REGRESSION_UNEXPLAINED: u8 = 4;
pub(super) const EXIT_NOT_ENOUGH_DATA: u8 = 5;

#[derive(Args, Debug)]
#[command(after_help = "\
Times: CLOCK_MONOTONIC nanoseconds (the records' *_mono_ns), RFC 3339 (2026-11-30T06:00:00Z),
+DURATION after the recording's first arrival, -DURATION before its end, or empty for the
recording's start/end (e.g. --baseline ..+5m --window -2m..). A bare duration is also accepted:
--window 5m is the recording's last 5 minutes, --baseline 30m the 30 minutes before the window.

Exit status: 0 no profile regressed (TTFT, TPOT, ITL, E2E, success rate); 3 a regression whose
every branch named a cause; 4 a regression that no measured signal explains; 5 too few requests in a window to decide; 1 error (unreadable file,
bad window); 2 bad command line.")]
pub(super) struct DiagnoseArgs {
    /// Request records from `inferscope record --out` (JSON Lines). Without it, ask the running
    /// agent (`--connect`) about what it has seen.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Diagnose the whole fleet from the Prometheus that scrapes the agents (http://host:port):
    /// PromQL over their histograms and counters, the regressed profiles and the replica they
    /// sit on. Windows are wall-clock: RFC 3339, a bare duration (--window 5m: the last 5
    /// minutes), or -DURATION before now.
    #[arg(long, value_name = "URL", conflicts_with_all = ["records", "connect", "steps", "engine_metrics", "devices", "engine_config"])]
    pub prometheus: Option<String>,
    /// The running agent's gRPC address (without --records): unix:///path, http(s)://host:port.
    #[arg(long, env = "INFERSCOPE_CONNECT", conflicts_with_all = ["steps", "engine_metrics", "devices", "engine_config"])]
    pub connect: Option<String>,
    /// CA certificate (PEM) for an https:// agent address.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Step records from `inferscope record --steps` (device speed, prefill steps).
    #[arg(long)]
    pub steps: Option<PathBuf>,
    /// Engine samples (JSON Lines: mono_ns, kv_cache_usage, requests_waiting, preemptions_total).
    #[arg(long, value_name = "FILE")]
    pub engine_metrics: Option<PathBuf>,
    /// Device samples (JSON Lines: mono_ns, device or uuid, outlier or outliers).
    #[arg(long, value_name = "FILE")]
    pub devices: Option<PathBuf>,
    /// Engine config samples from `inferscope record --engines` (JSON Lines: mono_ns, pid,
    /// engine, settings): the scheduler settings each engine process was started with.
    #[arg(long, value_name = "FILE")]
    pub engine_config: Option<PathBuf>,
    /// The window that was fine: START..END or a duration.
    #[arg(long, value_name = "START..END", allow_hyphen_values = true)]
    pub baseline: String,
    /// The incident window: START..END or a duration.
    #[arg(long, value_name = "START..END", allow_hyphen_values = true)]
    pub window: String,
    /// Print the diagnosis as JSON instead of the report.
    #[arg(long)]
    pub json: bool,
}

/// The file, read with a progress line on stderr when it is large and stderr a terminal.
fn open(path: &Path) -> anyhow::Result<BufReader<Progress<File, std::io::Stderr>>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let sink = progress::wanted(std::io::stderr().is_terminal(), size).then(std::io::stderr);
    let label = format!("reading {}", path.display());
    Ok(BufReader::new(Progress::new(file, sink, label, size)))
}

fn report_skips(path: &Path, stats: &ReadStats) {
    let skipped = stats.invalid + stats.too_long + stats.dropped_over_limit;
    if skipped > 0 {
        warn!(
            file = %path.display(),
            invalid = stats.invalid,
            too_long = stats.too_long,
            over_limit = stats.dropped_over_limit,
            kept = stats.parsed,
            "skipped lines that are not records of this kind"
        );
    }
}

fn load(args: &DiagnoseArgs, records: &Path) -> anyhow::Result<Inputs> {
    let mut inputs = Inputs::default();
    let (requests, stats) =
        read_jsonl(open(records)?).with_context(|| format!("reading {}", records.display()))?;
    report_skips(records, &stats);
    inputs.requests = requests;
    if let Some(path) = &args.steps {
        let (steps, stats) =
            read_steps(open(path)?).with_context(|| format!("reading {}", path.display()))?;
        report_skips(path, &stats);
        inputs.steps = steps;
    }
    if let Some(path) = &args.engine_metrics {
        let (v, stats) =
            read_jsonl(open(path)?).with_context(|| format!("reading {}", path.display()))?;
        report_skips(path, &stats);
        inputs.engine = v;
    }
    if let Some(path) = &args.engine_config {
        let (v, stats) =
            read_jsonl(open(path)?).with_context(|| format!("reading {}", path.display()))?;
        report_skips(path, &stats);
        inputs.configs = v;
    }
    if let Some(path) = &args.devices {
        let (v, stats) =
            read_jsonl(open(path)?).with_context(|| format!("reading {}", path.display()))?;
        report_skips(path, &stats);
        inputs.devices = v;
    }
    Ok(inputs)
}

fn run(args: DiagnoseArgs) -> anyhow::Result<u8> {
    let baseline = parse_window(&args.baseline).context("--baseline")?;
    let window = parse_window(&args.window).context("--window")?;
    if let Some(url) = &args.prometheus {
        return run_fleet(&args, url, baseline, window);
    }
    let Some(records) = &args.records else {
        return run_live(&args);
    };
    let inputs = load(&args, records)?;
    let timeline = Timeline::of(&inputs.requests).with_context(|| {
        format!(
            "{} holds no request records (is it the --out file of `inferscope record`?)",
            records.display()
        )
    })?;
    let (base, win) = timeline.windows(baseline, window)?;
    let d = diagnose::diagnose(&inputs, base, win);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", diagnose::render(&d));
    }
    Ok(exit_status(
        d.requests.baseline.min(d.requests.window),
        d.any_regression,
        d.unexplained,
    ))
}

fn exit_status(fewest_requests: usize, regression: bool, unexplained: bool) -> u8 {
    if fewest_requests < inferscope_model::thresholds::MIN_REQUESTS_PER_WINDOW {
        EXIT_NOT_ENOUGH_DATA
    } else if !regression {
        EXIT_NO_REGRESSION
    } else if unexplained {
        EXIT_REGRESSION_UNEXPLAINED
    } else {
        EXIT_REGRESSION
    }
}

/// Asks Prometheus about every agent it scrapes. The windows are wall-clock times: the
/// "recording" is the 30 days up to now.
fn run_fleet(
    args: &DiagnoseArgs,
    url: &str,
    baseline: diagnose::window::WindowSpec,
    window: diagnose::window::WindowSpec,
) -> anyhow::Result<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the system clock is before 1970")?
        .as_nanos() as u64;
    let wall = Timeline {
        start_mono_ns: now.saturating_sub(30 * 24 * 3600 * 1_000_000_000),
        end_mono_ns: now,
        unix_minus_mono_ns: Some(0),
    };
    let (base, win) = wall.windows(baseline, window)?;
    let prometheus = super::prometheus_query::Prometheus::new(url)?;
    let d = diagnose::fleet::diagnose(&prometheus, base, win)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", diagnose::fleet::render(&d));
    }
    let regressed = d
        .profiles
        .iter()
        .any(|p| p.regressed || p.concentrated_on.is_some());
    let enough = d
        .requests
        .baseline
        .zip(d.requests.window)
        .map_or(0, |(b, w)| b.min(w) as usize);
    Ok(exit_status(
        enough,
        regressed,
        d.cause == diagnose::Cause::None,
    ))
}

/// Asks the running agent, which diagnoses what it has kept.
fn run_live(args: &DiagnoseArgs) -> anyhow::Result<u8> {
    let connect = super::client::ConnectArgs {
        connect: args
            .connect
            .clone()
            .unwrap_or_else(|| super::client::DEFAULT_CONNECT.to_string()),
        tls_ca: args.tls_ca.clone(),
    };
    let d = super::client::runtime()?.block_on(async {
        let mut client = connect.client().await?;
        client
            .diagnose(inferscope_proto::v1::agent::DiagnoseRequest {
                baseline: args.baseline.clone(),
                window: args.window.clone(),
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| anyhow::anyhow!("the agent could not diagnose: {}", s.message()))
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&d.json).context("the agent's diagnosis is not JSON")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}", d.report);
    }
    let count = |k: &str| json["requests"][k].as_u64().unwrap_or(0) as usize;
    Ok(exit_status(
        count("baseline").min(count("window")),
        json["any_regression"]
            .as_bool()
            .or(json["regression"].as_bool())
            .unwrap_or(false),
        json["unexplained"]
            .as_bool()
            .unwrap_or(json["cause"].as_str() == Some("none")),
    ))
}

/// Runs the command; the exit status carries the verdict (see the help text).
pub(super) fn main(args: DiagnoseArgs) -> ExitCode {
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("inferscope: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
