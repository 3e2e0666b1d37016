use super::*;
use crate::model::{DisaggHints, HandoffParams, HandoffValue};

const MS: u64 = 1_000_000;

fn params(entries: &[(&str, HandoffValue)]) -> HandoffParams {
    HandoffParams {
        entries: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        truncated: false,
    }
}

/// What a vLLM prefill server answers (and the proxy forwards to D).
fn handoff(p_request: &str, blocks: u64) -> HandoffParams {
    params(&[
        ("do_remote_prefill", HandoffValue::Bool(true)),
        ("do_remote_decode", HandoffValue::Bool(false)),
        ("remote_engine_id", HandoffValue::Str("p-engine".into())),
        ("remote_request_id", HandoffValue::Str(p_request.into())),
        (
            "remote_block_ids",
            HandoffValue::Digest {
                len: 4,
                hash: blocks,
            },
        ),
        ("remote_host", HandoffValue::Str("127.0.0.1".into())),
        ("remote_port", HandoffValue::Int(5600)),
    ])
}

fn record(id: &str, arrival_ms: u64, end_ms: u64, hints: DisaggHints) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        engine: "vllm".into(),
        x_request_id: Some("shared-by-both-legs".into()),
        arrival_mono_ns: arrival_ms * MS,
        end_mono_ns: end_ms * MS,
        disagg_hints: Some(Box::new(hints)),
        ..RequestRecord::default()
    }
}

/// A P leg: arrived at `at`, queued +1, scheduled +3, first output +10, answered +12.
fn prefill(id: &str, at: u64, answer: Option<HandoffParams>) -> RequestRecord {
    let mut r = record(
        id,
        at,
        at + 12,
        DisaggHints {
            request: Some(params(&[
                ("do_remote_decode", HandoffValue::Bool(true)),
                ("do_remote_prefill", HandoffValue::Bool(false)),
                ("remote_engine_id", HandoffValue::Null),
            ])),
            response: answer,
        },
    );
    r.engine_queued_mono_ns = Some((at + 1) * MS);
    r.admitted_mono_ns = Some((at + 3) * MS);
    r.engine_first_output_mono_ns = Some((at + 10) * MS);
    r
}

/// A D leg sent `sent`: arrived at `at`, queued +1, scheduled (KV in) +21, first output +25,
/// first token on the wire +26.
fn decode(id: &str, at: u64, sent: HandoffParams) -> RequestRecord {
    let mut r = record(
        id,
        at,
        at + 100,
        DisaggHints {
            request: Some(sent),
            response: None,
        },
    );
    r.engine_queued_mono_ns = Some((at + 1) * MS);
    r.admitted_mono_ns = Some((at + 21) * MS);
    r.engine_first_output_mono_ns = Some((at + 25) * MS);
    r.first_token_mono_ns = Some((at + 26) * MS);
    r
}

fn info(r: &RequestRecord) -> &DisaggInfo {
    r.disagg.as_deref().expect("a disaggregated leg")
}

#[test]
fn joins_the_two_legs_with_every_phase() {
    let mut s = Stitcher::default();
    let mut p = prefill("1-1-0", 1000, Some(handoff("chatcmpl-a-0000aaaa", 1)));
    s.stitch(&mut p);
    let mut d = decode("2-1-0", 1014, handoff("chatcmpl-a-0000aaaa", 1));
    s.stitch(&mut d);
    let (p, d) = (info(&p), info(&d));
    assert_eq!(p.role, Some(DisaggRole::Prefill));
    assert_eq!(d.role, Some(DisaggRole::Decode));
    assert!(p.id.is_some());
    assert_eq!(p.id, d.id);
    assert_eq!(d.peer_request_id.as_deref(), Some("1-1-0"));
    assert_eq!(d.unjoined, None);
    assert_eq!(d.prefill_arrival_mono_ns, Some(1000 * MS));
    assert_eq!(d.prefill_queue_wait_ms, Some(2.0));
    assert_eq!(d.prefill_ms, Some(7.0));
    assert_eq!(d.handoff_ms, Some(2.0));
    assert_eq!(d.kv_transfer_wait_ms, Some(20.0));
    assert_eq!(d.first_decode_step_ms, Some(4.0));
    assert_eq!(d.ttft_ms, Some(40.0));
    assert_eq!(s.stats.get(Counter::DisaggLegsJoined), 1);
}

#[test]
fn a_request_without_transfer_params_is_no_leg() {
    let mut s = Stitcher::default();
    let mut r = record("1-1-0", 0, 5, DisaggHints::default());
    s.stitch(&mut r);
    assert!(r.disagg.is_none());
    let mut plain = record("1-1-1", 0, 5, DisaggHints::default());
    plain.disagg_hints = None;
    s.stitch(&mut plain);
    assert!(plain.disagg.is_none());
}

#[test]
fn a_decode_leg_whose_prefill_leg_was_never_seen_stays_separate() {
    let mut s = Stitcher::default();
    let mut d = decode("2-1-0", 50, handoff("chatcmpl-b-0000bbbb", 1));
    s.stitch(&mut d);
    let d = info(&d);
    assert_eq!(d.id, None);
    assert_eq!(d.unjoined, Some("prefill_leg_not_seen"));
    assert_eq!(s.stats.get(Counter::DisaggLegsUnjoined), 1);
}

#[test]
fn forged_params_are_not_joined() {
    let mut s = Stitcher::default();
    let mut p = prefill("1-1-0", 0, Some(handoff("chatcmpl-c-0000cccc", 1)));
    s.stitch(&mut p);
    // The right P request id but other blocks: not what P answered.
    let mut other_blocks = decode("2-1-0", 20, handoff("chatcmpl-c-0000cccc", 2));
    s.stitch(&mut other_blocks);
    assert_eq!(
        info(&other_blocks).unjoined,
        Some("transfer_params_mismatch")
    );
    assert_eq!(info(&other_blocks).id, None);
    // What P answered, but sent before P had answered it.
    let mut early = decode("2-1-1", 5, handoff("chatcmpl-c-0000cccc", 1));
    s.stitch(&mut early);
    assert_eq!(info(&early).unjoined, Some("before_prefill_response"));
    // Params that name no engine.
    let mut incomplete = decode(
        "2-1-2",
        20,
        params(&[("do_remote_prefill", HandoffValue::Bool(true))]),
    );
    s.stitch(&mut incomplete);
    assert_eq!(
        info(&incomplete).unjoined,
        Some("transfer_params_incomplete")
    );
    // Missing params on D: not a leg at all (a plain request).
    let mut missing = record("2-1-3", 20, 30, DisaggHints::default());
    s.stitch(&mut missing);
    assert!(missing.disagg.is_none());
    // The genuine D leg still joins.
    let mut d = decode("2-1-4", 20, handoff("chatcmpl-c-0000cccc", 1));
    s.stitch(&mut d);
    assert_eq!(info(&d).peer_request_id.as_deref(), Some("1-1-0"));
}

#[test]
fn a_prefill_leg_joins_one_decode_leg_only() {
    let mut s = Stitcher::default();
    let mut p = prefill("1-1-0", 0, Some(handoff("chatcmpl-d-0000dddd", 1)));
    s.stitch(&mut p);
    let mut d = decode("2-1-0", 20, handoff("chatcmpl-d-0000dddd", 1));
    s.stitch(&mut d);
    assert!(info(&d).id.is_some());
    let mut replay = decode("2-1-1", 30, handoff("chatcmpl-d-0000dddd", 1));
    s.stitch(&mut replay);
    assert_eq!(info(&replay).unjoined, Some("prefill_leg_already_joined"));
    assert_eq!(info(&replay).id, None);
}

#[test]
fn prefill_retries_stay_separate() {
    let mut s = Stitcher::default();
    // The proxy retried P under the same X-Request-Id: the first try failed (no hand-off in
    // its answer), the second answered. vLLM gives each try its own engine request id.
    let mut failed = prefill("1-1-0", 0, None);
    s.stitch(&mut failed);
    assert_eq!(
        info(&failed).unjoined,
        Some("prefill_response_without_params")
    );
    let mut first = prefill("1-2-0", 20, Some(handoff("chatcmpl-e-0000eee1", 1)));
    s.stitch(&mut first);
    let mut second = prefill("1-3-0", 40, Some(handoff("chatcmpl-e-0000eee2", 2)));
    s.stitch(&mut second);
    // D was sent the second try's hand-off: it joins that one, not the first.
    let mut d = decode("2-1-0", 60, handoff("chatcmpl-e-0000eee2", 2));
    s.stitch(&mut d);
    assert_eq!(info(&d).peer_request_id.as_deref(), Some("1-3-0"));
    assert_eq!(info(&d).id, info(&second).id);
    assert_ne!(info(&first).id, info(&second).id);
}

#[test]
fn two_prefill_legs_with_one_hand_off_are_ambiguous() {
    let mut s = Stitcher::default();
    // Two P legs that answered the very same hand-off (a P server that reuses ids): D cannot
    // tell which it continues.
    for (id, at) in [("1-1-0", 0), ("1-2-0", 5)] {
        let mut p = prefill(id, at, Some(handoff("chatcmpl-f-0000ffff", 1)));
        s.stitch(&mut p);
    }
    let mut d = decode("2-1-0", 40, handoff("chatcmpl-f-0000ffff", 1));
    s.stitch(&mut d);
    assert_eq!(info(&d).unjoined, Some("prefill_leg_ambiguous"));
}

#[test]
fn prefill_legs_are_bounded_and_expire() {
    let mut s = Stitcher::default();
    for i in 0..MAX_PREFILL_LEGS + 3 {
        let mut p = prefill(
            &format!("1-{i}-0"),
            1,
            Some(handoff(&format!("chatcmpl-{i}-00000000"), 1)),
        );
        s.stitch(&mut p);
    }
    assert_eq!(s.legs, MAX_PREFILL_LEGS);
    assert_eq!(s.stats.get(Counter::DisaggPrefillLegsEvicted), 3);
    let mut forgotten = decode("2-1-0", 20, handoff("chatcmpl-0-00000000", 1));
    s.stitch(&mut forgotten);
    assert_eq!(info(&forgotten).unjoined, Some("prefill_leg_not_seen"));
    // Ten minutes later every unread leg is forgotten.
    let mut late = record("3-1-0", 0, MAX_AGE_NS / MS + 100, DisaggHints::default());
    s.stitch(&mut late);
    assert_eq!(s.legs, 0);
    assert!(s.prefill.is_empty());
    assert_eq!(
        s.stats.get(Counter::DisaggPrefillLegsEvicted),
        3 + MAX_PREFILL_LEGS as u64
    );
}
