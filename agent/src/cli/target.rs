//! Target selection flags shared by the commands that attach to engines.
use std::time::Duration;

use clap::Args;
use inferscope_decode::http::Limits;

use crate::{
    capture::{CaptureConfig, TargetSelector},
    pipeline::PipelineConfig,
};

#[derive(Args, Debug, Clone)]
pub(super) struct TargetArgs {
    /// Trace this process.
    #[arg(long, group = "target")]
    pub pid: Option<u32>,
    /// Trace the process listening on this TCP port.
    #[arg(long, group = "target")]
    pub port: Option<u16>,
    /// Trace every recognised engine that listens on TCP (the default).
    #[arg(long, group = "target")]
    pub auto: bool,
    /// With --auto, also trace processes whose command line or mapped libraries contain this.
    #[arg(long = "pattern", value_name = "TEXT")]
    pub patterns: Vec<String>,
    /// Payload bytes captured per syscall (at most 8192).
    #[arg(long, default_value_t = 4096)]
    pub capture_bytes: u32,
    /// Kernel ring buffer size in MiB (a power of two).
    #[arg(long, default_value_t = 16)]
    pub ring_buffer_mb: u32,
    /// Also hook per-token engine functions (llama.cpp's send_partial_response) for the
    /// engine's own first-token time; each generated token then costs the engine thread one
    /// uprobe trap (~10 us on the benchmark VM).
    #[arg(long)]
    pub token_hooks: bool,
    /// Do not attach the GPU launch probes (uprobes on the CUDA driver's and runtime's launch
    /// functions in engine processes that map libcuda).
    #[arg(long)]
    pub no_gpu_launches: bool,
    /// GPU launches per second one process may emit (per CPU) before the launch probes keep
    /// one in 16 and count the rest (0: no cap).
    #[arg(long, default_value_t = 20_000)]
    pub gpu_launch_cap: u32,
    /// Percent of a process's time its GPU launch probes may cost (at 5 us a launch) before
    /// they are paused for 30 s (0: never paused).
    #[arg(long, default_value_t = crate::pipeline::DEFAULT_LAUNCH_BUDGET_PCT)]
    pub gpu_launch_budget: f64,
    /// Capture every response write in full, instead of letting the kernel send recognised
    /// token events in batches of 8 bytes each (about 40x the ring bytes per streamed token;
    /// for comparisons and debugging).
    #[arg(long)]
    pub no_token_events: bool,
    /// Do not attach the TLS library probes (uprobes on OpenSSL's SSL_read/SSL_write in
    /// engine processes); HTTPS connections are then counted as tls_connections_undecoded.
    #[arg(long)]
    pub no_tls: bool,
}

impl TargetArgs {
    pub(super) fn selector(&self) -> TargetSelector {
        match (self.pid, self.port) {
            (Some(pid), _) => TargetSelector::Pid(pid),
            (None, Some(port)) => TargetSelector::Port(port),
            _ => TargetSelector::Auto {
                patterns: self.patterns.clone(),
            },
        }
    }

    pub(super) fn pipeline_config(&self) -> PipelineConfig {
        PipelineConfig {
            selector: self.selector(),
            capture: CaptureConfig {
                capture_bytes: self.capture_bytes,
                ring_buffer_bytes: self.ring_buffer_mb.saturating_mul(1024 * 1024),
                gpu_launch_cap: self.gpu_launch_cap,
            },
            limits: Limits::default(),
            discovery_interval: Duration::from_millis(500),
            token_hooks: self.token_hooks,
            gpu_launches: !self.no_gpu_launches,
            gpu_launch_budget_pct: self.gpu_launch_budget,
            token_events: !self.no_token_events,
            tls: !self.no_tls,
        }
    }
}
