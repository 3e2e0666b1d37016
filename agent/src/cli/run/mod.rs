//! `inferscope run`: the long-running agent the DaemonSet runs. It discovers engines, attaches,
//! correlates, and exports: OTLP traces and metrics, the Prometheus endpoint, the gRPC API.
mod config;
mod servers;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::Context as _;
pub(super) use config::RunArgs;
use config::{GrpcAddr, RunConfig};
use inferscope_decode::http::Limits;
use opentelemetry::{KeyValue, metrics::MeterProvider as _};
use tracing::{info, warn};

use super::shutdown;
use crate::{
    capture::{
        CaptureConfig, CaptureError, TargetSelector, metrics::ScrapeConfig,
        process::sockpath::Bound,
    },
    daemon::{
        Diagnosis, FanOut, GpuInputs, Outputs, Sampler, Standby,
        handover::{Drain, DrainStep, Gate, HandoverDir},
    },
    diagnose::{
        history::{History, HistoryLimits},
        watch::Watch,
    },
    export::{
        hub::{Hub, HubLimits},
        jsonl::JsonlWriter,
        metrics::Metrics,
        names,
        otlp::{DiagnosisEvents, ExportCounters, OtlpConfig, TraceExporter},
    },
    pipeline::{Pipeline, PipelineConfig, Sink as _},
};

pub(super) fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = RunConfig::resolve(args)?;
    shutdown::install();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("inferscope-io")
        .enable_all()
        .build()
        .context("starting the async runtime failed")?;

    let selector = match (config.pid, config.port) {
        (Some(pid), _) => TargetSelector::Pid(pid),
        (None, Some(port)) => TargetSelector::Port(port),
        _ => TargetSelector::Auto {
            patterns: config.patterns.clone(),
        },
    };
    let capture = CaptureConfig {
        capture_bytes: config.capture_bytes,
        ring_buffer_bytes: config.ring_buffer_mb.saturating_mul(1024 * 1024),
        gpu_launch_cap: config.gpu_launch_cap,
    };
    let pipeline = Pipeline::new(PipelineConfig {
        selector: selector.clone(),
        capture,
        limits: Limits::default(),
        discovery_interval: std::time::Duration::from_millis(500),
        token_hooks: config.token_hooks,
        gpu_launches: config.gpu_launches,
        gpu_launch_budget_pct: config.gpu_launch_budget_pct,
        token_events: true,
        tls: config.tls,
    });
    // A setting out of range is the configuration's fault, not a missing privilege.
    let mut pipeline = match pipeline {
        Err(CaptureError::Config(msg)) => {
            anyhow::bail!("the capture settings are not usable: {msg}")
        }
        other => other.with_context(|| {
            format!(
                "starting the socket probes failed (inferscope needs root, or {})",
                crate::capture::kernel::privileges::capabilities_needed()
            )
        })?,
    };

    // Pod identity: in a pod with NODE_NAME set, watch this node's pods (never blocks records).
    if let Some(kube) = crate::identity::kube::KubeConfig::from_env() {
        pipeline.use_pod_store(crate::identity::kube::start(kube, runtime.handle()));
    }

    if let Some(spec) = config.probes.clone() {
        pipeline
            .use_probe_spec(spec)
            .context("setting up the user-defined probes failed")?;
    }

    if let Some(interval) = config.engine_metrics_interval {
        pipeline
            .scrape_engine_metrics(ScrapeConfig {
                interval,
                timeout: (interval / 2).min(std::time::Duration::from_secs(2)),
                ..Default::default()
            })
            .context("starting the engine metrics scraper failed")?;
    }

    let otlp_on = OtlpConfig::enabled(&config.otlp_endpoint);
    let otlp = OtlpConfig {
        endpoint: config.otlp_endpoint.clone(),
        timeout: config.otlp_timeout,
        queue_spans: config.otlp_queue_spans,
        kernel_spans: config.kernel_spans,
        service_name: std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|s| !s.is_empty()),
        max_events_per_span: 1024,
        metrics_interval: std::time::Duration::from_secs(10),
    };
    let meter_provider = if otlp_on {
        let _runtime = runtime.enter();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("inferscope")
            .with_attribute(KeyValue::new("host.name", names::host_name()))
            .build();
        Some(otlp.meter_provider(resource)?)
    } else {
        info!("OTLP export is off: pass --otlp-endpoint or set OTEL_EXPORTER_OTLP_ENDPOINT");
        None
    };
    let metrics = Arc::new(Metrics::new(
        meter_provider.as_ref().map(|p| p.meter("inferscope")),
    ));
    let hub = Arc::new(Hub::new(HubLimits {
        recent_requests: config.recent_requests,
        ..Default::default()
    }));
    let export_counters = Arc::new(ExportCounters::default());
    let traces = otlp_on.then(|| {
        TraceExporter::new(
            otlp.clone(),
            runtime.handle().clone(),
            export_counters.clone(),
        )
    });
    let records = match &config.records {
        Some(path) => Some(
            JsonlWriter::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => None,
    };

    let history = config.diagnose.map(|_| {
        Arc::new(std::sync::Mutex::new(
            History::new(HistoryLimits::default()),
        ))
    });
    let diagnosis_events = match (&config.diagnose, otlp_on) {
        (Some(_), true) => {
            let _runtime = runtime.enter();
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name("inferscope")
                .with_attribute(KeyValue::new("host.name", names::host_name()))
                .build();
            Some(DiagnosisEvents::new(&otlp, resource)?)
        }
        _ => None,
    };
    // Another agent on this node (the old pod of a surge roll): run beside it, record from its
    // handover cut on, and take its sockets once it has exited (daemon::handover).
    let sockets: Vec<PathBuf> = [
        match &config.grpc {
            GrpcAddr::Unix(path) => Some(path.clone()),
            _ => None,
        },
        config.shim_socket.clone(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let handover_dir = sockets
        .first()
        .and_then(|p| p.parent())
        .filter(|d| !d.as_os_str().is_empty())
        .map(HandoverDir::new);
    let predecessor = sockets
        .iter()
        .find(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
        .cloned();
    let gate = match (&predecessor, &handover_dir) {
        (Some(socket), Some(dir)) => {
            dir.announce_successor().with_context(|| {
                format!(
                    "another agent serves {}, and this one cannot announce itself beside it",
                    socket.display()
                )
            })?;
            info!(
                socket = %socket.display(),
                "another agent runs on this node: running beside it until it exits (a rolling update); this one records the requests read from its handover on"
            );
            Gate::successor(dir.clone())
        }
        (None, dir) => {
            // Files left by agents that did not exit cleanly.
            if let Some(dir) = dir {
                dir.clear();
            }
            Gate::sole()
        }
        (Some(socket), None) => {
            anyhow::bail!("{} is in use by another agent", socket.display())
        }
    };
    let standby = gate.is_standby();
    let gpu = GpuInputs::start(
        config.shim_socket.as_deref().filter(|_| !standby),
        config.nvml_interval,
    )?;
    // The preflight `inferscope check` prints, logged once with the programs the agent runs.
    let preflight = super::check::gather(
        Ok(pipeline.probes_mut()),
        &super::check::Options {
            selector,
            capture,
            token_hooks: config.token_hooks,
            shim_socket: config.shim_socket.clone(),
            try_engine_hooks: false,
        },
    );
    preflight.log();
    let health = Arc::new(crate::export::health::Health::default());
    servers::start_prometheus(runtime.handle(), &config, metrics.clone(), health.clone())?;
    let grpc_socket: Arc<Mutex<Option<Bound>>> = Arc::default();
    let standby = if standby {
        let (handle, config, hub, history, bound, dir) = (
            runtime.handle().clone(),
            config.clone(),
            hub.clone(),
            history.clone(),
            grpc_socket.clone(),
            handover_dir.clone(),
        );
        Some(Standby {
            sockets: sockets.clone(),
            shim_socket: config.shim_socket.clone(),
            take_over: Box::new(move || {
                match servers::start_grpc(&handle, &config, hub, history) {
                    Ok(socket) => {
                        if let Ok(mut b) = bound.lock() {
                            *b = socket;
                        }
                    }
                    Err(e) => warn!("the gRPC API is off after the takeover: {e:#}"),
                }
                if let Some(dir) = dir {
                    dir.clear();
                }
            }),
            last_poll: None,
        })
    } else {
        let socket = servers::start_grpc(runtime.handle(), &config, hub.clone(), history.clone())?;
        if let Ok(mut b) = grpc_socket.lock() {
            *b = socket;
        }
        None
    };

    pipeline.use_kernel_feed(gpu.kernel_feed());
    let mut sink = FanOut::new(
        Outputs {
            hub,
            metrics,
            traces,
            export_counters,
            sampler: Sampler {
                ratio: config.sample_ratio,
                always_ttft_ms: config.always_sample_ttft_ms,
            },
            records,
        },
        gpu,
        config
            .diagnose
            .zip(history)
            .map(|(watch, history)| Diagnosis {
                watch: Watch::new(watch, inferscope_model::clock::monotonic_now_ns()),
                history,
                events: diagnosis_events,
                reported_cause: None,
            }),
    )
    .with_handover(gate, standby)
    .with_health(health);
    info!("running; stop with SIGINT or SIGTERM");
    let mut drain = Drain::new(handover_dir, config.drain_timeout, sink.gate());
    let deadline = config.duration.map(|d| Instant::now() + d);
    let result = pipeline.run_until(&mut sink, &mut |pipeline| {
        let stopping = shutdown::STOP.load(std::sync::atomic::Ordering::Relaxed)
            || deadline.is_some_and(|d| Instant::now() >= d);
        matches!(
            drain.step(stopping, |cut| pipeline.open_requests_read_before(cut)),
            DrainStep::Stop
        )
    });
    sink.finish();
    pipeline.log_counters();
    if let Some(path) = &config.counters {
        sink.on_counters(&pipeline.counters());
        crate::export::counters_file::write(path, sink.counters())
            .with_context(|| format!("writing the counters to {}", path.display()))?;
    }
    if let Some(provider) = meter_provider
        && let Err(e) = provider.shutdown()
    {
        warn!("flushing OTLP metrics at exit failed: {e}");
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    if let Some(socket) = grpc_socket.lock().ok().and_then(|mut b| b.take()) {
        socket.remove();
    }
    result.context("the capture loop failed")?;
    if sink.records_failed() > 0 {
        anyhow::bail!("some records could not be written");
    }
    Ok(())
}
