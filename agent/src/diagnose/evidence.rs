//! The measured signals of one window.
use std::collections::BTreeMap;

use inferscope_model::{clock::ns_to_ms, quantile::percentile, thresholds as t};

use super::{Inputs, TimeWindow};

/// Everything measured over one window; `None` where the inputs lack the data.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WindowSignals {
    /// Requests that arrived in the window with a TTFT.
    pub requests: usize,
    pub ttft_ms: Vec<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub queue_wait_p99_ms: Option<f64>,
    /// Decode legs of disaggregated requests: P99 wait for the remote KV cache.
    pub kv_transfer_wait_p99_ms: Option<f64>,
    pub prefill_p99_ms: Option<f64>,
    pub arrival_rate_per_s: Option<f64>,
    pub admission_rate_per_s: Option<f64>,
    /// Time-averaged requests between arrival and end, over the window.
    pub in_system_mean: Option<f64>,
    /// Mean time in the system (arrival to end) of the requests that arrived in the window.
    pub time_in_system_mean_s: Option<f64>,
    /// Little's law's L = arrival rate x mean time in system: the requests in the system, the
    /// demand of a closed loop (each client has one request in the system at a time).
    pub in_system_littles: Option<f64>,
    /// Requests in the system late in the window over early in it (counts at instants in its
    /// last quarter over its second quarter): well above 1 while the system is still
    /// filling (arrivals outrunning service, an open-loop overload); about 1 when it stays full
    /// (a closed loop: each client has one request in the system).
    pub in_system_trend: Option<f64>,
    /// Client connections open over the window, time-averaged (a connection is open from its
    /// first request's arrival to its last request's end): the clients of a closed loop whose
    /// clients keep their connections. None where the window's connections carried fewer than
    /// CONNECTION_REUSE_MIN requests each (a connection per request makes this the requests in
    /// the system, not the clients) or are unknown.
    pub clients_mean: Option<f64>,
    /// The window's load requests per distinct client connection (None: no connection ids).
    pub requests_per_connection: Option<f64>,
    /// Mean time in the engine (admission to end) per request: the service time.
    pub engine_time_mean_ms: Option<f64>,
    /// Mean queue wait over mean TTFT of the window's requests.
    pub queue_wait_share: Option<f64>,
    /// The most requests one engine step carried (the slots or sequences the engine ran).
    pub batch_requests_max: Option<f64>,
    /// Steps inside the window's span.
    pub steps_in_window: usize,
    /// Requests the engine preempted at least once (ids, at most MAX_PREEMPTED_IDS) and how many.
    pub preempted_ids: Vec<String>,
    pub preempted_requests: usize,
    /// Engine samples (KV usage, waiting, preemption counter) inside the window.
    pub engine_samples: usize,
    /// The scheduler settings of the processes that served the window's requests.
    pub engine_settings: BTreeMap<String, String>,
    pub prompt_tokens_p99: Option<f64>,
    /// Prompt tokens the engine computed in prefill (prompt less its prefix cache's share),
    /// the median per request, where the engine reports cached tokens.
    pub computed_tokens_p50: Option<f64>,
    /// The prefix cache's share of the window's prompt tokens.
    pub cached_share: Option<f64>,
    pub prompt_bytes_p99: Option<f64>,
    pub prefill_ms_per_token_p50: Option<f64>,
    pub prefill_steps_p50: Option<f64>,
    pub step_ms_p50: Option<f64>,
    /// Step records were given at all (the engine has scheduler hooks).
    pub has_steps: bool,
    /// Decode-only step durations by batch size (requests in the step).
    pub decode_steps_ms: BTreeMap<u32, Vec<f64>>,
    pub kv_usage_p90: Option<f64>,
    pub requests_waiting_mean: Option<f64>,
    pub preemptions_per_s: Option<f64>,
    /// The largest share of one device's samples flagged as an outlier.
    pub device_outlier_share: Option<f64>,
    pub outlier_device: Option<String>,
}

/// Preempted request ids kept per window for the evidence.
pub(super) const MAX_PREEMPTED_IDS: usize = 20;

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v
}

fn p(v: Vec<f64>, q: f64) -> Option<f64> {
    percentile(&sorted(v), q)
}

/// The prompt tokens a request's engine computed: its prompt less the prefix cache's part.
fn computed(r: &super::RequestSample) -> Option<f64> {
    Some(r.prompt_tokens?.saturating_sub(r.cached_tokens?) as f64)
}

pub(super) fn measure(inputs: &Inputs, w: &TimeWindow) -> WindowSignals {
    let dur_s = w.duration_s();
    let in_window: Vec<_> = inputs
        .requests
        .iter()
        .filter(|r| w.contains(r.arrival_mono_ns))
        .collect();
    // Inference requests: POSTs (a health check or a model list is not load).
    let is_load = |m: &str| m.is_empty() || m.eq_ignore_ascii_case("POST");
    let served: Vec<_> = in_window.iter().filter(|r| r.ttft_ms.is_some()).collect();
    let ttft_ms = sorted(served.iter().filter_map(|r| r.ttft_ms).collect());
    let mut s = WindowSignals {
        requests: served.len(),
        ttft_p99_ms: percentile(&ttft_ms, 0.99),
        ttft_ms,
        queue_wait_p99_ms: p(
            served.iter().filter_map(|r| r.queue_wait_ms).collect(),
            0.99,
        ),
        prefill_p99_ms: p(served.iter().filter_map(|r| r.prefill_ms).collect(), 0.99),
        kv_transfer_wait_p99_ms: p(
            served
                .iter()
                .filter_map(|r| r.disagg.as_ref())
                // A proxy's record repeats its decode leg's wait: counted once.
                .filter(|d| d.role.as_deref() != Some("proxy"))
                .filter_map(|d| d.kv_transfer_wait_ms)
                .collect(),
            0.99,
        ),
        prompt_tokens_p99: p(
            served
                .iter()
                .filter_map(|r| r.prompt_tokens.map(|t| t as f64))
                .collect(),
            0.99,
        ),
        prompt_bytes_p99: p(
            served
                .iter()
                .filter_map(|r| r.prompt_bytes.map(|t| t as f64))
                .collect(),
            0.99,
        ),
        computed_tokens_p50: p(served.iter().filter_map(|r| computed(r)).collect(), 0.5),
        cached_share: {
            let (cached, prompt) = served
                .iter()
                .filter_map(|r| Some((r.cached_tokens?, r.prompt_tokens?)))
                .fold((0u64, 0u64), |(c, p), (rc, rp)| (c + rc.min(rp), p + rp));
            (prompt > 0).then(|| cached as f64 / prompt as f64)
        },
        // Per computed token where the engine says what its cache served: a cache miss makes
        // more tokens to compute, not a slower device.
        prefill_ms_per_token_p50: p(
            served
                .iter()
                .filter_map(|r| {
                    let tokens = computed(r).or(r.prompt_tokens.map(|t| t as f64))?;
                    (tokens > 0.0).then_some(r.prefill_ms? / tokens)
                })
                .collect(),
            0.5,
        ),
        prefill_steps_p50: {
            let ends = StepEnds::of(&inputs.steps);
            p(
                served
                    .iter()
                    .filter_map(|r| r.prefill_steps.or_else(|| ends.prefill_steps(r)))
                    .map(|t| t as f64)
                    .collect(),
                0.5,
            )
        },
        ..Default::default()
    };
    if dur_s > 0.0 {
        let arrivals = in_window.iter().filter(|r| is_load(&r.method)).count();
        s.arrival_rate_per_s = Some(arrivals as f64 / dur_s);
        let admitted: Vec<u64> = inputs
            .requests
            .iter()
            .filter_map(|r| r.admitted_mono_ns)
            .collect();
        if !admitted.is_empty() {
            let n = admitted.iter().filter(|t| w.contains(**t)).count();
            s.admission_rate_per_s = Some(n as f64 / dur_s);
        }
        let busy_ns: u128 = inputs
            .requests
            .iter()
            .filter(|r| is_load(&r.method))
            .map(|r| u128::from(w.overlap_ns(r.arrival_mono_ns, r.end_mono_ns)))
            .sum();
        s.in_system_mean = Some(busy_ns as f64 / 1e9 / dur_s);
        let times: Vec<f64> = in_window
            .iter()
            .filter(|r| is_load(&r.method))
            .map(|r| r.end_mono_ns.saturating_sub(r.arrival_mono_ns) as f64 / 1e9)
            .collect();
        s.time_in_system_mean_s = mean(&times);
        s.in_system_trend = trend(inputs, w, &is_load);
        s.in_system_littles = s.time_in_system_mean_s.map(|w| arrivals as f64 / dur_s * w);
        (s.requests_per_connection, s.clients_mean) = clients(inputs, w, &is_load);
        // Preemptions: the engine's counter when scraped, else the per-request counts.
        s.preemptions_per_s = counter_rate(inputs, w).or_else(|| {
            let counts: Vec<u64> = served.iter().filter_map(|r| r.preemptions).collect();
            (!counts.is_empty()).then(|| counts.iter().sum::<u64>() as f64 / dur_s)
        });
    }
    let engine_ms: Vec<f64> = served
        .iter()
        .filter_map(|r| {
            let a = r.admitted_mono_ns?;
            (r.end_mono_ns >= a).then(|| ns_to_ms(r.end_mono_ns - a))
        })
        .collect();
    s.engine_time_mean_ms = mean(&engine_ms);
    let queue: Vec<f64> = served.iter().filter_map(|r| r.queue_wait_ms).collect();
    let ttft: Vec<f64> = served.iter().filter_map(|r| r.ttft_ms).collect();
    s.queue_wait_share = match (mean(&queue), mean(&ttft)) {
        (Some(q), Some(t)) if t > 0.0 => Some((q / t).clamp(0.0, 1.0)),
        _ => None,
    };
    for r in served
        .iter()
        .filter(|r| r.preemptions.is_some_and(|n| n > 0))
    {
        s.preempted_requests += 1;
        if s.preempted_ids.len() < MAX_PREEMPTED_IDS {
            s.preempted_ids.push(r.request_id.clone());
        }
    }
    let pids: std::collections::BTreeSet<u32> = served.iter().map(|r| r.pid).collect();
    for c in inputs.configs.iter().filter(|c| pids.contains(&c.pid)) {
        for (k, v) in &c.settings {
            let e = s.engine_settings.entry(k.clone()).or_default();
            // Two processes with different values: show both.
            if e.is_empty() {
                e.clone_from(v);
            } else if !e.split('/').any(|x| x == v) {
                e.push('/');
                e.push_str(v);
            }
        }
    }
    // Steps: the engine's work for this window's requests, which runs on after the window's
    // last arrival until its last request ends.
    let work = TimeWindow {
        start_mono_ns: w.start_mono_ns,
        end_mono_ns: in_window
            .iter()
            .map(|r| r.end_mono_ns.saturating_add(1))
            .fold(w.end_mono_ns, u64::max),
    };
    s.has_steps = !inputs.steps.is_empty();
    let steps: Vec<_> = inputs
        .steps
        .iter()
        .filter(|st| work.contains(st.start_mono_ns))
        .collect();
    s.step_ms_p50 = p(steps.iter().map(|st| st.duration_ms).collect(), 0.5);
    s.steps_in_window = steps.len();
    s.batch_requests_max = steps
        .iter()
        .map(|st| f64::from(st.prefill_requests.saturating_add(st.decode_requests)))
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    for st in steps {
        if st.prefill_requests == 0 && st.decode_requests > 0 {
            s.decode_steps_ms
                .entry(st.decode_requests)
                .or_default()
                .push(st.duration_ms);
        }
    }
    for v in s.decode_steps_ms.values_mut() {
        *v = sorted(std::mem::take(v));
    }
    let engine: Vec<_> = inputs
        .engine
        .iter()
        .filter(|e| w.contains(e.mono_ns))
        .collect();
    s.kv_usage_p90 = p(
        engine
            .iter()
            .filter_map(|e| e.kv_cache_usage)
            .map(|u| if u > 1.0 { u / 100.0 } else { u })
            .collect(),
        0.9,
    );
    s.engine_samples = engine.len();
    let waiting: Vec<f64> = engine.iter().filter_map(|e| e.requests_waiting).collect();
    if !waiting.is_empty() {
        s.requests_waiting_mean = Some(waiting.iter().sum::<f64>() / waiting.len() as f64);
    }
    let mut per_device: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for d in inputs.devices.iter().filter(|d| w.contains(d.mono_ns)) {
        let e = per_device.entry(d.device.as_str()).or_default();
        e.0 += 1;
        e.1 += usize::from(d.is_outlier());
    }
    if let Some((dev, share)) = per_device
        .iter()
        .map(|(d, (n, o))| (*d, *o as f64 / *n as f64))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        s.device_outlier_share = Some(share);
        s.outlier_device = Some(dev.to_owned());
    }
    s
}

/// Requests in the system at four instants in the window's last quarter over four in its second
/// quarter (its first quarter is left out: a window that starts on an empty system fills up
/// first, closed loop or not).
fn trend(inputs: &Inputs, w: &TimeWindow, is_load: &dyn Fn(&str) -> bool) -> Option<f64> {
    let span = w.end_mono_ns.saturating_sub(w.start_mono_ns);
    let at = |k: u64| {
        let t = w.start_mono_ns + span / 32 * (2 * k + 1);
        inputs
            .requests
            .iter()
            .filter(|r| is_load(&r.method) && r.arrival_mono_ns <= t && r.end_mono_ns > t)
            .count() as f64
    };
    let early: f64 = (4..8).map(at).sum();
    let late: f64 = (12..16).map(at).sum();
    (early > 0.0).then(|| late / early)
}

/// The window's requests per client connection, and the client connections open over the
/// window, time-averaged (only where connections carried at least CONNECTION_REUSE_MIN requests
/// each: a connection per request counts requests, not clients). A connection is open from its
/// first request's arrival to its last request's end, over every request of the inputs, so that a
/// keep-alive client counts over the whole window whatever the window's length.
fn clients(
    inputs: &Inputs,
    w: &TimeWindow,
    is_load: &dyn Fn(&str) -> bool,
) -> (Option<f64>, Option<f64>) {
    let dur_s = w.duration_s();
    let mut spans: std::collections::HashMap<(u32, u64), (u64, u64, usize)> = Default::default();
    for r in inputs
        .requests
        .iter()
        .filter(|r| r.connection_id != 0 && is_load(&r.method))
    {
        let e = spans
            .entry((r.pid, r.connection_id))
            .or_insert((u64::MAX, 0, 0));
        e.0 = e.0.min(r.arrival_mono_ns);
        e.1 = e.1.max(r.end_mono_ns);
        e.2 += usize::from(w.contains(r.arrival_mono_ns));
    }
    let (conns, requests) = spans
        .values()
        .filter(|s| s.2 > 0)
        .fold((0usize, 0usize), |(c, n), s| (c + 1, n + s.2));
    if conns == 0 || dur_s <= 0.0 {
        return (None, None);
    }
    let per_connection = requests as f64 / conns as f64;
    let open_ns: u128 = spans
        .values()
        .map(|s| u128::from(w.overlap_ns(s.0, s.1)))
        .sum();
    let clients = (per_connection >= t::CONNECTION_REUSE_MIN).then(|| open_ns as f64 / 1e9 / dur_s);
    (Some(per_connection), clients)
}

/// Preemptions per second from the engine's cumulative counter (resets count from zero).
fn counter_rate(inputs: &Inputs, w: &TimeWindow) -> Option<f64> {
    let mut pts: Vec<(u64, f64)> = inputs
        .engine
        .iter()
        .filter(|e| w.contains(e.mono_ns))
        .filter_map(|e| e.preemptions_total.map(|v| (e.mono_ns, v)))
        .collect();
    pts.sort_by_key(|p| p.0);
    let (first, last) = (pts.first()?, pts.last()?);
    let span_s = last.0.saturating_sub(first.0) as f64 / 1e9;
    if span_s <= 0.0 {
        return None;
    }
    let increase: f64 = pts
        .windows(2)
        .map(|p| {
            let d = p[1].1 - p[0].1;
            if d >= 0.0 { d } else { p[1].1 }
        })
        .sum();
    Some(increase / span_s)
}

/// Step ends per engine process, sorted: the steps a request prefilled in, where the engine
/// reports no per-request count.
struct StepEnds(std::collections::HashMap<u32, Vec<u64>>);

impl StepEnds {
    fn of(steps: &[super::StepSample]) -> StepEnds {
        let mut by_pid: std::collections::HashMap<u32, Vec<u64>> = Default::default();
        for s in steps.iter().filter(|s| s.pid != 0 && s.end_mono_ns != 0) {
            by_pid.entry(s.pid).or_default().push(s.end_mono_ns);
        }
        for v in by_pid.values_mut() {
            v.sort_unstable();
        }
        StepEnds(by_pid)
    }

    /// The steps of the request's engine that ended after its admission and no later than its
    /// first token: the prefill steps (chunked prefill spreads a prompt over several; the last
    /// one produced the first token). None without an admission, a first token or that
    /// engine's steps.
    fn prefill_steps(&self, r: &super::RequestSample) -> Option<u64> {
        let ends = self.0.get(&r.pid)?;
        let (from, to) = (r.admitted_mono_ns?, r.first_token_mono_ns?);
        if to < from {
            return None;
        }
        let n = ends.partition_point(|&e| e <= to) - ends.partition_point(|&e| e <= from);
        (n > 0).then_some(n as u64)
    }
}
