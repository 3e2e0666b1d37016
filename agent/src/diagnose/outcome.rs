//! How each request ended, from what the agent saw of it (the HTTP status, the gRPC status, who
//! ended it, the time it waited), and the error branch: why the success rate fell.
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Inputs, Pair, RequestSample, TimeWindow};

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The engine or a gateway refused it for want of capacity: HTTP 503 or 429 (llama.cpp with
    /// no free slot, vLLM and SGLang past their waiting limits), gRPC RESOURCE_EXHAUSTED or
    /// UNAVAILABLE.
    Overload,
    /// The client gave up while the request still waited for the engine: it waited longer than
    /// the rest of its time (queue wait where the engine says it, else the wait for the first
    /// token, else its whole time when no token came).
    ClientTimeout,
    /// The client went away while tokens were streaming (a user's cancel, a stop sequence).
    ClientAbort,
    /// The server answered 5xx (other than 503) or a gRPC error, or closed the connection with
    /// the request open.
    EngineError,
    /// The request was malformed or refused as such (4xx other than 429).
    BadRequest,
}

impl Failure {
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Overload => "overload",
            Failure::ClientTimeout => "client_timeout",
            Failure::ClientAbort => "client_abort",
            Failure::EngineError => "engine_error",
            Failure::BadRequest => "bad_request",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Success,
    Failed(Failure),
    /// The agent did not see how it ended (it stopped, or lost the request's bytes).
    Unknown,
}

/// gRPC status codes: RESOURCE_EXHAUSTED and UNAVAILABLE are the server's "not now".
const GRPC_RESOURCE_EXHAUSTED: u32 = 8;
const GRPC_UNAVAILABLE: u32 = 14;

pub(super) fn classify(r: &RequestSample) -> Outcome {
    let grpc = r.grpc_status();
    let status = r.status;
    if matches!(status, Some(503 | 429))
        || matches!(grpc, Some(GRPC_RESOURCE_EXHAUSTED | GRPC_UNAVAILABLE))
    {
        return Outcome::Failed(Failure::Overload);
    }
    match r.ended_by.as_str() {
        "client" => return Outcome::Failed(client_failure(r)),
        "server" => return Outcome::Failed(Failure::EngineError),
        _ => {}
    }
    if matches!(status, Some(500..=599)) || grpc.is_some_and(|g| g != 0) {
        return Outcome::Failed(Failure::EngineError);
    }
    if matches!(status, Some(400..=499)) {
        return Outcome::Failed(Failure::BadRequest);
    }
    if r.incomplete.as_deref() == Some("server_exited") {
        return Outcome::Failed(Failure::EngineError);
    }
    match (r.ended_by.as_str(), status) {
        ("complete" | "", Some(_)) if r.incomplete.is_none() => Outcome::Success,
        // An h2 stream or a call whose status the head did not carry, ended cleanly.
        ("complete" | "", None) if r.incomplete.is_none() && r.http2.is_some() => Outcome::Success,
        _ => Outcome::Unknown,
    }
}

fn client_failure(r: &RequestSample) -> Failure {
    let total = r.e2e_ms.unwrap_or(0.0);
    let waited = r.queue_wait_ms.or(r.ttft_ms).unwrap_or(total);
    if waited > total - waited {
        Failure::ClientTimeout
    } else {
        Failure::ClientAbort
    }
}

/// The outcomes of one window's load requests.
#[derive(Debug, Clone, Default)]
pub(super) struct Tally {
    pub success: usize,
    pub failed: BTreeMap<Failure, Vec<String>>,
    pub unknown: usize,
    /// Engine processes that served the window's requests.
    pub pids: BTreeSet<u32>,
}

impl Tally {
    pub(super) fn failed(&self) -> usize {
        self.failed.values().map(Vec::len).sum()
    }

    pub(super) fn judged(&self) -> usize {
        self.success + self.failed()
    }

    pub(super) fn success_rate(&self) -> Option<f64> {
        let judged = self.judged();
        (judged > 0).then(|| self.success as f64 / judged as f64)
    }

    fn count(&self, f: Failure) -> usize {
        self.failed.get(&f).map_or(0, Vec::len)
    }
}

/// Inference requests only: a health check or a model list is not load.
fn is_load(r: &RequestSample) -> bool {
    r.method.is_empty() || r.method.eq_ignore_ascii_case("POST")
}

pub(super) fn tally(inputs: &Inputs, w: &TimeWindow) -> Tally {
    let mut t = Tally::default();
    for r in inputs
        .requests
        .iter()
        .filter(|r| w.contains(r.arrival_mono_ns) && is_load(r))
    {
        if r.pid != 0 {
            t.pids.insert(r.pid);
        }
        match classify(r) {
            Outcome::Success => t.success += 1,
            Outcome::Unknown => t.unknown += 1,
            Outcome::Failed(f) => t.failed.entry(f).or_default().push(r.request_id.clone()),
        }
    }
    t
}

/// The error branch's named causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCause {
    OverloadRejections,
    ClientTimeoutsAfterQueueWaits,
    ClientAborts,
    EngineErrors,
    EngineRestart,
    BadRequests,
    None,
}

impl ErrorCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCause::OverloadRejections => "overload_rejections",
            ErrorCause::ClientTimeoutsAfterQueueWaits => "client_timeouts_after_queue_waits",
            ErrorCause::ClientAborts => "client_aborts",
            ErrorCause::EngineErrors => "engine_errors",
            ErrorCause::EngineRestart => "engine_restart",
            ErrorCause::BadRequests => "bad_requests",
            ErrorCause::None => "none",
        }
    }
}

/// One kind of failure in both windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailureCount {
    pub kind: Failure,
    pub count: Pair<usize>,
    /// Its share of the judged requests.
    pub share: Pair<Option<f64>>,
    /// The incident window's failed requests of this kind (at most MAX_EXAMPLES).
    pub requests: Vec<String>,
}

/// Why the success rate fell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorBranch {
    pub cause: ErrorCause,
    pub success_rate: Pair<Option<f64>>,
    pub failures: Vec<FailureCount>,
    /// Engine processes that served the incident window and not the baseline (a restart gives
    /// the engine a new pid).
    pub new_engine_pids: Vec<u32>,
    pub summary: String,
}

const MAX_EXAMPLES: usize = 10;

fn share(n: usize, of: usize) -> Option<f64> {
    (of > 0).then(|| n as f64 / of as f64)
}

/// Names the failure whose share grew most; engine-side failures in a window where a new
/// engine process appeared are a restart.
pub(super) fn explain(inputs: &Inputs, b: &TimeWindow, w: &TimeWindow) -> ErrorBranch {
    let (bt, wt) = (tally(inputs, b), tally(inputs, w));
    let new_pids: Vec<u32> = wt.pids.difference(&bt.pids).copied().collect();
    let kinds = [
        Failure::Overload,
        Failure::ClientTimeout,
        Failure::ClientAbort,
        Failure::EngineError,
        Failure::BadRequest,
    ];
    let failures: Vec<FailureCount> = kinds
        .iter()
        .map(|&kind| FailureCount {
            kind,
            count: Pair {
                baseline: bt.count(kind),
                window: wt.count(kind),
            },
            share: Pair {
                baseline: share(bt.count(kind), bt.judged()),
                window: share(wt.count(kind), wt.judged()),
            },
            requests: wt
                .failed
                .get(&kind)
                .map(|ids| ids.iter().take(MAX_EXAMPLES).cloned().collect())
                .unwrap_or_default(),
        })
        .filter(|f| f.count.baseline + f.count.window > 0)
        .collect();
    let growth = |f: &FailureCount| f.share.window.unwrap_or(0.0) - f.share.baseline.unwrap_or(0.0);
    let lead = failures
        .iter()
        .filter(|f| f.count.window > 0 && growth(f) > 0.0)
        .max_by(|a, b| growth(a).total_cmp(&growth(b)));
    let cause = match lead.map(|f| f.kind) {
        None => ErrorCause::None,
        Some(Failure::Overload) => ErrorCause::OverloadRejections,
        Some(Failure::ClientTimeout) => ErrorCause::ClientTimeoutsAfterQueueWaits,
        Some(Failure::ClientAbort) => ErrorCause::ClientAborts,
        Some(Failure::EngineError) if !new_pids.is_empty() && !bt.pids.is_empty() => {
            ErrorCause::EngineRestart
        }
        Some(Failure::EngineError) => ErrorCause::EngineErrors,
        Some(Failure::BadRequest) => ErrorCause::BadRequests,
    };
    let rate = Pair {
        baseline: bt.success_rate(),
        window: wt.success_rate(),
    };
    let pct = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let summary = match lead {
        None => format!(
            "Success rate {} -> {}: no kind of failure grew.",
            pct(rate.baseline),
            pct(rate.window)
        ),
        Some(f) => format!(
            "Success rate {} -> {}; cause: {}: {} of {} requests ({} in the baseline){}.",
            pct(rate.baseline),
            pct(rate.window),
            cause.as_str(),
            f.count.window,
            wt.judged(),
            f.count.baseline,
            if cause == ErrorCause::EngineRestart {
                format!("; new engine process(es) {new_pids:?}")
            } else {
                String::new()
            }
        ),
    };
    ErrorBranch {
        cause,
        success_rate: rate,
        failures,
        new_engine_pids: new_pids,
        summary,
    }
}
