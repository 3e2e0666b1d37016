//! `inferscope diagnose`: why did P99 TTFT regress between two windows of a recording.
use std::{
    fs::File,
    io::BufReader,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context as _;
use clap::Args;
use inferscope::diagnose::{
    self, Cause, Inputs, ReadStats, Timeline, parse_window, read_jsonl, read_steps,
};
use tracing::warn;

/// Exit statuses, for scripts and alerting.
pub const EXIT_NO_REGRESSION: u8 = 0;
pub const EXIT_ERROR: u8 = 1;
pub const EXIT_REGRESSION: u8 = 3;
pub const EXIT_REGRESSION_UNEXPLAINED: u8 = 4;
pub const EXIT_NOT_ENOUGH_DATA: u8 = 5;

#[derive(Args, Debug)]
#[command(after_help = "\
Times: CLOCK_MONOTONIC nanoseconds (the records' *_mono_ns), RFC 3339 (2026-11-30T06:00:00Z),
+DURATION after the recording's first arrival, -DURATION before its end, or empty for the
recording's start/end (e.g. --baseline ..+5m --window -2m..). A bare duration is also accepted:
--window 5m is the recording's last 5 minutes, --baseline 30m the 30 minutes before the window.

Exit status: 0 no TTFT regression; 3 regression with a named cause; 4 regression that no
measured signal explains; 5 too few requests in a window to decide; 1 error (unreadable file,
bad window); 2 bad command line.")]
pub struct DiagnoseArgs {
    /// Request records from `inferscope record --out` (JSON Lines).
    #[arg(long)]
    pub records: PathBuf,
    /// Step records from `inferscope record --steps` (device speed, prefill steps).
    #[arg(long)]
    pub steps: Option<PathBuf>,
    /// Engine samples (JSON Lines: mono_ns, kv_cache_usage, requests_waiting, preemptions_total).
    #[arg(long, value_name = "FILE")]
    pub engine_metrics: Option<PathBuf>,
    /// Device samples (JSON Lines: mono_ns, device or uuid, outlier or outliers).
    #[arg(long, value_name = "FILE")]
    pub devices: Option<PathBuf>,
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

fn open(path: &Path) -> anyhow::Result<BufReader<File>> {
    File::open(path)
        .map(BufReader::new)
        .with_context(|| format!("cannot open {}", path.display()))
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

fn load(args: &DiagnoseArgs) -> anyhow::Result<Inputs> {
    let mut inputs = Inputs::default();
    let (requests, stats) = read_jsonl(open(&args.records)?)
        .with_context(|| format!("reading {}", args.records.display()))?;
    report_skips(&args.records, &stats);
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
    let inputs = load(&args)?;
    let timeline = Timeline::of(&inputs.requests).with_context(|| {
        format!(
            "{} holds no request records (is it the --out file of `inferscope record`?)",
            args.records.display()
        )
    })?;
    let (base, win) = timeline.windows(baseline, window)?;
    let d = diagnose::diagnose(&inputs, base, win);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", diagnose::render(&d));
    }
    Ok(
        if d.requests.baseline.min(d.requests.window)
            < diagnose::thresholds::MIN_REQUESTS_PER_WINDOW
        {
            EXIT_NOT_ENOUGH_DATA
        } else if !d.regression {
            EXIT_NO_REGRESSION
        } else if d.cause == Cause::None {
            EXIT_REGRESSION_UNEXPLAINED
        } else {
            EXIT_REGRESSION
        },
    )
}

/// Runs the command; the exit status carries the verdict (see the help text).
pub fn main(args: DiagnoseArgs) -> ExitCode {
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("inferscope: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
