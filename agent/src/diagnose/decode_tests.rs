//! The first question and the TPOT / error branches on synthetic windows: each decode cause
//! from the steps its requests decoded in, each failure kind from how requests ended, and
//! `none` where nothing moved.
use super::*;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// A window of decoding: `n` requests arriving evenly over 10 s, each decoding `tokens` tokens
/// in back-to-back engine steps of `batch` requests and `step_ms`; every `mixed_every`-th step
/// also prefills another request and takes `stretch` times as long.
#[derive(Clone, Copy)]
struct Decode {
    n: u64,
    tokens: u64,
    batch: u32,
    step_ms: f64,
    mixed_every: u64,
    stretch: f64,
    /// Every k-th request is preempted once in its decode, which adds `preempt_ms` to it.
    preempt_every: u64,
    preempt_ms: f64,
    /// Every k-th request fails with this HTTP status (0: none).
    fail_every: u64,
    fail_status: u16,
    /// Every k-th request is aborted by its client after waiting `abort_wait_ms` in the queue.
    abort_every: u64,
    abort_wait_ms: f64,
    /// Every k-th request is cut by the server (its connection closed), served by `pid`.
    cut_every: u64,
    pid: u32,
}

impl Default for Decode {
    fn default() -> Self {
        Decode {
            n: 40,
            tokens: 24,
            batch: 2,
            step_ms: 20.0,
            mixed_every: 0,
            stretch: 1.0,
            preempt_every: 0,
            preempt_ms: 0.0,
            fail_every: 0,
            fail_status: 0,
            abort_every: 0,
            abort_wait_ms: 0.0,
            cut_every: 0,
            pid: 7,
        }
    }
}

fn every(k: u64, i: u64) -> bool {
    k > 0 && i % k == k - 1
}

fn add(inputs: &mut Inputs, t0: u64, d: Decode) {
    // The engine's steps over the whole window (and the decode tail after it).
    let mut t = t0;
    let mut step = 0u64;
    while t < t0 + 14 * S {
        let mixed = every(d.mixed_every, step);
        let ms = if mixed {
            d.step_ms * d.stretch
        } else {
            d.step_ms
        };
        let ms = ms + (step % 3) as f64 * 0.1;
        inputs.steps.push(StepSample {
            start_mono_ns: t,
            duration_ms: ms,
            prefill_requests: u32::from(mixed),
            decode_requests: d.batch,
            pid: d.pid,
            end_mono_ns: t + (ms * 1e6) as u64,
        });
        t += (ms * 1e6) as u64;
        step += 1;
    }
    let steps: Vec<StepSample> = inputs.steps.clone();
    for i in 0..d.n {
        let arrival = t0 + i * 10 * S / d.n;
        let first = arrival + 60 * MS;
        // The request's decode: its next `tokens - 1` steps, plus a preemption's recompute.
        let from = steps.partition_point(|s| s.start_mono_ns < first);
        let decode: Vec<&StepSample> = steps
            .iter()
            .skip(from)
            .filter(|s| s.pid == d.pid)
            .take((d.tokens - 1) as usize)
            .collect();
        let preempted = every(d.preempt_every, i);
        let extra = if preempted { d.preempt_ms } else { 0.0 };
        let span_ms: f64 = decode.iter().map(|s| s.duration_ms).sum::<f64>() + extra;
        let worst = decode.iter().map(|s| s.duration_ms).fold(0.0, f64::max) + extra;
        let last = first + (span_ms * 1e6) as u64;
        let mut r = RequestSample {
            request_id: format!("{t0}-{i}"),
            pid: d.pid,
            method: "POST".into(),
            arrival_mono_ns: arrival,
            admitted_mono_ns: Some(arrival + 10 * MS),
            end_mono_ns: last + MS,
            ttft_ms: Some(60.0 + (i % 5) as f64),
            queue_wait_ms: Some(10.0),
            prefill_ms: Some(50.0),
            prompt_tokens: Some(100),
            preemptions: Some(u64::from(preempted)),
            first_token_mono_ns: Some(first),
            last_token_mono_ns: Some(last),
            tpot_ms: Some(span_ms / (d.tokens - 1) as f64),
            itl_max_ms: Some(worst),
            e2e_ms: Some((last + MS - arrival) as f64 / 1e6),
            status: Some(200),
            ended_by: "complete".into(),
            connection_id: 1 + i % 4,
            ..Default::default()
        };
        if every(d.fail_every, i) {
            r.status = Some(d.fail_status);
            r.ttft_ms = None;
            r.tpot_ms = None;
            r.itl_max_ms = None;
            r.first_token_mono_ns = None;
        } else if every(d.abort_every, i) {
            r.ended_by = "client".into();
            r.admitted_mono_ns = None;
            r.queue_wait_ms = None;
            r.ttft_ms = None;
            r.tpot_ms = None;
            r.itl_max_ms = None;
            r.first_token_mono_ns = None;
            r.e2e_ms = Some(d.abort_wait_ms);
        } else if every(d.cut_every, i) {
            r.ended_by = "server".into();
            r.incomplete = Some("server_exited".into());
        }
        inputs.requests.push(r);
    }
}

fn run(baseline: Decode, incident: Decode) -> Diagnosis {
    let mut inputs = Inputs::default();
    add(&mut inputs, 100 * S, baseline);
    add(&mut inputs, 200 * S, incident);
    diagnose(
        &inputs,
        TimeWindow {
            start_mono_ns: 100 * S,
            end_mono_ns: 110 * S,
        },
        TimeWindow {
            start_mono_ns: 200 * S,
            end_mono_ns: 210 * S,
        },
    )
}

fn profile(d: &Diagnosis, p: Profile) -> &ProfileChange {
    d.profiles.iter().find(|c| c.profile == p).unwrap()
}

fn tpot(d: &Diagnosis) -> &TpotBranch {
    d.tpot
        .as_ref()
        .unwrap_or_else(|| panic!("no TPOT branch:\n{}", render(d)))
}

#[test]
fn the_same_decoding_twice_regresses_nothing() {
    let d = run(Decode::default(), Decode::default());
    assert!(!d.any_regression, "{}", render(&d));
    assert!(d.profiles.iter().all(|p| !p.regressed), "{}", render(&d));
    assert!(d.tpot.is_none() && d.errors.is_none());
    assert_eq!(d.profiles.len(), 5);
    assert!(
        d.summary.starts_with("No profile regressed"),
        "{}",
        d.summary
    );
    let s = profile(&d, Profile::SuccessRate);
    assert_eq!(s.p50.window, Some(1.0));
}

#[test]
fn more_requests_per_step_at_the_same_cost_per_request_is_batch_growth() {
    // 2 -> 6 requests per step; a step costs 20 -> 45 ms, 10 -> 7.5 ms per request.
    let d = run(
        Decode::default(),
        Decode {
            batch: 6,
            step_ms: 45.0,
            ..Decode::default()
        },
    );
    let text = render(&d);
    assert!(profile(&d, Profile::Tpot).regressed, "{text}");
    assert!(
        !d.regression,
        "a TPOT-only regression runs no TTFT branch: {text}"
    );
    assert_eq!(d.cause, Cause::None);
    let t = tpot(&d);
    assert_eq!(t.cause, Cause::BatchGrowth, "{text}");
    assert_eq!(t.evidence[0].signal, "decode_batch_requests_mean");
    assert!(
        d.summary.starts_with("Regressed: TPOT P99"),
        "{}",
        d.summary
    );
    assert!(text.contains("TPOT / ITL: batch_growth"), "{text}");
    // The evidence names the requests and what they decoded in.
    let slow = &t.slowest_requests[0];
    assert!(slow.request_id.starts_with("200000000000-"), "{slow:?}");
    assert_eq!(slow.batch_mean, Some(6.0));
    assert!(slow.decode_steps >= 20, "{slow:?}");
}

#[test]
fn prefill_mixed_into_decode_steps_is_interference() {
    // Every other step also prefills, and takes 3x as long: TPOT doubles at the same batch.
    let d = run(
        Decode::default(),
        Decode {
            mixed_every: 2,
            stretch: 3.0,
            ..Decode::default()
        },
    );
    let t = tpot(&d);
    assert_eq!(t.cause, Cause::PrefillInterference, "{}", render(&d));
    let e = t
        .evidence
        .iter()
        .find(|e| e.signal == "decode_time_in_prefill_steps_share")
        .unwrap();
    assert!(e.crossed && e.window.unwrap() > 0.45, "{e:?}");
    assert!(t.slowest_requests[0].prefill_share.unwrap() > 0.4);
}

#[test]
fn slower_steps_at_the_same_batch_is_a_degraded_device() {
    let d = run(
        Decode::default(),
        Decode {
            step_ms: 50.0,
            ..Decode::default()
        },
    );
    let t = tpot(&d);
    assert_eq!(t.cause, Cause::DegradedDevice, "{}", render(&d));
    assert!(
        t.evidence
            .iter()
            .any(|e| e.signal == "decode_step_ms_p50" && e.crossed)
    );
    // More requests per step it is not: the batch did not move.
    assert!(
        !t.evidence
            .iter()
            .any(|e| e.signal == "decode_batch_requests_mean" && e.crossed)
    );
}

#[test]
fn requests_preempted_in_their_decode_is_kv_pressure() {
    // A third of the requests lose 900 ms to a preemption's recompute.
    let d = run(
        Decode::default(),
        Decode {
            preempt_every: 3,
            preempt_ms: 900.0,
            ..Decode::default()
        },
    );
    let text = render(&d);
    assert!(profile(&d, Profile::Itl).regressed, "{text}");
    let t = tpot(&d);
    assert_eq!(t.cause, Cause::KvPressure, "{text}");
    assert!(t.slowest_requests[0].preemptions == Some(1), "{text}");
}

#[test]
fn rejections_for_want_of_capacity_are_overload() {
    let d = run(
        Decode::default(),
        Decode {
            fail_every: 4,
            fail_status: 503,
            ..Decode::default()
        },
    );
    let text = render(&d);
    let s = profile(&d, Profile::SuccessRate);
    assert!(s.regressed, "{text}");
    assert_eq!(s.p50.window, Some(0.75));
    let e = d.errors.as_ref().unwrap();
    assert_eq!(e.cause, ErrorCause::OverloadRejections, "{text}");
    assert_eq!(e.failures[0].count.window, 10);
    assert_eq!(e.failures[0].requests.len(), 10);
    assert!(
        text.contains("Errors: Success rate 100.0% -> 75.0%"),
        "{text}"
    );
    assert!(d.any_regression && !d.unexplained);
}

#[test]
fn clients_that_leave_after_long_queue_waits_are_timeouts() {
    let d = run(
        Decode::default(),
        Decode {
            abort_every: 5,
            abort_wait_ms: 30_000.0,
            ..Decode::default()
        },
    );
    let e = d.errors.as_ref().expect("the success rate fell");
    assert_eq!(
        e.cause,
        ErrorCause::ClientTimeoutsAfterQueueWaits,
        "{}",
        render(&d)
    );
}

#[test]
fn requests_cut_by_a_new_engine_process_are_a_restart_and_by_the_same_one_errors() {
    let restarted = run(
        Decode::default(),
        Decode {
            cut_every: 6,
            pid: 8,
            ..Decode::default()
        },
    );
    let e = restarted.errors.as_ref().unwrap();
    assert_eq!(e.cause, ErrorCause::EngineRestart, "{}", render(&restarted));
    assert_eq!(e.new_engine_pids, vec![8]);
    let same = run(
        Decode::default(),
        Decode {
            cut_every: 6,
            ..Decode::default()
        },
    );
    assert_eq!(
        same.errors.as_ref().unwrap().cause,
        ErrorCause::EngineErrors
    );
}

#[test]
fn a_few_failures_at_an_unchanged_rate_are_no_regression() {
    // One in 20 fails in both windows: the rate did not fall.
    let flaky = Decode {
        fail_every: 20,
        fail_status: 500,
        ..Decode::default()
    };
    let d = run(flaky, flaky);
    assert!(
        !profile(&d, Profile::SuccessRate).regressed,
        "{}",
        render(&d)
    );
    assert!(d.errors.is_none());
}
