//! What every request record must say when llama.cpp's scheduler hooks are attached, whichever
//! shape of the server (the xllamacpp extension or the standalone binary) is traced.
use serde_json::Value;

/// A record's integer field, or a panic that names it and shows the record.
pub fn stamp(r: &Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field}: {r:#?}"))
}

fn millis(r: &Value, field: &str) -> f64 {
    r[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field}: {r:#?}"))
}

/// TTFT split into queue wait + prefill (+ the hand-off from the engine's first token to the
/// socket's, with `--token-hooks`); prefill within max(5 ms, 10 %) of the engine's own
/// `timings.prompt_ms`; the engine's stages in order (parked < taken back ≤ admitted < [first
/// token ≤] finished ≤ response end); one prefill step; no preemption. Returns whether the
/// engine parked the request for want of a free slot.
pub fn assert_llamacpp_split(r: &Value, token_hooks: bool) -> bool {
    let queue = millis(r, "queue_wait_ms");
    let prefill = millis(r, "prefill_ms");
    let ttft = millis(r, "ttft_ms");
    let admitted = stamp(r, "admitted_mono_ns");
    let finished = stamp(r, "engine_finished_mono_ns");
    let handoff = if token_hooks {
        // Prefill ends at the engine's own first token; the HTTP thread writes it next.
        let handoff = millis(r, "first_token_handoff_ms");
        assert!(
            (0.0..50.0).contains(&handoff),
            "engine first token precedes the socket's: {r:#?}"
        );
        let first_token = stamp(r, "engine_first_token_mono_ns");
        assert!(admitted < first_token && first_token <= finished, "{r:#?}");
        handoff
    } else {
        // Prefill ends at the socket's first token: no hand-off to report.
        assert!(r["first_token_handoff_ms"].is_null(), "{r:#?}");
        assert!(r["engine_first_token_mono_ns"].is_null(), "{r:#?}");
        0.0
    };
    assert!(
        (queue + prefill + handoff - ttft).abs() < 0.01,
        "queue + prefill (+ hand-off) = TTFT: {r:#?}"
    );
    assert!(admitted < finished, "{r:#?}");
    assert!(finished <= stamp(r, "end_mono_ns"), "{r:#?}");
    let deferred = r["deferred_mono_ns"].as_u64();
    if let Some(deferred) = deferred {
        let requeued = stamp(r, "requeued_mono_ns");
        assert!(deferred < requeued && requeued <= admitted, "{r:#?}");
    }
    assert!(r["engine_task_id"].is_i64(), "{r:#?}");
    assert!(r["engine_slot"].is_u64(), "{r:#?}");
    assert_eq!(r["preemptions"], 0, "llama.cpp does not preempt: {r:#?}");
    // Short prompts fit one batch.
    assert_eq!(r["prefill_steps"], 1, "{r:#?}");
    let engine_prefill = millis(r, "engine_prompt_ms");
    let tolerance = (engine_prefill * 0.10).max(5.0);
    assert!(
        (prefill - engine_prefill).abs() <= tolerance,
        "prefill {prefill:.2} ms vs engine {engine_prefill:.2} ms: {r:#?}"
    );
    deferred.is_some()
}
