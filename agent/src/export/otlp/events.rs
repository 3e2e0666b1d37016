//! Diagnosis events as OTLP log records (event name `inferscope.diagnosis`), for the backends
//! that alert on logs.
use std::time::SystemTime;

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    logs::{SdkLogger, SdkLoggerProvider},
};

use super::{OtlpConfig, OtlpError};
use crate::diagnose::Diagnosis;

pub(crate) struct DiagnosisEvents {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
}

impl DiagnosisEvents {
    /// Call inside the tokio runtime (the gRPC channel spawns onto it).
    pub(crate) fn new(config: &OtlpConfig, resource: Resource) -> Result<Self, OtlpError> {
        let mut builder = opentelemetry_otlp::LogExporter::builder()
            .with_tonic()
            .with_timeout(config.timeout);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        let exporter = builder
            .build()
            .map_err(|e| OtlpError::Build(e.to_string()))?;
        let provider = SdkLoggerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let logger = provider.logger("inferscope");
        Ok(Self { provider, logger })
    }

    /// `active`: the regression alarm is raised (else: it cleared).
    pub(crate) fn emit(&self, d: &Diagnosis, active: bool, report: &str) {
        let mut record = self.logger.create_log_record();
        record.set_event_name("inferscope.diagnosis");
        record.set_timestamp(SystemTime::now());
        record.set_observed_timestamp(SystemTime::now());
        if active {
            record.set_severity_number(Severity::Warn);
            record.set_severity_text("WARN");
        } else {
            record.set_severity_number(Severity::Info);
            record.set_severity_text("INFO");
        }
        record.set_body(AnyValue::from(report.to_string()));
        record.add_attribute("inferscope.diagnosis.active", active);
        record.add_attribute("inferscope.diagnosis.cause", d.cause.as_str());
        record.add_attribute(
            "inferscope.diagnosis.dominant_phase",
            serde_json::to_value(d.dominant_phase)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
        );
        record.add_attribute("inferscope.diagnosis.confidence", d.confidence);
        if let Some(v) = d.ttft_p99_ms.baseline {
            record.add_attribute("inferscope.diagnosis.ttft_p99_ms.baseline", v);
        }
        if let Some(v) = d.ttft_p99_ms.window {
            record.add_attribute("inferscope.diagnosis.ttft_p99_ms.window", v);
        }
        record.add_attribute(
            "inferscope.diagnosis.json",
            serde_json::to_string(d).unwrap_or_default(),
        );
        self.logger.emit(record);
    }

    pub(crate) fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}
