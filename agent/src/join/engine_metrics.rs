//! Engine metrics → per-interval records: a scrape's exposition is read through the engine's
//! metric table into signals, counters become rates against the previous scrape, and each
//! request is annotated with the engine state sampled nearest its arrival.
use std::collections::{HashMap, VecDeque};

use inferscope_decode::prometheus::{self, Limits, ParseStats};
use inferscope_model::clock::ns_to_ms;
use serde::Serialize;

use super::RequestRecord;
use crate::{
    capture::metrics::Scrape,
    engines::{MetricsEndpoint, Signal},
};

/// Samples kept per engine for the arrival join: at a 1 s interval, the last ~8 minutes.
const HISTORY: usize = 512;

/// One scrape of one engine's metrics endpoint, normalised. What `--metrics` writes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct EngineMetricsRecord {
    pub pid: u32,
    pub engine: String,
    pub port: u16,
    pub path: String,
    /// Midpoint of the scrape (CLOCK_MONOTONIC, the request records' clock).
    pub mono_ns: u64,
    pub unix_ns: u64,
    /// How long the HTTP GET took.
    pub scrape_ms: f64,
    /// Fraction of the KV cache in use, 0..1 (mean over the engine's data-parallel ranks).
    pub kv_cache_usage: Option<f64>,
    pub requests_running: Option<f64>,
    pub requests_waiting: Option<f64>,
    /// Engine counters since it started.
    pub preemptions_total: Option<f64>,
    pub prompt_tokens_total: Option<f64>,
    pub generation_tokens_total: Option<f64>,
    /// KV-cache transfers the engine's KV connector finished since it started, and the
    /// seconds they took by the connector's own measure (vLLM: `vllm:nixl_xfer_time_seconds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfers_total: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_seconds_total: Option<f64>,
    /// Seconds since this engine's previous record; rates cover that interval. None on the
    /// first record and after a counter reset (the engine restarted).
    pub interval_s: Option<f64>,
    pub preemptions_per_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub generation_tokens_per_s: Option<f64>,
    /// Transfers finished in the interval, and their mean time by the connector's measure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfers_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_mean_ms: Option<f64>,
    /// Sample lines in the exposition, and lines skipped as unreadable or over the bounds.
    pub samples: u64,
    pub lines_skipped: u64,
    /// Scrapes of this engine that failed since the previous record.
    pub scrape_errors: u64,
}

/// Signal values from one exposition.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Snapshot {
    values: [Option<f64>; Signal::ALL.len()],
}

impl Snapshot {
    pub(crate) fn get(&self, signal: Signal) -> Option<f64> {
        self.values[signal.index()]
    }
}

/// Reads `body` through `endpoint`'s table. Where several metrics give one signal, the most
/// preferred one present wins; series of that metric sum or average (see [`Signal::sums`]).
pub(crate) fn snapshot(
    body: &[u8],
    endpoint: &MetricsEndpoint,
    limits: &Limits,
) -> (Snapshot, ParseStats) {
    #[derive(Clone, Copy)]
    struct Acc {
        rank: usize,
        sum: f64,
        n: u32,
    }
    let mut acc: [Option<Acc>; Signal::ALL.len()] = [None; Signal::ALL.len()];
    let stats = prometheus::parse(body, limits, |sample| {
        // Tables are a handful of entries: a scan beats hashing every sample name.
        let Some((rank, source)) = endpoint
            .sources
            .iter()
            .enumerate()
            .find(|(_, s)| s.metric == sample.name)
        else {
            return;
        };
        if !sample.value.is_finite() {
            return;
        }
        let slot = &mut acc[source.signal.index()];
        let value = sample.value * source.scale;
        match slot {
            Some(a) if a.rank == rank => {
                a.sum += value;
                a.n += 1;
            }
            Some(a) if a.rank < rank => {}
            _ => {
                *slot = Some(Acc {
                    rank,
                    sum: value,
                    n: 1,
                })
            }
        }
    });
    let mut snap = Snapshot::default();
    for signal in Signal::ALL {
        snap.values[signal.index()] = acc[signal.index()].map(|a| {
            if signal.sums() {
                a.sum
            } else {
                a.sum / f64::from(a.n)
            }
        });
    }
    (snap, stats)
}

struct EngineState {
    path: &'static str,
    previous: Option<(u64, Snapshot)>,
    /// (sample time, KV usage, waiting) for the arrival join, oldest first.
    history: VecDeque<(u64, Option<f64>, Option<f64>)>,
}

/// Per-engine state: counters for rates, recent samples for the arrival join.
pub(crate) struct EngineMetrics {
    limits: Limits,
    unix_offset_ns: u64,
    /// Largest distance between an arrival and the sample joined to it.
    max_join_gap_ns: u64,
    engines: HashMap<u32, EngineState>,
    /// The agent's own scrapes, seen by the socket probes as requests and left out of the records.
    pub scrape_requests_hidden: u64,
}

impl EngineMetrics {
    pub(crate) fn new(limits: Limits, max_join_gap_ns: u64) -> Self {
        Self {
            limits,
            unix_offset_ns: inferscope_model::clock::unix_offset_ns(),
            max_join_gap_ns,
            engines: HashMap::new(),
            scrape_requests_hidden: 0,
        }
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.engines.remove(&pid);
    }

    /// Whether scrapes of `pid` are kept for the arrival join.
    #[cfg(test)]
    pub(crate) fn knows(&self, pid: u32) -> bool {
        self.engines.contains_key(&pid)
    }

    pub(crate) fn on_scrape(&mut self, scrape: &Scrape) -> EngineMetricsRecord {
        let (snap, stats) = snapshot(&scrape.body, scrape.endpoint, &self.limits);
        let mono_ns = scrape.start_mono_ns + (scrape.end_mono_ns - scrape.start_mono_ns) / 2;
        let state = self
            .engines
            .entry(scrape.pid)
            .or_insert_with(|| EngineState {
                path: scrape.endpoint.path,
                previous: None,
                history: VecDeque::new(),
            });
        state.path = scrape.endpoint.path;
        let mut record = EngineMetricsRecord {
            pid: scrape.pid,
            engine: scrape.engine.to_string(),
            port: scrape.port,
            path: scrape.endpoint.path.to_string(),
            mono_ns,
            unix_ns: mono_ns.wrapping_add(self.unix_offset_ns),
            scrape_ms: ns_to_ms(scrape.end_mono_ns - scrape.start_mono_ns),
            kv_cache_usage: snap.get(Signal::KvCacheUsage),
            requests_running: snap.get(Signal::RequestsRunning),
            requests_waiting: snap.get(Signal::RequestsWaiting),
            preemptions_total: snap.get(Signal::PreemptionsTotal),
            prompt_tokens_total: snap.get(Signal::PromptTokensTotal),
            generation_tokens_total: snap.get(Signal::GenerationTokensTotal),
            kv_transfers_total: snap.get(Signal::KvTransfersTotal),
            kv_transfer_seconds_total: snap.get(Signal::KvTransferSecondsTotal),
            samples: stats.samples,
            lines_skipped: stats.skipped(),
            scrape_errors: scrape.failures_since_last,
            ..Default::default()
        };
        if let Some((prev_ns, prev)) = state.previous
            && mono_ns > prev_ns
        {
            let secs = (mono_ns - prev_ns) as f64 / 1e9;
            let rate = |signal: Signal| match (prev.get(signal), snap.get(signal)) {
                // A counter that went down: the engine restarted; no rate this interval.
                (Some(a), Some(b)) if b >= a => Some((b - a) / secs),
                _ => None,
            };
            record.interval_s = Some(secs);
            record.preemptions_per_s = rate(Signal::PreemptionsTotal);
            record.prompt_tokens_per_s = rate(Signal::PromptTokensTotal);
            record.generation_tokens_per_s = rate(Signal::GenerationTokensTotal);
            record.kv_transfers_per_s = rate(Signal::KvTransfersTotal);
            let delta = |signal: Signal| match (prev.get(signal), snap.get(signal)) {
                (Some(a), Some(b)) if b >= a => Some(b - a),
                _ => None,
            };
            record.kv_transfer_mean_ms = match (
                delta(Signal::KvTransfersTotal),
                delta(Signal::KvTransferSecondsTotal),
            ) {
                (Some(n), Some(s)) if n > 0.0 => Some(s / n * 1e3),
                _ => None,
            };
        }
        state.previous = Some((mono_ns, snap));
        if state.history.len() == HISTORY {
            state.history.pop_front();
        }
        state
            .history
            .push_back((mono_ns, record.kv_cache_usage, record.requests_waiting));
        record
    }

    /// Whether `record` is one of the agent's own scrapes of a watched engine.
    pub(crate) fn is_own_scrape(&mut self, record: &RequestRecord) -> bool {
        let own = record.method == "GET"
            && self
                .engines
                .get(&record.pid)
                .is_some_and(|s| record.path == s.path);
        self.scrape_requests_hidden += u64::from(own);
        own
    }

    /// Fills the request's `*_at_arrival` fields: from the last sample taken before the
    /// arrival (the state the request found; a later one already counts the request itself),
    /// else from the first one after it; only within the join gap.
    pub(crate) fn annotate(&self, record: &mut RequestRecord) {
        let Some(state) = self.engines.get(&record.pid) else {
            return;
        };
        let arrival = record.arrival_mono_ns;
        let idx = state.history.partition_point(|(t, _, _)| *t <= arrival);
        let chosen = [idx.checked_sub(1), Some(idx)]
            .into_iter()
            .flatten()
            .filter_map(|i| state.history.get(i))
            .find(|(t, _, _)| t.abs_diff(arrival) <= self.max_join_gap_ns);
        let Some(&(t, kv, waiting)) = chosen else {
            return;
        };
        record.kv_cache_usage_at_arrival = kv;
        record.requests_waiting_at_arrival = waiting;
        record.engine_metrics_offset_ms = Some((t as f64 - arrival as f64) / 1e6);
    }
}

impl inferscope_model::PerProcess for EngineMetrics {
    fn process_gone(&mut self, tgid: u32) {
        self.forget(tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::by_name;

    fn endpoint(engine: &str) -> &'static MetricsEndpoint {
        by_name(engine).and_then(|e| e.metrics()).unwrap()
    }

    fn scrape(body: &[u8], at_ms: u64) -> Scrape {
        Scrape {
            pid: 7,
            engine: "vllm",
            endpoint: endpoint("vllm"),
            port: 8000,
            start_mono_ns: at_ms * 1_000_000,
            end_mono_ns: at_ms * 1_000_000 + 2_000_000,
            body: bytes::Bytes::copy_from_slice(body),
            failures_since_last: 0,
        }
    }

    #[test]
    fn preferred_metric_wins_and_series_combine() {
        let body = b"vllm:gpu_cache_usage_perc 0.9\n\
            vllm:kv_cache_usage_perc{engine=\"0\"} 0.2\n\
            vllm:kv_cache_usage_perc{engine=\"1\"} 0.4\n\
            vllm:gpu_cache_usage_perc 0.8\n\
            vllm:num_requests_running{engine=\"0\"} 2\n\
            vllm:num_requests_running{engine=\"1\"} 5\n\
            vllm:num_requests_waiting NaN\n";
        let (snap, stats) = snapshot(body, endpoint("vllm"), &Limits::default());
        assert_eq!(stats.samples, 7);
        assert!((snap.get(Signal::KvCacheUsage).unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(snap.get(Signal::RequestsRunning), Some(7.0));
        assert_eq!(snap.get(Signal::RequestsWaiting), None);
        assert_eq!(snap.get(Signal::PreemptionsTotal), None);
        // The older name still gives the signal where it is the only one.
        let (old, _) = snapshot(
            b"vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.75\n",
            endpoint("vllm"),
            &Limits::default(),
        );
        assert_eq!(old.get(Signal::KvCacheUsage), Some(0.75));
    }

    #[test]
    fn counters_become_rates_and_resets_give_none() {
        let mut m = EngineMetrics::new(Limits::default(), 2_000_000_000);
        let first = m.on_scrape(&scrape(b"vllm:num_preemptions_total 4\n", 1000));
        assert_eq!(first.preemptions_total, Some(4.0));
        assert_eq!(first.preemptions_per_s, None);
        let second = m.on_scrape(&scrape(b"vllm:num_preemptions_total 10\n", 3000));
        assert_eq!(second.interval_s, Some(2.0));
        assert_eq!(second.preemptions_per_s, Some(3.0));
        let reset = m.on_scrape(&scrape(b"vllm:num_preemptions_total 1\n", 4000));
        assert_eq!(reset.preemptions_per_s, None);
        assert_eq!(second.mono_ns, 3_001_000_000);
    }

    /// vLLM's NIXL connector exports its transfers' own times as a histogram: its count and
    /// sum are totals, and the interval's mean is their change's ratio.
    #[test]
    fn the_connectors_transfer_times_give_the_intervals_mean() {
        let mut m = EngineMetrics::new(Limits::default(), 2_000_000_000);
        let body = |n: u32, s: f64| {
            format!(
                "vllm:nixl_xfer_time_seconds_bucket{{engine=\"0\",le=\"0.1\"}} {n}\n\
                 vllm:nixl_xfer_time_seconds_count{{engine=\"0\",model_name=\"m\"}} {n}\n\
                 vllm:nixl_xfer_time_seconds_sum{{engine=\"0\",model_name=\"m\"}} {s}\n"
            )
        };
        let first = m.on_scrape(&scrape(body(4, 0.1).as_bytes(), 1000));
        assert_eq!(first.kv_transfers_total, Some(4.0));
        assert_eq!(first.kv_transfer_seconds_total, Some(0.1));
        assert_eq!(first.kv_transfer_mean_ms, None);
        let second = m.on_scrape(&scrape(body(14, 1.6).as_bytes(), 3000));
        assert_eq!(second.kv_transfers_per_s, Some(5.0));
        assert!((second.kv_transfer_mean_ms.unwrap() - 150.0).abs() < 1e-9);
        // No transfer in the interval: no mean.
        let idle = m.on_scrape(&scrape(body(14, 1.6).as_bytes(), 4000));
        assert_eq!(idle.kv_transfer_mean_ms, None);
    }

    #[test]
    fn requests_get_the_state_they_found_on_arrival() {
        let mut m = EngineMetrics::new(Limits::default(), 1_500_000_000);
        m.on_scrape(&scrape(b"vllm:kv_cache_usage_perc 0.1\n", 1000));
        m.on_scrape(&scrape(
            b"vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_waiting 3\n",
            2000,
        ));
        let at = |arrival_ms: u64| {
            let mut r = RequestRecord {
                pid: 7,
                arrival_mono_ns: arrival_ms * 1_000_000,
                ..Default::default()
            };
            m.annotate(&mut r);
            r
        };
        // Samples sit at 1001 ms and 2001 ms (scrape midpoints).
        let r = at(1800);
        assert_eq!(r.kv_cache_usage_at_arrival, Some(0.1));
        assert_eq!(r.requests_waiting_at_arrival, None);
        assert_eq!(r.engine_metrics_offset_ms, Some(-799.0));
        let r = at(2500);
        assert_eq!(r.kv_cache_usage_at_arrival, Some(0.5));
        assert_eq!(r.requests_waiting_at_arrival, Some(3.0));
        assert_eq!(r.engine_metrics_offset_ms, Some(-499.0));
        // Before the first sample: the one after it.
        let r = at(500);
        assert_eq!(r.kv_cache_usage_at_arrival, Some(0.1));
        assert_eq!(r.engine_metrics_offset_ms, Some(501.0));
        // Too far from any sample: left empty rather than joined to a stale state.
        assert_eq!(at(9000).kv_cache_usage_at_arrival, None);
        let own = RequestRecord {
            pid: 7,
            method: "GET".into(),
            path: "/metrics".into(),
            ..Default::default()
        };
        assert!(m.is_own_scrape(&own));
        assert_eq!(m.scrape_requests_hidden, 1);
    }
}
