//! `inferscope run` configuration: flags, then `INFERSCOPE_*` environment variables (clap reads
//! both), then the TOML file given by `--config`, then defaults.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Deserialize;

pub(super) const DEFAULT_GRPC: &str = "unix:///run/inferscope/agent.sock";
pub(super) const DEFAULT_PROMETHEUS: &str = "0.0.0.0:9464";
pub(super) const DEFAULT_SHIM_SOCKET: &str = crate::capture::gpu::DEFAULT_SHIM_SOCKET;

fn interval_or_off(
    what: &str,
    value: Option<String>,
    default: Duration,
) -> anyhow::Result<Option<Duration>> {
    match value.as_deref() {
        Some("off") => Ok(None),
        Some(s) => humantime::parse_duration(s)
            .map(Some)
            .with_context(|| format!("bad {what} {s:?}: use e.g. 5s, or off")),
        None => Ok(Some(default)),
    }
}

#[derive(Args, Debug, Default)]
pub(crate) struct RunArgs {
    /// TOML file with any of the options below (kebab-case keys); flags and environment win.
    #[arg(long, env = "INFERSCOPE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Trace only this process.
    #[arg(long, env = "INFERSCOPE_PID", group = "target")]
    pub pid: Option<u32>,
    /// Trace only the process listening on this TCP port.
    #[arg(long, env = "INFERSCOPE_PORT", group = "target")]
    pub port: Option<u16>,
    /// Also trace processes whose command line or mapped libraries contain this (with auto
    /// discovery, the default).
    #[arg(long = "pattern", value_name = "TEXT")]
    pub patterns: Vec<String>,
    /// Payload bytes captured per syscall (at most 8192).
    #[arg(long, env = "INFERSCOPE_CAPTURE_BYTES")]
    pub capture_bytes: Option<u32>,
    /// Kernel ring buffer size in MiB (a power of two).
    #[arg(long, env = "INFERSCOPE_RING_BUFFER_MB")]
    pub ring_buffer_mb: Option<u32>,
    /// OTLP gRPC endpoint for traces and metrics (e.g. http://otel-collector:4317). Without it the
    /// standard OTEL_EXPORTER_OTLP_ENDPOINT applies; with neither, OTLP export is off.
    #[arg(long, env = "INFERSCOPE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Give up on one OTLP export after this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub otlp_timeout: Option<Duration>,
    /// Spans queued for export per engine process while the backend is slow or down.
    #[arg(long)]
    pub otlp_queue_spans: Option<usize>,
    /// Export one span per GPU kernel under the prefill and decode spans.
    #[arg(long)]
    pub kernel_spans: bool,
    /// Share of requests exported as traces (0..1); metrics always count every request.
    #[arg(long, env = "INFERSCOPE_SAMPLE_RATIO")]
    pub sample_ratio: Option<f64>,
    /// Always export requests whose TTFT is at least this, whatever the sample ratio.
    #[arg(long)]
    pub always_sample_ttft_ms: Option<f64>,
    /// Prometheus endpoint address (serves /metrics), or "off".
    #[arg(long, env = "INFERSCOPE_PROMETHEUS")]
    pub prometheus: Option<String>,
    /// gRPC API address: unix:///path, tcp://host:port, or "off".
    #[arg(long, env = "INFERSCOPE_GRPC")]
    pub grpc: Option<String>,
    /// TLS certificate and key (PEM) for a tcp:// gRPC address.
    #[arg(long, requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    #[arg(long, requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// Finished requests kept in memory for ListRequests/GetRequest (and `inspect`).
    #[arg(long)]
    pub recent_requests: Option<usize>,
    /// How often to scrape each engine's own /metrics (KV cache use, running and waiting
    /// requests), or "off".
    #[arg(long, env = "INFERSCOPE_ENGINE_METRICS_INTERVAL")]
    pub engine_metrics_interval: Option<String>,
    /// Unix socket where CUPTI shims in engine processes send kernel records, or "off".
    #[arg(long, env = "INFERSCOPE_SHIM_SOCKET")]
    pub shim_socket: Option<String>,
    /// How often to sample NVML (per-GPU utilisation, memory, clocks, power, GPM), or "off".
    #[arg(long, env = "INFERSCOPE_NVML_INTERVAL")]
    pub nvml_interval: Option<String>,
    /// How often the continuous diagnosis compares the last --diagnose-window with the
    /// --diagnose-baseline before it, or "off" (which also turns off `diagnose --connect`).
    #[arg(long, env = "INFERSCOPE_DIAGNOSE_INTERVAL")]
    pub diagnose_interval: Option<String>,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub diagnose_baseline: Option<Duration>,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub diagnose_window: Option<Duration>,
    /// Raise the alarm when P99 TTFT in the window reaches this multiple of the baseline's.
    #[arg(long)]
    pub diagnose_ratio: Option<f64>,
    /// Also write every finished request as a JSON line here.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// At exit, write every counter of the agent to this file as one JSON object,
    /// `{"counters": {"name": value}}` (the same counters as `inferscope_agent_events_total`).
    #[arg(long, value_name = "FILE")]
    pub counters: Option<PathBuf>,
    /// Stop after this long (default: until SIGINT/SIGTERM).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// On SIGTERM while a successor agent runs beside this one (a surge roll), keep recording
    /// the requests read before the handover until they end, up to this long (default 25s:
    /// within Kubernetes' default 30 s grace period).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// Probe spec (TOML) with user-defined scheduler probes for a native engine inferscope has
    /// no profile for (see docs/src/engines/user-probes.md).
    #[arg(long, env = "INFERSCOPE_PROBES")]
    pub probes: Option<PathBuf>,
    /// Also hook per-token engine functions (llama.cpp's send_partial_response) for the
    /// engine's own first-token time; each generated token then costs the engine thread one
    /// uprobe trap (~10 us on the benchmark VM).
    #[arg(long)]
    pub token_hooks: bool,
    /// Do not attach the GPU launch probes (uprobes on the CUDA driver's and runtime's launch
    /// functions in engine processes that map libcuda, and their workers).
    #[arg(long)]
    pub no_gpu_launches: bool,
    /// Do not attach the TLS library probes (uprobes on OpenSSL's SSL_read/SSL_write in
    /// engine processes); HTTPS connections are then counted as tls_connections_undecoded.
    #[arg(long)]
    pub no_tls: bool,
    /// GPU launches per second one process may emit (per CPU) before the launch probes keep
    /// one in 16 and count the rest (0: no cap; default 20000).
    #[arg(long, env = "INFERSCOPE_GPU_LAUNCH_CAP")]
    pub gpu_launch_cap: Option<u32>,
    /// Percent of a process's time its GPU launch probes may cost (at 5 us a launch) before
    /// they are paused for 30 s (0: never paused; default 2).
    #[arg(long, env = "INFERSCOPE_GPU_LAUNCH_BUDGET")]
    pub gpu_launch_budget: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(super) struct FileConfig {
    pub pid: Option<u32>,
    pub port: Option<u16>,
    #[serde(default)]
    pub patterns: Vec<String>,
    pub capture_bytes: Option<u32>,
    pub ring_buffer_mb: Option<u32>,
    pub otlp_endpoint: Option<String>,
    pub otlp_timeout: Option<String>,
    pub otlp_queue_spans: Option<usize>,
    pub kernel_spans: Option<bool>,
    pub sample_ratio: Option<f64>,
    pub always_sample_ttft_ms: Option<f64>,
    pub prometheus: Option<String>,
    pub grpc: Option<String>,
    pub grpc_tls_cert: Option<PathBuf>,
    pub grpc_tls_key: Option<PathBuf>,
    pub recent_requests: Option<usize>,
    pub engine_metrics_interval: Option<String>,
    pub shim_socket: Option<String>,
    pub nvml_interval: Option<String>,
    pub diagnose_interval: Option<String>,
    pub diagnose_baseline: Option<String>,
    pub diagnose_window: Option<String>,
    pub diagnose_ratio: Option<f64>,
    pub records: Option<PathBuf>,
    pub counters: Option<PathBuf>,
    /// User-defined probe spec (TOML).
    pub probes: Option<PathBuf>,
    pub token_hooks: Option<bool>,
    pub drain_timeout: Option<String>,
    pub gpu_launches: Option<bool>,
    pub tls: Option<bool>,
    pub gpu_launch_cap: Option<u32>,
    pub gpu_launch_budget: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum GrpcAddr {
    Off,
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl GrpcAddr {
    pub(super) fn parse(s: &str) -> anyhow::Result<Self> {
        if s == "off" {
            return Ok(Self::Off);
        }
        if let Some(path) = s.strip_prefix("unix://") {
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let addr = s.strip_prefix("tcp://").unwrap_or(s);
        addr.parse().map(Self::Tcp).with_context(|| {
            format!("bad gRPC address {s:?}: use unix:///path, tcp://host:port or off")
        })
    }
}

/// Everything `run` needs, resolved.
#[derive(Debug, Clone)]
pub(super) struct RunConfig {
    pub pid: Option<u32>,
    pub port: Option<u16>,
    pub patterns: Vec<String>,
    pub capture_bytes: u32,
    pub ring_buffer_mb: u32,
    pub otlp_endpoint: Option<String>,
    pub otlp_timeout: Duration,
    pub otlp_queue_spans: usize,
    pub kernel_spans: bool,
    pub sample_ratio: f64,
    pub always_sample_ttft_ms: Option<f64>,
    pub prometheus: Option<SocketAddr>,
    pub grpc: GrpcAddr,
    pub grpc_tls: Option<(PathBuf, PathBuf)>,
    pub recent_requests: usize,
    /// `None`: engine metrics scraping is off.
    pub engine_metrics_interval: Option<Duration>,
    /// `None`: the shim listener is off.
    pub shim_socket: Option<PathBuf>,
    /// `None`: NVML sampling is off.
    pub nvml_interval: Option<Duration>,
    /// `None`: the continuous diagnosis is off.
    pub diagnose: Option<crate::diagnose::watch::WatchConfig>,
    pub records: Option<PathBuf>,
    pub counters: Option<PathBuf>,
    pub duration: Option<Duration>,
    /// User-defined probes, checked at start-up.
    pub probes: Option<crate::capture::elf::user_probes::ProbeSpec>,
    pub token_hooks: bool,
    pub drain_timeout: Duration,
    /// The GPU launch probes (on unless the flag or the file turns them off).
    pub gpu_launches: bool,
    /// The TLS library probes (on unless the flag or the file turns them off).
    pub tls: bool,
    pub gpu_launch_cap: u32,
    pub gpu_launch_budget_pct: f64,
}

impl RunConfig {
    pub(super) fn resolve(args: RunArgs) -> anyhow::Result<Self> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the config file {}", path.display()))?;
                toml::from_str::<FileConfig>(&text).with_context(|| {
                    format!("{} is not a valid inferscope config", path.display())
                })?
            }
            None => FileConfig::default(),
        };
        let otlp_timeout = match (args.otlp_timeout, &file.otlp_timeout) {
            (Some(d), _) => d,
            (None, Some(s)) => humantime::parse_duration(s)
                .with_context(|| format!("bad otlp-timeout {s:?} in the config file"))?,
            (None, None) => Duration::from_secs(5),
        };
        let prometheus =
            match args
                .prometheus
                .or(file.prometheus)
                .unwrap_or_else(|| DEFAULT_PROMETHEUS.into())
                .as_str()
            {
                "off" => None,
                s => Some(s.parse().with_context(|| {
                    format!("bad Prometheus address {s:?}: use host:port or off")
                })?),
            };
        let grpc = GrpcAddr::parse(
            &args
                .grpc
                .or(file.grpc)
                .unwrap_or_else(|| DEFAULT_GRPC.into()),
        )?;
        let grpc_tls = match (
            args.grpc_tls_cert.or(file.grpc_tls_cert),
            args.grpc_tls_key.or(file.grpc_tls_key),
        ) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => bail!("a gRPC TLS certificate needs its key and the other way round"),
        };
        if grpc_tls.is_some() && !matches!(grpc, GrpcAddr::Tcp(_)) {
            bail!("gRPC TLS applies to a tcp:// address only");
        }
        let sample_ratio = args.sample_ratio.or(file.sample_ratio).unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sample_ratio) {
            bail!("the sample ratio must be between 0 and 1, got {sample_ratio}");
        }
        let engine_metrics_interval = interval_or_off(
            "engine metrics interval",
            args.engine_metrics_interval
                .or(file.engine_metrics_interval),
            Duration::from_secs(5),
        )?;
        let nvml_interval = interval_or_off(
            "NVML interval",
            args.nvml_interval.or(file.nvml_interval),
            Duration::from_secs(1),
        )?;
        let diagnose_interval = interval_or_off(
            "diagnose interval",
            args.diagnose_interval.or(file.diagnose_interval),
            Duration::from_secs(30),
        )?;
        let duration_or = |flag: Option<Duration>, file: Option<String>, what: &str, default| match (
            flag, file,
        ) {
            (Some(d), _) => Ok(d),
            (None, Some(s)) => humantime::parse_duration(&s)
                .with_context(|| format!("bad {what} {s:?} in the config file")),
            (None, None) => Ok(default),
        };
        let diagnose_baseline = duration_or(
            args.diagnose_baseline,
            file.diagnose_baseline,
            "diagnose-baseline",
            Duration::from_secs(30 * 60),
        )?;
        let diagnose_window = duration_or(
            args.diagnose_window,
            file.diagnose_window,
            "diagnose-window",
            Duration::from_secs(5 * 60),
        )?;
        let drain_timeout = duration_or(
            args.drain_timeout,
            file.drain_timeout,
            "drain-timeout",
            Duration::from_secs(25),
        )?;
        let diagnose_ratio = args.diagnose_ratio.or(file.diagnose_ratio).unwrap_or(1.5);
        if diagnose_ratio <= 1.0 {
            bail!("the diagnose ratio must be above 1, got {diagnose_ratio}");
        }
        let diagnose = diagnose_interval.map(|interval| crate::diagnose::watch::WatchConfig {
            baseline: diagnose_baseline,
            window: diagnose_window,
            interval,
            ratio: diagnose_ratio,
        });
        let shim_socket = match args.shim_socket.or(file.shim_socket).as_deref() {
            Some("off") => None,
            Some(path) => Some(PathBuf::from(path)),
            None => Some(PathBuf::from(DEFAULT_SHIM_SOCKET)),
        };
        let mut patterns = args.patterns;
        patterns.extend(file.patterns);
        Ok(Self {
            pid: args.pid.or(file.pid),
            port: args.port.or(file.port),
            patterns,
            capture_bytes: args.capture_bytes.or(file.capture_bytes).unwrap_or(4096),
            ring_buffer_mb: args.ring_buffer_mb.or(file.ring_buffer_mb).unwrap_or(16),
            otlp_endpoint: args.otlp_endpoint.or(file.otlp_endpoint),
            otlp_timeout,
            otlp_queue_spans: args
                .otlp_queue_spans
                .or(file.otlp_queue_spans)
                .unwrap_or(8192),
            kernel_spans: args.kernel_spans || file.kernel_spans.unwrap_or(false),
            sample_ratio,
            always_sample_ttft_ms: args.always_sample_ttft_ms.or(file.always_sample_ttft_ms),
            prometheus,
            grpc,
            grpc_tls,
            recent_requests: args
                .recent_requests
                .or(file.recent_requests)
                .unwrap_or(4096),
            engine_metrics_interval,
            shim_socket,
            nvml_interval,
            diagnose,
            records: args.records.or(file.records),
            counters: args.counters.or(file.counters),
            duration: args.duration,
            probes: match args.probes.or(file.probes) {
                Some(path) => Some(
                    crate::capture::elf::user_probes::ProbeSpec::load(&path)
                        .context("the probe spec is not usable")?,
                ),
                None => None,
            },
            token_hooks: args.token_hooks || file.token_hooks.unwrap_or(false),
            drain_timeout,
            gpu_launches: !args.no_gpu_launches && file.gpu_launches.unwrap_or(true),
            tls: !args.no_tls && file.tls.unwrap_or(true),
            gpu_launch_cap: args
                .gpu_launch_cap
                .or(file.gpu_launch_cap)
                .unwrap_or(crate::capture::CaptureConfig::default().gpu_launch_cap),
            gpu_launch_budget_pct: args
                .gpu_launch_budget
                .or(file.gpu_launch_budget)
                .unwrap_or(crate::pipeline::DEFAULT_LAUNCH_BUDGET_PCT),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_defaults_fill_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "otlp-endpoint = \"http://file:4317\"\nprometheus = \"off\"\nsample-ratio = 0.25\npatterns = [\"my-engine\"]\n",
        )
        .unwrap();
        let args = RunArgs {
            config: Some(path),
            otlp_endpoint: Some("http://flag:4317".into()),
            patterns: vec!["x".into()],
            ..Default::default()
        };
        let c = RunConfig::resolve(args).unwrap();
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://flag:4317"));
        assert_eq!(c.prometheus, None);
        assert_eq!(c.sample_ratio, 0.25);
        assert_eq!(c.patterns, ["x", "my-engine"]);
        assert_eq!(c.grpc, GrpcAddr::Unix("/run/inferscope/agent.sock".into()));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        // A misspelt key, on purpose.
        let misspelt = "otlp-endpiont = \"x\"\n"; // spellchecker:disable-line
        std::fs::write(&path, misspelt).unwrap();
        let err = RunConfig::resolve(RunArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("not a valid inferscope config"));
        assert!(GrpcAddr::parse("tcp://nonsense").is_err());
        assert_eq!(
            GrpcAddr::parse("tcp://127.0.0.1:50051").unwrap(),
            GrpcAddr::Tcp("127.0.0.1:50051".parse().unwrap())
        );
    }

    /// The ConfigMap shipped in deploy/ must stay a valid config for this version.
    #[test]
    fn the_deploy_configmap_is_a_valid_config() {
        let manifest = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/base/configmap.yaml"
        ))
        .unwrap();
        let block: String = manifest
            .lines()
            .skip_while(|l| !l.contains("inferscope.toml: |"))
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inferscope.toml");
        std::fs::write(&path, &block).unwrap();
        let c = RunConfig::resolve(RunArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.sample_ratio, 0.1);
        assert_eq!(c.prometheus, Some("0.0.0.0:9464".parse().unwrap()));
        assert!(c.otlp_endpoint.is_some());
    }

    #[test]
    fn probes_come_from_the_file_or_the_flag_and_are_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("probes.toml");
        std::fs::write(
            &spec,
            "[[probe]]\nobject = \"engine\"\nsymbol = \"step\"\nevent = \"step_begin\"\n",
        )
        .unwrap();
        let config = dir.path().join("inferscope.toml");
        std::fs::write(
            &config,
            format!("probes = {:?}\n", spec.display().to_string()),
        )
        .unwrap();
        let c = RunConfig::resolve(RunArgs {
            config: Some(config),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.probes.map(|p| p.probes.len()), Some(1));

        let bad = dir.path().join("bad.toml");
        std::fs::write(
            &bad,
            "[[probe]]\nobject = \"engine\"\nsymbol = \"f\"\nevent = \"admit\"\n",
        )
        .unwrap();
        let err = RunConfig::resolve(RunArgs {
            probes: Some(bad),
            ..Default::default()
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("no [probe.id]"), "{err:#}");
    }

    #[test]
    fn token_hooks_are_off_unless_the_flag_or_the_file_asks() {
        let off = RunConfig::resolve(RunArgs::default()).unwrap();
        assert!(!off.token_hooks);
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("inferscope.toml");
        std::fs::write(&config, "token-hooks = true\n").unwrap();
        let on = RunConfig::resolve(RunArgs {
            config: Some(config),
            ..Default::default()
        })
        .unwrap();
        assert!(on.token_hooks);
    }

    #[test]
    fn gpu_launch_probes_are_on_unless_the_flag_or_the_file_turns_them_off() {
        let on = RunConfig::resolve(RunArgs::default()).unwrap();
        assert!(on.gpu_launches);
        assert_eq!(on.gpu_launch_cap, 20_000);
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("inferscope.toml");
        std::fs::write(&config, "gpu-launches = false\ngpu-launch-cap = 500\n").unwrap();
        let off = RunConfig::resolve(RunArgs {
            config: Some(config.clone()),
            ..Default::default()
        })
        .unwrap();
        assert!(!off.gpu_launches);
        assert_eq!(off.gpu_launch_cap, 500);
        let flag = RunConfig::resolve(RunArgs {
            no_gpu_launches: true,
            gpu_launch_cap: Some(0),
            ..Default::default()
        })
        .unwrap();
        assert!(!flag.gpu_launches);
        assert_eq!(flag.gpu_launch_cap, 0);
    }

    #[test]
    fn tls_probes_are_on_unless_the_flag_or_the_file_turns_them_off() {
        assert!(RunConfig::resolve(RunArgs::default()).unwrap().tls);
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("inferscope.toml");
        std::fs::write(&config, "tls = false\n").unwrap();
        let off = RunConfig::resolve(RunArgs {
            config: Some(config),
            ..Default::default()
        })
        .unwrap();
        assert!(!off.tls);
        let flag = RunConfig::resolve(RunArgs {
            no_tls: true,
            ..Default::default()
        })
        .unwrap();
        assert!(!flag.tls);
    }
}
