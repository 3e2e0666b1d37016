//! Command-line interface: argument parsing and the subcommands.
mod demo;
mod diagnose;
mod record;
mod signals;
mod target;

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
    /// Start the bundled llama.cpp engine, send it a short load, and show what inferscope saw.
    Demo(demo::DemoArgs),
    /// Why P99 TTFT regressed between a baseline and an incident window of a recording.
    Diagnose(diagnose::DiagnoseArgs),
}

pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("INFERSCOPE_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(args) => record::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Diagnose(args) => return diagnose::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferscope: {e:#}");
            ExitCode::FAILURE
        }
    }
}
