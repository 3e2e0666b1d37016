use inferscope_model::{DisaggHints, HandoffParams, HandoffValue};

use super::*;

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

/// The P/D proxy's record of the client's request: arrived at `at`, first token relayed at
/// `first`, ended at `end`, streaming `stream`.
fn proxy_record(id: &str, at: u64, first: u64, end: u64, stream: Option<&str>) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        engine: "pd_proxy".into(),
        method: "POST".into(),
        response_id: stream.map(str::to_owned),
        arrival_mono_ns: at * MS,
        first_token_mono_ns: Some(first * MS),
        end_mono_ns: end * MS,
        ..RequestRecord::default()
    }
}

/// The join stage, driven as the pipeline drives it (no engine IPC, no GPU shim): what it
/// hands on, as records.
struct Harness {
    join: crate::join::Join,
    engine: crate::engines::IpcRouter,
}

/// When the harness's records come (monotonic ns): apart from the records' own times.
const T0: u64 = 10_000 * MS;

impl Harness {
    fn new() -> Self {
        Self {
            join: crate::join::Join::new(crate::join::TimelineLimits::default()),
            engine: crate::engines::IpcRouter::default(),
        }
    }

    /// How long a record waits in the join at most.
    fn wait(&self) -> u64 {
        crate::join::TimelineLimits::default().settle_ns
    }

    fn batch(
        &mut self,
        records: impl IntoIterator<Item = RequestRecord>,
        now: u64,
        flush: bool,
    ) -> Vec<RequestRecord> {
        for r in records {
            self.join.push(r, now);
        }
        let mut out = Vec::new();
        if flush {
            self.join.flush(now, &mut self.engine, &mut out);
        } else {
            self.join.poll(now, &mut self.engine, &mut out);
        }
        out.into_iter().map(|t| t.request).collect()
    }

    fn one(&mut self, r: RequestRecord) -> Vec<RequestRecord> {
        self.batch([r], T0, false)
    }

    fn stats(&self) -> &Stats {
        &self.join.stitcher.stats
    }

    fn waiting(&self) -> usize {
        self.join.waiting.len()
    }

    /// A P leg at `p_at` and its D leg at `p_at + 14` (first token on D's wire at +40), D's
    /// stream `stream`, as handed on.
    fn legs(&mut self, n: &str, p_at: u64, stream: &str, now: u64) -> Vec<RequestRecord> {
        let key = format!("cmpl-{n}-0000abcd");
        let p = prefill(&format!("1-{n}-0"), p_at, Some(handoff(&key, 1)));
        let mut d = decode(&format!("2-{n}-0"), p_at + 14, handoff(&key, 1));
        d.response_id = Some(stream.into());
        self.batch([p, d], now, false)
    }
}

#[test]
fn the_proxy_record_carries_its_hops_and_the_stitched_request() {
    let mut s = Harness::new();
    assert_eq!(s.legs("a", 1000, "cmpl-a", T0).len(), 2);
    // The client's request reached the proxy 3 ms before P's; D's first token was relayed
    // 0.5 ms after D wrote it (D's first token at 1040).
    let mut r = proxy_record("3-1-0", 997, 0, 1200, Some("cmpl-a"));
    r.first_token_mono_ns = Some(1040 * MS + MS / 2);
    let out = s.one(r);
    assert_eq!(out.len(), 1);
    let d = info(&out[0]);
    assert_eq!(d.role, Some(DisaggRole::Proxy));
    assert_eq!(d.unjoined, None);
    assert!(d.id.is_some());
    assert_eq!(d.peer_request_id.as_deref(), Some("2-a-0"));
    assert_eq!(d.prefill_request_id.as_deref(), Some("1-a-0"));
    assert_eq!(d.proxy_arrival_mono_ns, Some(997 * MS));
    assert_eq!(d.proxy_to_prefill_ms, Some(3.0));
    assert_eq!(d.handoff_ms, Some(2.0));
    assert_eq!(d.relay_ms, Some(0.5));
    assert_eq!(d.client_ttft_ms, Some(43.5));
    // The servers' view stays: P's arrival → D's first token.
    assert_eq!(d.ttft_ms, Some(40.0));
    assert_eq!(d.kv_transfer_wait_ms, Some(20.0));
    assert_eq!(d.decode_arrival_mono_ns, Some(1014 * MS));
    assert_eq!(s.stats().get(Counter::DisaggProxyJoined), 1);
    assert_eq!(s.stats().get(Counter::DisaggProxyUnjoined), 0);
}

#[test]
fn a_proxy_record_that_comes_first_waits_for_its_decode_leg() {
    let mut s = Harness::new();
    // The decode leg is still held for its engine's word: the proxy's record waits.
    assert!(
        s.one(proxy_record("3-1-0", 997, 1041, 1200, Some("cmpl-b")))
            .is_empty()
    );
    assert_eq!(s.waiting(), 1);
    let out = s.legs("b", 1000, "cmpl-b", T0 + s.wait() / 2);
    // The P leg, the D leg, then the proxy's record that waited for it.
    assert_eq!(out.len(), 3);
    assert_eq!(info(&out[1]).role, Some(DisaggRole::Decode));
    assert_eq!(info(&out[2]).role, Some(DisaggRole::Proxy));
    assert_eq!(info(&out[2]).peer_request_id.as_deref(), Some("2-b-0"));
    assert_eq!(s.waiting(), 0);
}

#[test]
fn a_proxy_record_whose_decode_leg_never_comes_is_handed_on_in_bounded_time() {
    let mut s = Harness::new();
    let t0 = T0;
    // A stream id no leg has: waits, then handed on unjoined once its wait is over, with no
    // record at all coming in the meantime.
    let r = proxy_record("3-1-0", 10, 20, 30, Some("cmpl-nobody"));
    assert!(s.one(r).is_empty());
    assert!(s.batch([], t0 + s.wait() / 2, false).is_empty());
    let out = s.batch([], t0 + s.wait(), false);
    assert_eq!(out.len(), 1);
    assert_eq!(info(&out[0]).role, Some(DisaggRole::Proxy));
    assert_eq!(info(&out[0]).unjoined, Some("decode_leg_not_seen"));
    assert_eq!(info(&out[0]).id, None);
    assert_eq!(s.stats().get(Counter::DisaggProxyUnjoined), 1);
    // The agent stopping: a proxy record and its decode leg in the last batch still join;
    // whatever waits after it is handed on.
    let key = "cmpl-last-0000abcd";
    let p = prefill("1-last-0", 1000, Some(handoff(key, 1)));
    let mut d = decode("2-last-0", 1014, handoff(key, 1));
    d.response_id = Some("cmpl-last".into());
    let last = proxy_record("3-last-0", 990, 1041, 1200, Some("cmpl-last"));
    let out = s.batch([p, last, d], t0, true);
    assert_eq!(out.len(), 3);
    assert_eq!(info(&out[2]).peer_request_id.as_deref(), Some("2-last-0"));
    assert!(
        s.one(proxy_record("3-2-0", 10, 20, 30, Some("x")))
            .is_empty()
    );
    assert_eq!(s.batch([], t0, true).len(), 1);
    // No stream id at all (an error answer): unjoined at once.
    let out = s.one(proxy_record("3-3-0", 10, 20, 30, None));
    assert_eq!(info(&out[0]).unjoined, Some("no_stream_id"));
    // A proxy's health check is no client request of a P/D pair.
    let mut get = proxy_record("3-4-0", 10, 20, 30, None);
    get.method = "GET".into();
    let out = s.one(get);
    assert!(out[0].disagg.is_none());
}

#[test]
fn two_decode_legs_with_one_stream_id_are_ambiguous() {
    let mut s = Harness::new();
    // A proxy that retried D (or two requests a server gave one id): both legs stream
    // `cmpl-dup` within the proxy's request, which cannot tell which it relayed.
    s.legs("c", 1000, "cmpl-dup", T0);
    s.legs("d", 1002, "cmpl-dup", T0);
    let out = s.one(proxy_record("3-1-0", 990, 1050, 1300, Some("cmpl-dup")));
    assert_eq!(info(&out[0]).unjoined, Some("decode_leg_ambiguous"));
    assert_eq!(info(&out[0]).id, None);
    // A later proxy request with the same stream id sees only the legs within its own
    // time: the second of two requests, one after the other, joins its own leg.
    s.legs("e", 2000, "cmpl-again", T0);
    s.legs("f", 3000, "cmpl-again", T0);
    let first = s.one(proxy_record("3-2-0", 1999, 2050, 2200, Some("cmpl-again")));
    assert_eq!(info(&first[0]).peer_request_id.as_deref(), Some("2-e-0"));
    let second = s.one(proxy_record("3-3-0", 2999, 3050, 3200, Some("cmpl-again")));
    assert_eq!(info(&second[0]).peer_request_id.as_deref(), Some("2-f-0"));
    // A replayed proxy record claims no leg twice.
    let replay = s.one(proxy_record("3-4-0", 2999, 3050, 3200, Some("cmpl-again")));
    assert_eq!(info(&replay[0]).unjoined, Some("decode_leg_already_joined"));
}

#[test]
fn a_decode_leg_outside_the_proxy_request_is_not_its() {
    let mut s = Harness::new();
    s.legs("g", 1000, "cmpl-g", T0);
    // The proxy's request came after P's leg arrived: that P leg was not sent by it.
    let late = proxy_record("3-1-0", 1005, 1050, 1200, Some("cmpl-g"));
    assert!(s.one(late).is_empty(), "waits: its own leg may still come");
    let out = s.batch([], T0 + s.wait(), false);
    assert_eq!(info(&out[0]).unjoined, Some("decode_leg_not_seen"));
}

#[test]
fn user_claimed_processes_are_proxies_only_where_they_relayed_a_leg() {
    let mut s = Harness::new();
    s.legs("h", 1000, "cmpl-h", T0);
    let mut custom = proxy_record("3-1-0", 990, 1050, 1200, Some("cmpl-h"));
    custom.engine = "custom".into();
    let out = s.one(custom);
    assert_eq!(info(&out[0]).role, Some(DisaggRole::Proxy));
    assert_eq!(info(&out[0]).peer_request_id.as_deref(), Some("2-h-0"));
    // Another user-claimed server's ordinary request is left alone, at once.
    let mut other = proxy_record("3-2-0", 990, 1050, 1200, Some("cmpl-unrelated"));
    other.engine = "custom".into();
    let out = s.one(other);
    assert!(out[0].disagg.is_none());
    assert_eq!(s.waiting(), 0);
}

#[test]
fn decode_legs_no_proxy_claims_are_counted_where_a_proxy_is_traced() {
    let late = || {
        record(
            "9-9-0",
            0,
            1000 + proxy::DECODE_WAIT_NS / MS + 200,
            DisaggHints::default(),
        )
    };
    // No proxy traced: decode legs that nobody claims are no loss.
    let mut s = Harness::new();
    s.legs("i", 1000, "cmpl-i", T0);
    s.one(late());
    assert_eq!(s.stats().get(Counter::DisaggLegsWithoutProxy), 0);
    // A proxy traced: the decode leg sent past it is counted once it has waited long enough.
    let mut s = Harness::new();
    s.legs("j", 1000, "cmpl-j", T0);
    s.legs("k", 1100, "cmpl-k", T0);
    s.one(proxy_record("3-1-0", 1099, 1150, 1300, Some("cmpl-k")));
    s.one(late());
    assert_eq!(s.stats().get(Counter::DisaggLegsWithoutProxy), 1);
    assert_eq!(s.stats().get(Counter::DisaggProxyJoined), 1);
}

#[test]
fn remembered_decode_legs_are_bounded() {
    let mut s = Harness::new();
    // A proxy is traced, so a decode leg forgotten unclaimed is a loss.
    s.one(proxy_record("3-0-0", 0, 1, 2, None));
    for i in 0..proxy::MAX_DECODE_LEGS + 2 {
        s.legs(&i.to_string(), 10, &format!("cmpl-{i}"), T0);
    }
    assert_eq!(s.stats().get(Counter::DisaggDecodeLegsEvicted), 2);
    // The first leg was forgotten: its proxy record waits, then is handed on unjoined.
    assert!(
        s.one(proxy_record("3-1-0", 5, 60, 200, Some("cmpl-0")))
            .is_empty()
    );
    let last = s.one(proxy_record("3-2-0", 5, 60, 200, Some("cmpl-16385")));
    assert_eq!(info(&last[0]).peer_request_id.as_deref(), Some("2-16385-0"));
}
