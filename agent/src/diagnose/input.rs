//! What the diagnosis reads: small, source-neutral samples. Request and step samples come from
//! the correlate stage's records (live) or from `inferscope record --out/--steps` files; engine
//! samples (KV usage, queue, preemptions) and device samples (outlier flags) are optional and come
//! from whatever source has them (an engine's /metrics, NVML).
use std::io::BufRead;

use inferscope_model::{RequestRecord, StepRecord};
use serde::Deserialize;

/// One finished request (the fields of a [`RequestRecord`] the diagnosis uses).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RequestSample {
    /// The agent's id (names preempted requests in the evidence).
    pub request_id: String,
    /// The engine process that served it (joins to its [`EngineConfigSample`]).
    pub pid: u32,
    pub method: String,
    pub arrival_mono_ns: u64,
    /// Wall clock at arrival (0 when unknown): maps RFC 3339 times onto the monotonic clock.
    pub arrival_unix_ns: u64,
    pub admitted_mono_ns: Option<u64>,
    pub end_mono_ns: u64,
    pub ttft_ms: Option<f64>,
    pub queue_wait_ms: Option<f64>,
    pub prefill_ms: Option<f64>,
    pub prefill_steps: Option<u64>,
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens its engine served from the prefix cache, where the engine says.
    pub cached_tokens: Option<u64>,
    pub prompt_bytes: Option<u64>,
    pub preemptions: Option<u64>,
    /// The first token on the wire: with the admission, bounds the steps a request prefilled in
    /// where the engine reports no per-request step count (vLLM's IPC shows a request in a step
    /// only once it produced a token, not in the chunked-prefill steps before).
    pub first_token_mono_ns: Option<u64>,
    /// The decode leg of a disaggregated request: its wait for the prefill server's KV cache.
    pub disagg: Option<DisaggSample>,
    /// The client connection that carried it, unique per engine process (0: unknown, as in
    /// records written without it): the clients of a closed loop that keep their connections.
    pub connection_id: u64,
    /// The profiles besides TTFT: time per output token, the request's worst gap between
    /// tokens, arrival to end.
    pub tpot_ms: Option<f64>,
    pub itl_max_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    pub last_token_mono_ns: Option<u64>,
    /// How it ended, for the success rate: the HTTP status, who ended it (`complete`,
    /// `client`, `server`, `unknown`), why the agent could not follow it, the gRPC status.
    pub status: Option<u16>,
    pub ended_by: String,
    pub incomplete: Option<String>,
    pub http2: Option<Http2Sample>,
}

/// What the diagnosis reads of a record's `http2` view.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Http2Sample {
    pub grpc_status: Option<u32>,
}

impl RequestSample {
    /// The gRPC status where the stream carried one.
    pub fn grpc_status(&self) -> Option<u32> {
        self.http2.as_ref().and_then(|h| h.grpc_status)
    }
}

/// What the diagnosis reads of a record's `disagg` view.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DisaggSample {
    /// `prefill`, `decode` or `proxy`: a proxy's record repeats its decode leg's phases.
    pub role: Option<String>,
    pub kv_transfer_wait_ms: Option<f64>,
}

impl From<&RequestRecord> for RequestSample {
    fn from(r: &RequestRecord) -> Self {
        RequestSample {
            request_id: r.request_id.clone(),
            pid: r.pid,
            method: r.method.clone(),
            arrival_mono_ns: r.arrival_mono_ns,
            arrival_unix_ns: r.arrival_unix_ns,
            admitted_mono_ns: r.admitted_mono_ns,
            end_mono_ns: r.end_mono_ns,
            ttft_ms: r.ttft_ms,
            queue_wait_ms: r.queue_wait_ms,
            prefill_ms: r.prefill_ms,
            prefill_steps: r.prefill_steps,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens,
            prompt_bytes: r.prompt_bytes,
            preemptions: r.preemptions,
            first_token_mono_ns: r.first_token_mono_ns,
            disagg: r.disagg.as_deref().map(|d| DisaggSample {
                role: d.role.map(|r| r.as_str().to_owned()),
                kv_transfer_wait_ms: d.kv_transfer_wait_ms,
            }),
            connection_id: r.connection_id,
            tpot_ms: r.tpot_ms,
            itl_max_ms: r.itl_max_ms,
            e2e_ms: Some(r.e2e_ms),
            last_token_mono_ns: r.last_token_mono_ns,
            status: r.status,
            ended_by: r.ended_by.as_str().to_owned(),
            incomplete: r.incomplete.clone(),
            http2: r.http2.as_deref().map(|h| Http2Sample {
                grpc_status: h.grpc_status,
            }),
        }
    }
}

/// One engine step: its duration and how many requests it carried in each phase.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepSample {
    pub start_mono_ns: u64,
    pub duration_ms: f64,
    pub prefill_requests: u32,
    pub decode_requests: u32,
    /// The engine process (0: unknown) and the step's end.
    pub pid: u32,
    pub end_mono_ns: u64,
}

impl From<&StepRecord> for StepSample {
    fn from(s: &StepRecord) -> Self {
        let prefill = s.requests.iter().filter(|m| m.phase == "prefill").count();
        StepSample {
            start_mono_ns: s.start_mono_ns,
            duration_ms: s.duration_ms,
            prefill_requests: u32::try_from(prefill).unwrap_or(u32::MAX),
            decode_requests: u32::try_from(s.requests.len() - prefill).unwrap_or(u32::MAX),
            pid: s.pid,
            end_mono_ns: s.end_mono_ns,
        }
    }
}

/// The step record's JSON shape, for files.
#[derive(Deserialize)]
struct StepLine {
    start_mono_ns: u64,
    duration_ms: f64,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    end_mono_ns: u64,
    #[serde(default)]
    requests: Vec<StepMemberLine>,
}

#[derive(Deserialize)]
struct StepMemberLine {
    #[serde(default)]
    phase: String,
}

impl From<StepLine> for StepSample {
    fn from(s: StepLine) -> Self {
        let prefill = s.requests.iter().filter(|m| m.phase == "prefill").count();
        StepSample {
            start_mono_ns: s.start_mono_ns,
            duration_ms: s.duration_ms,
            prefill_requests: u32::try_from(prefill).unwrap_or(u32::MAX),
            decode_requests: u32::try_from(s.requests.len() - prefill).unwrap_or(u32::MAX),
            pid: s.pid,
            end_mono_ns: s.end_mono_ns,
        }
    }
}

/// One reading of the engine's own gauges and counters (e.g. a /metrics scrape). Every value is
/// optional: engines expose different subsets.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct EngineSample {
    #[serde(
        alias = "scrape_mono_ns",
        alias = "timestamp_mono_ns",
        alias = "time_mono_ns"
    )]
    pub mono_ns: u64,
    /// Share of the KV cache in use, 0..1 (values above 1 are read as percent).
    pub kv_cache_usage: Option<f64>,
    pub requests_waiting: Option<f64>,
    pub requests_running: Option<f64>,
    /// The engine's cumulative preemption counter.
    pub preemptions_total: Option<f64>,
}

/// One reading of one accelerator, with the verdict of a peer comparison (is this device an
/// outlier among its peers right now: lower clocks, throttling, a noisy neighbour).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DeviceSample {
    #[serde(alias = "timestamp_mono_ns", alias = "time_mono_ns")]
    pub mono_ns: u64,
    #[serde(alias = "uuid")]
    pub device: String,
    pub outlier: bool,
    /// The metrics on which the device deviates from its peers (the agent's GPU sample shape);
    /// any entry makes the sample an outlier.
    pub outliers: Vec<String>,
}

impl DeviceSample {
    pub fn is_outlier(&self) -> bool {
        self.outlier || !self.outliers.is_empty()
    }
}

/// The scheduler settings an engine process was started with (`inferscope record --engines`),
/// read from its command line by the engine's plugin.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, Deserialize)]
#[serde(default)]
pub struct EngineConfigSample {
    /// When the agent attached to the process.
    pub mono_ns: u64,
    pub pid: u32,
    pub engine: String,
    pub settings: std::collections::BTreeMap<String, String>,
}

/// Everything the diagnosis reads. Only `requests` is required.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub requests: Vec<RequestSample>,
    pub steps: Vec<StepSample>,
    pub engine: Vec<EngineSample>,
    pub devices: Vec<DeviceSample>,
    pub configs: Vec<EngineConfigSample>,
}

/// Lines longer than this are skipped (a record is well under 4 KiB).
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;
/// Lines read from one file at most; the rest are counted as dropped.
pub(crate) const MAX_LINES: usize = 5_000_000;

/// What reading a JSONL file kept and what it skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadStats {
    pub parsed: u64,
    pub invalid: u64,
    pub too_long: u64,
    pub dropped_over_limit: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("reading the input failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads JSON Lines of `T`, skipping (and counting) blank, invalid and over-long lines.
pub fn read_jsonl<T, R>(reader: R) -> Result<(Vec<T>, ReadStats), InputError>
where
    T: for<'de> Deserialize<'de>,
    R: BufRead,
{
    read_lines(reader, |line| serde_json::from_slice::<T>(line).ok())
}

/// Reads step records (the `--steps` file) as [`StepSample`]s.
pub fn read_steps<R: BufRead>(reader: R) -> Result<(Vec<StepSample>, ReadStats), InputError> {
    read_lines(reader, |line| {
        serde_json::from_slice::<StepLine>(line)
            .ok()
            .map(StepSample::from)
    })
}

fn read_lines<T, R, F>(mut reader: R, parse: F) -> Result<(Vec<T>, ReadStats), InputError>
where
    R: BufRead,
    F: Fn(&[u8]) -> Option<T>,
{
    let mut out = Vec::new();
    let mut stats = ReadStats::default();
    let mut line = Vec::new();
    let mut lines = 0usize;
    loop {
        line.clear();
        let limit = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX) + 1;
        let n = std::io::Read::take(&mut reader, limit).read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.len() > MAX_LINE_BYTES && !line.ends_with(b"\n") {
            // Skip the rest of this line without holding it.
            skip_to_newline(&mut reader)?;
            stats.too_long += 1;
            continue;
        }
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        lines += 1;
        if lines > MAX_LINES {
            stats.dropped_over_limit += 1;
            continue;
        }
        match parse(text) {
            Some(v) => {
                out.push(v);
                stats.parsed += 1;
            }
            None => stats.invalid += 1,
        }
    }
    Ok((out, stats))
}

fn skip_to_newline<R: BufRead>(reader: &mut R) -> std::io::Result<()> {
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(at) = memchr::memchr(b'\n', buf) {
            reader.consume(at + 1);
            return Ok(());
        }
        let len = buf.len();
        reader.consume(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_records_and_counts_bad_lines() {
        let long = format!("{{\"x\":\"{}\"}}\n", "a".repeat(MAX_LINE_BYTES + 10));
        let text = format!(
            "{{\"arrival_mono_ns\":5,\"end_mono_ns\":9,\"ttft_ms\":1.5,\"method\":\"POST\",\"extra\":[1]}}\n\nnot json\n{long}{{\"arrival_mono_ns\":7}}"
        );
        let (v, stats): (Vec<RequestSample>, _) = read_jsonl(text.as_bytes()).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].ttft_ms, Some(1.5));
        assert_eq!(v[1].arrival_mono_ns, 7);
        assert_eq!(stats.invalid, 1);
        assert_eq!(stats.too_long, 1);
    }

    #[test]
    fn step_lines_count_phases() {
        let text = r#"{"pid":1,"start_mono_ns":10,"end_mono_ns":20,"duration_ms":0.01,"requests":[{"request_id":"a","phase":"prefill"},{"request_id":"b","phase":"decode"},{"request_id":"c","phase":"decode"}]}"#;
        let (v, _) = read_steps(text.as_bytes()).unwrap();
        assert_eq!(v[0].prefill_requests, 1);
        assert_eq!(v[0].decode_requests, 2);
    }

    #[test]
    fn engine_sample_accepts_the_scrape_time_alias() {
        let (v, _): (Vec<EngineSample>, _) =
            read_jsonl(&br#"{"scrape_mono_ns":3,"kv_cache_usage":0.5}"#[..]).unwrap();
        assert_eq!(v[0].mono_ns, 3);
        assert_eq!(v[0].kv_cache_usage, Some(0.5));
    }

    #[test]
    fn device_samples_read_both_shapes() {
        let text = "{\"mono_ns\":1,\"device\":\"gpu0\",\"outlier\":true}\n{\"mono_ns\":2,\"uuid\":\"GPU-1\",\"outliers\":[\"sm_clock_mhz\"]}\n{\"mono_ns\":3,\"uuid\":\"GPU-2\",\"outliers\":[]}";
        let (v, _): (Vec<DeviceSample>, _) = read_jsonl(text.as_bytes()).unwrap();
        let flags: Vec<bool> = v.iter().map(DeviceSample::is_outlier).collect();
        assert_eq!(flags, [true, true, false]);
        assert_eq!(v[1].device, "GPU-1");
    }
}
