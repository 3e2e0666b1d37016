//! Prometheus text exposition (format 0.0.4, and the OpenMetrics lines engines emit with it):
//! what engines serve at their metrics endpoint. The bytes come from another process, so the
//! parser is bounded (body size, line length, labels, samples), skips what it cannot read, and
//! counts every skipped line by reason instead of failing the whole scrape.
mod text;

pub use text::parse;

/// Bounds on one exposition.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes looked at; the rest is counted as truncated.
    pub max_bytes: usize,
    pub max_line_bytes: usize,
    pub max_labels: usize,
    /// Samples handed to the visitor; later ones are counted, not parsed.
    pub max_samples: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // vLLM with many LoRA adapters and histograms serves a few hundred KiB.
            max_bytes: 8 << 20,
            max_line_bytes: 64 << 10,
            max_labels: 64,
            max_samples: 100_000,
        }
    }
}

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// Label pairs in line order, values unescaped.
    pub labels: Vec<(&'a str, String)>,
    pub value: f64,
}

impl Sample<'_> {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What one parse saw and skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParseStats {
    pub samples: u64,
    /// Sample lines that are not valid exposition syntax (bad name, label, value).
    pub bad_lines: u64,
    /// Lines that are not UTF-8.
    pub not_utf8: u64,
    pub line_too_long: u64,
    pub too_many_labels: u64,
    /// Samples past `max_samples`.
    pub samples_dropped: u64,
    /// The body was longer than `max_bytes`.
    pub truncated: bool,
}

impl ParseStats {
    /// Lines skipped for any reason.
    pub fn skipped(&self) -> u64 {
        self.bad_lines
            + self.not_utf8
            + self.line_too_long
            + self.too_many_labels
            + self.samples_dropped
    }
}
