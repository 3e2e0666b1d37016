//! `inferscope gpu`: listens on the CUPTI shim socket and prints what arrives as JSON lines —
//! `{"type":"kernel",...}` per kernel, `{"type":"memcpy",...}`, `{"type":"gpu",...}` per GPU every
//! NVML interval, `{"type":"shim",...}` when a shim connects and `{"type":"counters",...}` at exit.
use std::{
    io::Write,
    path::PathBuf,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::shutdown;
use crate::capture::gpu::{DEFAULT_SHIM_SOCKET, ListenerConfig, NvmlSampler, ShimListener};

#[derive(Args)]
pub(super) struct GpuArgs {
    /// Unix socket the shims connect to (the shim reads INFERSCOPE_SHIM_SOCKET).
    #[arg(long, env = "INFERSCOPE_SHIM_SOCKET", default_value = DEFAULT_SHIM_SOCKET)]
    pub socket: PathBuf,
    /// Let the socket's group connect too (mode 0660 instead of 0600).
    #[arg(long)]
    pub group_access: bool,
    /// How often to sample NVML.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub nvml_interval: Duration,
    /// Do not sample NVML.
    #[arg(long)]
    pub no_nvml: bool,
    /// Stop after this long (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Write the JSON lines here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub(super) fn run(args: GpuArgs) -> anyhow::Result<()> {
    shutdown::install();
    let mut cfg = ListenerConfig::new(&args.socket);
    cfg.mode = if args.group_access { 0o660 } else { 0o600 };
    let listener = ShimListener::bind(cfg).context("starting the shim listener")?;
    tracing::info!(
        "listening for CUPTI shims on {}; start the engine with CUDA_INJECTION64_PATH=<path to \
         libinferscope_cupti.so> INFERSCOPE_SHIM_SOCKET={}",
        args.socket.display(),
        args.socket.display()
    );
    let sampler = if args.no_nvml {
        None
    } else {
        match NvmlSampler::start(args.nvml_interval) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        }
    };
    let mut out: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::LineWriter::new(std::io::stdout())),
    };
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut kernels = Vec::new();
    let mut memcpys = Vec::new();
    let mut shims_seen = 0;
    let mut last_nvml = Instant::now();
    loop {
        let stopping =
            shutdown::STOP.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d);
        if stopping {
            // Give readers a moment to hand over what is already on the socket.
            std::thread::sleep(Duration::from_millis(100));
        }
        let shims = listener.shims();
        for s in shims.iter().skip(shims_seen) {
            let mut v = serde_json::to_value(s)?;
            v["type"] = json!("shim");
            writeln!(out, "{v}")?;
        }
        shims_seen = shims.len();
        listener.drain(&mut kernels);
        for k in kernels.drain(..) {
            let mut v = serde_json::to_value(&k)?;
            v["type"] = json!("kernel");
            writeln!(out, "{v}")?;
        }
        listener.drain_memcpys(&mut memcpys);
        for m in memcpys.drain(..) {
            let mut v = serde_json::to_value(&m)?;
            v["type"] = json!("memcpy");
            writeln!(out, "{v}")?;
        }
        if let Some(s) = &sampler
            && last_nvml.elapsed() >= args.nvml_interval
        {
            last_nvml = Instant::now();
            for g in s.latest() {
                let mut v = serde_json::to_value(&g)?;
                v["type"] = json!("gpu");
                writeln!(out, "{v}")?;
            }
        }
        out.flush()?;
        if stopping {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let counters: serde_json::Map<String, serde_json::Value> = listener
        .counters()
        .into_iter()
        .map(|(k, v)| (k.name().to_owned(), json!(v)))
        .collect();
    writeln!(out, "{}", json!({"type": "counters", "counters": counters}))?;
    out.flush()?;
    Ok(())
}
