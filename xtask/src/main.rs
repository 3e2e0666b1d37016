//! inferscope's developer tasks, run as `cargo xtask TASK` (the alias is in .cargo/config.toml).
//! Tasks that need more than a shell line live here, in Rust, so that they build and are linted
//! with the rest of the workspace.

mod public_api;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "inferscope's developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Checks the public API of the library crates against the snapshots in xtask/public-api/
    /// (CI runs this); --bless rewrites the snapshots.
    PublicApi(public_api::Options),
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::PublicApi(options) => public_api::run(&options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The message with its causes, and no backtrace even where RUST_BACKTRACE is set (CI):
        // every failure here is a finding to act on, not a bug of the xtask.
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
