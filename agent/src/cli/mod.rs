//! Command-line interface: argument parsing and the subcommands.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
mod check;
mod client;
mod demo;
mod diagnose;
mod export_cmd;
mod gpu;
mod inspect;
mod install_shim;
mod progress;
mod prometheus_query;
mod record;
mod run;
mod shutdown;
mod target;
mod top;

use std::{io::IsTerminal, process::ExitCode};

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "inferscope",
    version,
    about = "Per-request TTFT, inter-token latency and more from LLM inference servers, with zero code changes",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Record one JSON object per finished request from a running engine.
    Record(record::RecordArgs),
    /// Run the agent: discover engines, attach, export OTLP, Prometheus and the gRPC API.
    Run(Box<run::RunArgs>),
    /// Live view of a running agent: requests, P50/P99 TTFT, queue wait, prefill, TPOT, GPUs.
    Top(top::TopArgs),
    /// Draw one request's timeline (queue, prefill steps and kernels, decode) from a running agent.
    Inspect(inspect::InspectArgs),
    /// Export recent requests from a running agent (Perfetto/Chrome trace JSON).
    Export(export_cmd::ExportArgs),
    /// Start the bundled llama.cpp engine, send it a short load, and show what inferscope saw.
    Demo(demo::DemoArgs),
    /// Receive kernel records from the CUPTI shim (and sample NVML); print them as JSON lines.
    Gpu(gpu::GpuArgs),
    /// Why P99 TTFT regressed between a baseline and an incident window of a recording.
    Diagnose(diagnose::DiagnoseArgs),
    /// Preflight: what inferscope can trace on this node, and what is missing (exit 1: nothing).
    Check(check::CheckArgs),
    /// Copy the CUPTI shim onto a host path shared with GPU pods (the DaemonSet's init container).
    InstallShim(install_shim::InstallShimArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints a table on the terminal: its logs stay at warn unless asked for
    // (INFERSCOPE_LOG, RUST_LOG or `demo -v`); the daemon commands log at info.
    let default_level = match &cli.command {
        Command::Demo(args) if !args.verbose => "warn",
        // Its report says everything; the attach attempts' own log lines would repeat it.
        Command::Check(_) => "error",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("INFERSCOPE_LOG")
                .or_else(|_| EnvFilter::try_from_default_env())
                .unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        Command::Record(args) => record::run(args),
        Command::Run(args) => run::run(*args),
        Command::Top(args) => top::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Export(args) => export_cmd::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Gpu(args) => gpu::run(args),
        Command::InstallShim(args) => install_shim::run(args),
        Command::Diagnose(args) => return diagnose::main(args),
        Command::Check(args) => return check::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferscope: {e:#}");
            ExitCode::FAILURE
        }
    }
}
