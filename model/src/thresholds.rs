//! Every threshold the agent decides with, in one place: the diagnosis's (the table in
//! docs/src/diagnosis.md lists them) and the GPU outlier test's (docs/src/gpu.md).
//! The diagnosis's ratios compare the incident window with the baseline window
//! (window / baseline).

/// P99 TTFT must grow by at least this ratio to count as a regression...
pub const TTFT_REGRESSION_RATIO: f64 = 1.5;
/// ...and by at least this many milliseconds (tiny TTFTs double on noise alone)...
pub const TTFT_REGRESSION_MIN_MS: f64 = 50.0;
/// ...and this share of the window's requests must be slower than the baseline's P99 TTFT
/// (one slow outlier is not an incident)...
pub const TTFT_REGRESSED_SHARE: f64 = 0.2;
/// ...and at least this many of them.
pub const TTFT_REGRESSED_MIN_REQUESTS: usize = 3;
/// Fewer requests with a TTFT than this in either window: no decision.
pub const MIN_REQUESTS_PER_WINDOW: usize = 5;

/// Disaggregated serving: the decode legs' P99 wait for the remote KV cache (queued on D →
/// first scheduled, by D's scheduler) grew by this ratio: the KV transfer (or D's queue before
/// it could start the transfer).
pub const KV_TRANSFER_WAIT_RATIO: f64 = 1.5;
/// Arrivals per second grew by this ratio: a traffic spike (the open-loop form).
pub const ARRIVAL_RATE_RATIO: f64 = 1.5;
/// Requests in the system (Little's law: arrival rate x time in system), scaled to the
/// baseline's engine time per request, grew by this ratio while queue wait grew and no capacity
/// signal crossed: a traffic spike (the closed-loop form: more clients, each waiting for its
/// answer, raise concurrency while the arrival rate stays capped by the service rate).
pub const IN_SYSTEM_RATIO: f64 = 1.5;
/// ...and only while demand rose: the arrival rate crossed ARRIVAL_RATE_RATIO, or the client
/// connections (where connections carry CONNECTION_REUSE_MIN requests each, so that they stand
/// for clients) grew by this ratio. More requests in the system at an unchanged demand is what
/// any slowdown produces (L = arrival rate x time in system), not more clients.
pub const CLIENTS_RATIO: f64 = 1.5;
/// Requests per client connection, in both windows, for connections to count clients
/// (keep-alive clients reuse theirs; a connection per request tracks the arrival rate instead).
pub const CONNECTION_REUSE_MIN: f64 = 1.5;
/// ...and only while the system was not still filling up through the window (requests in the
/// system in its second half at most this ratio of its first half): a system that keeps filling
/// is arrivals outrunning service (an open-loop overload, whose cause is the rate or the heavier
/// work), not more clients.
pub const IN_SYSTEM_TREND_MAX: f64 = 1.5;
/// The most requests one step carried fell to this share of the baseline's, while requests
/// waited: fewer slots / sequences (scheduler config).
pub const BATCH_MAX_FALL_RATIO: f64 = 0.67;
/// A cause explaining at least this share of the TTFT growth is reported as the secondary cause.
pub const SECONDARY_MIN_SHARE: f64 = 0.2;
/// KV cache usage (0..1, the window's P90 of engine samples) at or above this: memory pressure...
pub const KV_USAGE_HIGH: f64 = 0.90;
/// ...or preemptions per second at or above this, and at least this ratio over the baseline.
pub const PREEMPTION_RATE_MIN_PER_S: f64 = 0.1;
pub const PREEMPTION_RATE_RATIO: f64 = 2.0;
/// P99 prompt tokens (prompt bytes when tokens are unknown) grew by this ratio: prompt growth.
pub const PROMPT_GROWTH_RATIO: f64 = 1.5;
/// The median prompt tokens a request's engine computed in prefill (its prompt less what the
/// prefix cache served) grew by this ratio while prompts did not grow by PROMPT_GROWTH_RATIO:
/// prefix-cache misses.
pub const PREFIX_CACHE_MISS_RATIO: f64 = 1.5;
/// The median decode step at the same batch size (or, without step records, the median
/// prefill time per prompt token) grew by this ratio: the device got slower.
pub const DEVICE_SLOWDOWN_RATIO: f64 = 1.5;
/// Decode steps of one batch size needed in each window to compare their durations.
pub const MIN_STEPS_PER_BATCH_SIZE: usize = 5;
/// Share of one device's samples flagged as an outlier among its peers in the window (and
/// under it in the baseline): a degraded device.
pub const DEVICE_OUTLIER_SHARE: f64 = 0.5;
/// The median number of engine steps a request's prefill takes grew by this ratio (while
/// prompts did not grow by PROMPT_GROWTH_RATIO): the scheduler splits prefills more finely.
pub const PREFILL_STEPS_RATIO: f64 = 2.0;

/// The other profiles regress by the same ratio and share of requests as TTFT
/// (TTFT_REGRESSION_RATIO, TTFT_REGRESSED_SHARE), and by at least this many ms at P99: time per
/// output token...
pub const TPOT_REGRESSION_MIN_MS: f64 = 5.0;
/// ...a request's worst gap between two tokens (inter-token latency)...
pub const ITL_REGRESSION_MIN_MS: f64 = 20.0;
/// ...and arrival to end.
pub const E2E_REGRESSION_MIN_MS: f64 = 100.0;
/// The success rate regressed: it fell by at least this much (0..1)...
pub const SUCCESS_RATE_DROP: f64 = 0.02;
/// ...or fell below this (production vLLM below ~98 % is a critical state)...
pub const SUCCESS_RATE_CRITICAL: f64 = 0.98;
/// ...with at least this many failed requests in the window.
pub const FAILED_REQUESTS_MIN: usize = 3;
/// TPOT: the requests in a decode step (during the window's requests' decode) grew by this
/// ratio while the step's cost per request did not grow by DEVICE_SLOWDOWN_RATIO: batch growth.
pub const DECODE_BATCH_GROWTH_RATIO: f64 = 1.5;
/// TPOT: the share of the requests' decode time spent in steps that also carried other requests'
/// prefill grew by this much (0..1) to at least PREFILL_INTERFERENCE_SHARE_MIN, and such steps
/// took PREFILL_INTERFERENCE_STRETCH times a decode-only step: prefill interference.
pub const PREFILL_INTERFERENCE_SHARE_RISE: f64 = 0.2;
pub const PREFILL_INTERFERENCE_SHARE_MIN: f64 = 0.3;
pub const PREFILL_INTERFERENCE_STRETCH: f64 = 1.2;
/// TPOT: the share of the window's requests preempted during their decode, at least this and
/// PREEMPTION_RATE_RATIO times the baseline's: KV pressure.
pub const PREEMPTED_SHARE_MIN: f64 = 0.1;

/// Fleet-wide: a regression is concentrated on one replica when it moved by the regression's
/// ratio and every other replica's ratio stayed under this.
pub const CONCENTRATION_PEERS_MAX: f64 = 1.25;

/// Requests per window for full confidence.
pub const CONFIDENT_REQUESTS: usize = 30;

/// GPU outliers (capture's NVML sampler): a card's metric is flagged when it lies more than
/// this many robust standard deviations (1.4826 × the median absolute deviation) from its peers'
/// median: the usual modified-z-score cut-off...
pub const OUTLIER_K: f64 = 3.5;
/// ...and more than this share of the median (deviations under 10 % are never flagged, so
/// identical or idle peers, whose MAD is about 0, do not flag noise).
pub const OUTLIER_FLOOR: f64 = 0.10;
