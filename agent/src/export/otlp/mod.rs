//! OTLP export over gRPC (opentelemetry-otlp with tonic): traces from request timelines and
//! the agent's metrics. The endpoint comes from `--otlp-endpoint` or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` variables
//! (headers, timeout and compression variables are honoured by the exporter itself).
mod counting;
pub(crate) mod disagg;
pub(crate) mod events;
pub(crate) mod traces;

use std::time::Duration;

pub(crate) use counting::ExportCounters;
pub(crate) use events::DiagnosisEvents;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    metrics::{PeriodicReader, SdkMeterProvider},
};
pub(crate) use traces::TraceExporter;

#[derive(Debug, thiserror::Error)]
pub(crate) enum OtlpError {
    #[error(
        "building the OTLP exporter failed: {0}; check --otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT"
    )]
    Build(String),
    #[error("more than {0} engine processes: spans of further processes are not exported")]
    TooManyProcesses(usize),
}

#[derive(Debug, Clone)]
pub(crate) struct OtlpConfig {
    /// gRPC endpoint (e.g. http://collector:4317); `None` leaves it to the OTEL_* variables.
    pub endpoint: Option<String>,
    pub timeout: Duration,
    /// Spans waiting for export per engine process; beyond it spans are dropped (bounded memory
    /// while the backend is down).
    pub queue_spans: usize,
    /// Also export one span per GPU kernel.
    pub kernel_spans: bool,
    /// Overrides the service name (default: the engine's name), like OTEL_SERVICE_NAME.
    pub service_name: Option<String>,
    pub max_events_per_span: u32,
    pub metrics_interval: Duration,
}

impl OtlpConfig {
    /// OTLP is on when an endpoint is given by flag or by the standard variables.
    pub(crate) fn enabled(endpoint: &Option<String>) -> bool {
        endpoint.is_some()
            || [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
    }

    fn span_exporter(&self) -> Result<opentelemetry_otlp::SpanExporter, OtlpError> {
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_timeout(self.timeout);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        builder.build().map_err(|e| OtlpError::Build(e.to_string()))
    }

    /// The meter provider for the agent's metrics; call inside the tokio runtime.
    pub(crate) fn meter_provider(&self, resource: Resource) -> Result<SdkMeterProvider, OtlpError> {
        let mut builder = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_timeout(self.timeout);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        let exporter = builder
            .build()
            .map_err(|e| OtlpError::Build(e.to_string()))?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(self.metrics_interval)
            .build();
        Ok(SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource)
            .build())
    }
}
