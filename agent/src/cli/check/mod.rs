//! `inferscope check`: a preflight a user runs on a node before installing the agent (and the
//! `run` daemon logs once at start). One line per item, a verdict, and a non-zero exit code
//! when nothing could be traced.
mod facts;

use std::{fmt, path::PathBuf, process::ExitCode};

use clap::Args;
pub(super) use facts::{Options, gather};

use super::target::TargetArgs;
use crate::capture::SocketProbes;

#[derive(Args, Debug)]
pub(super) struct CheckArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The CUPTI shim's socket to look for (as `run --shim-socket` sets it).
    #[arg(long, env = "INFERSCOPE_SHIM_SOCKET", default_value = crate::capture::gpu::DEFAULT_SHIM_SOCKET)]
    pub shim_socket: PathBuf,
    /// Also list every eBPF program: loaded, refused (a fallback was taken) or unused on this
    /// kernel, and the instructions its verifier walked (kernels since 5.16 report it).
    #[arg(long)]
    pub programs: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Ok,
    /// Works, with something lost or at risk.
    Warn,
    /// Does not work.
    Fail,
    /// A fact, neither good nor bad.
    Info,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Info => "info",
        })
    }
}

/// One line of the report.
#[derive(Debug, Clone)]
pub(super) struct Item {
    pub status: Status,
    pub topic: &'static str,
    pub text: String,
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>4}  {:<11} {}", self.status, self.topic, self.text)
    }
}

/// Every item, and what the verdict rests on.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub items: Vec<Item>,
    /// The socket capture (eBPF programs, tracepoints) loaded.
    pub capture: bool,
    /// Engine processes found that the capture can follow.
    pub engines: usize,
    /// Scheduler uprobes can be attached on this node.
    pub uprobes: bool,
}

impl Report {
    pub(super) fn push(&mut self, status: Status, topic: &'static str, text: impl Into<String>) {
        self.items.push(Item {
            status,
            topic,
            text: text.into(),
        });
    }

    /// Something can be traced now.
    pub(super) fn traceable(&self) -> bool {
        self.capture && self.engines > 0
    }

    /// Logs every line and the verdict (the `run` daemon at start): warnings and failures at
    /// warn, the rest at info.
    pub(super) fn log(&self) {
        for item in self.items.iter().chain(std::iter::once(&self.verdict())) {
            match item.status {
                Status::Warn | Status::Fail => tracing::warn!("check: {item}"),
                Status::Ok | Status::Info => tracing::info!("check: {item}"),
            }
        }
    }

    pub(super) fn verdict(&self) -> Item {
        let (status, text) = if !self.capture {
            (
                Status::Fail,
                "nothing can be traced: the eBPF socket capture does not load (see `ebpf` above)"
                    .to_string(),
            )
        } else if self.engines == 0 {
            (
                Status::Fail,
                "nothing to trace: the capture works, but no engine serves on this node (start one, or name it with --pid, --port or --pattern)"
                    .to_string(),
            )
        } else if !self.uprobes {
            (
                Status::Warn,
                format!(
                    "{} engine process(es) traceable from their sockets; without uprobes no queue wait / prefill split from scheduler hooks",
                    self.engines
                ),
            )
        } else if self.items.iter().any(|i| i.status == Status::Warn) {
            (
                Status::Warn,
                format!(
                    "{} engine process(es) traceable; the warn lines above say what is lost",
                    self.engines
                ),
            )
        } else {
            (
                Status::Ok,
                format!(
                    "{} engine process(es) traceable with every feature",
                    self.engines
                ),
            )
        };
        Item {
            status,
            topic: "verdict",
            text,
        }
    }
}

pub(super) fn main(args: CheckArgs) -> ExitCode {
    let config = args.target.pipeline_config();
    let mut probes = SocketProbes::load(config.capture).map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        text
    });
    let report = gather(
        probes.as_mut().map_err(|e| e.clone()),
        &Options {
            selector: config.selector,
            capture: config.capture,
            token_hooks: config.token_hooks,
            shim_socket: Some(args.shim_socket),
            try_engine_hooks: true,
        },
    );
    println!("inferscope {} check", env!("CARGO_PKG_VERSION"));
    for item in &report.items {
        println!("{item}");
    }
    println!("{}", report.verdict());
    if args.programs
        && let Ok(probes) = &probes
    {
        for program in probes.programs() {
            let verified = match (program.verified, program.budget_share()) {
                (Some(n), Some(share)) => format!("{n:>9} ({share:.1}% of the verifier's budget)"),
                _ => format!("{:>9}", "-"),
            };
            println!(
                "  program {:<24} {:<8} {verified}",
                program.name, program.load
            );
        }
    }
    if report.traceable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
