//! Wraps the OTLP span exporter to count what reached the backend and what failed, so the
//! agent's own metrics show exporter health (the SDK's queue drops are not observable).
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use opentelemetry_sdk::{
    error::OTelSdkResult,
    trace::{SpanData, SpanExporter},
};

#[derive(Debug, Default)]
pub(crate) struct ExportCounters {
    /// Spans handed to the SDK's bounded batch queue.
    pub submitted: AtomicU64,
    pub exported: AtomicU64,
    /// Spans in batches the backend refused or that timed out.
    pub failed: AtomicU64,
    /// Export requests sent (one per batch): spans per call says whether the exporter batches.
    pub calls: AtomicU64,
}

impl ExportCounters {
    /// Spans neither exported nor failed: waiting in the queue or dropped because it was full.
    pub(crate) fn unaccounted(&self) -> u64 {
        let submitted = self.submitted.load(Ordering::Relaxed);
        submitted
            .saturating_sub(self.exported.load(Ordering::Relaxed))
            .saturating_sub(self.failed.load(Ordering::Relaxed))
    }
}

#[derive(Debug)]
pub(super) struct CountingExporter<E> {
    inner: E,
    counters: Arc<ExportCounters>,
}

impl<E> CountingExporter<E> {
    pub(super) fn new(inner: E, counters: Arc<ExportCounters>) -> Self {
        Self { inner, counters }
    }
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let result = self.inner.export(batch).await;
        let counter = if result.is_ok() {
            &self.counters.exported
        } else {
            &self.counters.failed
        };
        counter.fetch_add(n, Ordering::Relaxed);
        result
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}
