//! vLLM's disaggregated prefill/decode hand-off, as its KV connectors (NIXL, and the others
//! built on `KVConnectorBase_V1`) and their proxies put it in the bodies:
//!
//! - the proxy sends P the request with `kv_transfer_params: {"do_remote_decode": true, ...}`
//!   (and `max_tokens: 1`);
//! - P's `request_finished` returns, in the response's `kv_transfer_params`,
//!   `do_remote_prefill: true`, `remote_engine_id`, `remote_request_id` (P's engine request id),
//!   `remote_block_ids`, `remote_host`, `remote_port`, ...;
//! - the proxy sends D the request with those params, and D's scheduler keeps the request
//!   `WAITING_FOR_REMOTE_KVS` until its connector reports the blocks received.
//!
//! So the P leg's key is in its response, the D leg's in its request, and they are equal.
use inferscope_model::{
    DisaggHints, DisaggLeg, DisaggRole, HandoffParams, HandoffValue, LegParse, disagg::fnv1a,
};

pub(super) const SCHEME: &str = "vllm_kv_transfer";

/// The fields P returns and D must be sent unchanged: the join's fingerprint.
const PINNED: &[&str] = &[
    "remote_engine_id",
    "remote_request_id",
    "remote_block_ids",
    "remote_host",
    "remote_port",
];

pub(super) fn leg(hints: &DisaggHints) -> LegParse {
    let Some(request) = &hints.request else {
        return LegParse::None;
    };
    let decode_remotely = request.bool("do_remote_decode") == Some(true);
    let prefill_remotely = request.bool("do_remote_prefill") == Some(true);
    match (decode_remotely, prefill_remotely) {
        (false, false) => LegParse::None,
        (true, true) => LegParse::Unjoinable(DisaggRole::Decode, "transfer_params_conflicting"),
        (true, false) => match &hints.response {
            // P answers with the params D needs; without them no D leg can name this one
            // (P failed, or its connector returned none).
            None => LegParse::Unjoinable(DisaggRole::Prefill, "prefill_response_without_params"),
            Some(response) => keyed(DisaggRole::Prefill, response),
        },
        (false, true) => keyed(DisaggRole::Decode, request),
    }
}

fn keyed(role: DisaggRole, params: &HandoffParams) -> LegParse {
    let (Some(engine), Some(blocks)) = (
        params.str("remote_engine_id"),
        params.get("remote_block_ids"),
    ) else {
        return LegParse::Unjoinable(role, "transfer_params_incomplete");
    };
    // Before vLLM added `remote_request_id` (NIXL metadata version 2) the block ids name the
    // prefill: they are P's blocks, held for this request until D reads them.
    let request = match (params.str("remote_request_id"), blocks) {
        (Some(id), _) => id.to_owned(),
        (None, HandoffValue::Digest { len, hash }) if *len > 0 => format!("blocks:{hash:016x}"),
        _ => return LegParse::Unjoinable(role, "transfer_params_incomplete"),
    };
    let mut fingerprint = fnv1a(SCHEME.as_bytes(), 0);
    for key in PINNED {
        fingerprint = fnv1a(key.as_bytes(), fingerprint);
        let value = match params.get(key) {
            None | Some(HandoffValue::Null) => String::from("-"),
            Some(HandoffValue::Bool(b)) => b.to_string(),
            Some(HandoffValue::Int(i)) => i.to_string(),
            Some(HandoffValue::Str(s)) => format!("\"{s}"),
            Some(HandoffValue::Digest { len, hash }) => format!("{len}:{hash:x}"),
        };
        fingerprint = fnv1a(value.as_bytes(), fingerprint);
    }
    LegParse::Leg(DisaggLeg {
        role,
        scheme: SCHEME,
        key: format!("{engine}/{request}"),
        fingerprint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(entries: &[(&str, HandoffValue)]) -> HandoffParams {
        HandoffParams {
            entries: entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            truncated: false,
        }
    }

    fn handoff(request_id: &str, blocks: u64) -> HandoffParams {
        params(&[
            ("do_remote_prefill", HandoffValue::Bool(true)),
            ("do_remote_decode", HandoffValue::Bool(false)),
            ("remote_engine_id", HandoffValue::Str("engine-p".into())),
            ("remote_request_id", HandoffValue::Str(request_id.into())),
            (
                "remote_block_ids",
                HandoffValue::Digest {
                    len: 2,
                    hash: blocks,
                },
            ),
            ("remote_host", HandoffValue::Str("10.0.0.1".into())),
            ("remote_port", HandoffValue::Int(5600)),
        ])
    }

    fn prefill_request() -> HandoffParams {
        params(&[
            ("do_remote_decode", HandoffValue::Bool(true)),
            ("do_remote_prefill", HandoffValue::Bool(false)),
            ("remote_engine_id", HandoffValue::Null),
            ("remote_block_ids", HandoffValue::Null),
        ])
    }

    #[test]
    fn prefill_and_decode_legs_name_the_same_key() {
        let p = leg(&DisaggHints {
            request: Some(prefill_request()),
            response: Some(handoff("chatcmpl-x-1234abcd", 7)),
        });
        let d = leg(&DisaggHints {
            request: Some(handoff("chatcmpl-x-1234abcd", 7)),
            response: None,
        });
        let (LegParse::Leg(p), LegParse::Leg(d)) = (p, d) else {
            panic!("both legs parse");
        };
        assert_eq!((p.role, d.role), (DisaggRole::Prefill, DisaggRole::Decode));
        assert_eq!(p.key, "engine-p/chatcmpl-x-1234abcd");
        assert_eq!((p.key, p.fingerprint), (d.key, d.fingerprint));
    }

    #[test]
    fn other_blocks_are_another_fingerprint() {
        let (LegParse::Leg(a), LegParse::Leg(b)) = (
            keyed(DisaggRole::Decode, &handoff("r", 7)),
            keyed(DisaggRole::Decode, &handoff("r", 8)),
        ) else {
            panic!("both parse");
        };
        assert_eq!(a.key, b.key);
        assert_ne!(a.fingerprint, b.fingerprint);
    }

    #[test]
    fn bad_params_are_unjoinable_with_a_reason() {
        let none = DisaggHints::default();
        assert_eq!(leg(&none), LegParse::None);
        let plain = DisaggHints {
            request: Some(params(&[("foo", HandoffValue::Int(1))])),
            response: None,
        };
        assert_eq!(leg(&plain), LegParse::None);
        let p_failed = DisaggHints {
            request: Some(prefill_request()),
            response: None,
        };
        assert_eq!(
            leg(&p_failed),
            LegParse::Unjoinable(DisaggRole::Prefill, "prefill_response_without_params")
        );
        let no_engine = DisaggHints {
            request: Some(params(&[("do_remote_prefill", HandoffValue::Bool(true))])),
            response: None,
        };
        assert_eq!(
            leg(&no_engine),
            LegParse::Unjoinable(DisaggRole::Decode, "transfer_params_incomplete")
        );
        let both = DisaggHints {
            request: Some(params(&[
                ("do_remote_prefill", HandoffValue::Bool(true)),
                ("do_remote_decode", HandoffValue::Bool(true)),
            ])),
            response: None,
        };
        assert_eq!(
            leg(&both),
            LegParse::Unjoinable(DisaggRole::Decode, "transfer_params_conflicting")
        );
    }
}
