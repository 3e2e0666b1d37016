//! Disaggregated (prefill/decode) serving: one client request served by two engines, a prefill
//! server (P) that computes the prompt and hands its KV cache over, and a decode server (D) that
//! streams the tokens. What the bodies say about the hand-off ([`DisaggHints`], digested by the
//! HTTP decoder, never the prompt), what an engine module reads from them ([`DisaggLeg`]), and
//! what the stitched record reports ([`DisaggInfo`]).
use serde::Serialize;

/// Most entries kept from one hand-off object (vLLM's has about fifteen).
pub const MAX_HANDOFF_ENTRIES: usize = 32;
/// Longest key kept; longer keys are skipped (counted in `truncated`).
pub const MAX_HANDOFF_KEY: usize = 64;
/// Longest string value kept as text; longer ones are kept as a length and digest.
pub const MAX_HANDOFF_STR: usize = 256;

/// One value of a hand-off object, reduced to what a join needs. Arrays (block ids, token ids)
/// are never kept: only their length and a digest of their elements' JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffValue {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
    /// An array, a nested object, an over-long string or a non-integer number: its element count
    /// (or byte length, or 1) and a 64-bit FNV-1a digest of its content.
    Digest {
        len: u64,
        hash: u64,
    },
}

/// A JSON object that describes a KV hand-off (vLLM's `kv_transfer_params`), digested.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandoffParams {
    pub entries: Vec<(String, HandoffValue)>,
    /// Entries were left out (too many, or a key too long).
    pub truncated: bool,
}

impl HandoffParams {
    pub fn get(&self, key: &str) -> Option<&HandoffValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            HandoffValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            HandoffValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        match self.get(key)? {
            HandoffValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// Whether the key is present with a value other than null.
    pub fn has(&self, key: &str) -> bool {
        self.get(key)
            .is_some_and(|v| !matches!(v, HandoffValue::Null))
    }
}

/// What a request's and its response's bodies said about a KV hand-off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DisaggHints {
    /// The request body's `kv_transfer_params` (vLLM, and llm-d, which drives vLLM's).
    pub request: Option<HandoffParams>,
    /// The response body's `kv_transfer_params` (a vLLM prefill server's answer).
    pub response: Option<HandoffParams>,
}

impl DisaggHints {
    pub fn is_empty(&self) -> bool {
        self.request.is_none() && self.response.is_none()
    }
}

/// Which half of a disaggregated request one HTTP record served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DisaggRole {
    Prefill,
    Decode,
    /// The P/D proxy's (router's) own record of the client's request, joined to the decode leg
    /// whose stream it relayed.
    Proxy,
}

impl DisaggRole {
    pub fn as_str(self) -> &'static str {
        match self {
            DisaggRole::Prefill => "prefill",
            DisaggRole::Decode => "decode",
            DisaggRole::Proxy => "proxy",
        }
    }
}

/// A leg as its engine module reads it from the hints: the role, and the key both legs name
/// (vLLM: the prefill engine's id and its request id, which P returns and D is sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisaggLeg {
    pub role: DisaggRole,
    /// Which hand-off protocol (`vllm_kv_transfer`).
    pub scheme: &'static str,
    /// Names the prefill leg: equal in P's hand-off and D's.
    pub key: String,
    /// Digest of every field both legs must agree on (block ids, host, port, ...): a D leg
    /// whose key names a P leg but whose fingerprint differs is not joined.
    pub fingerprint: u64,
}

/// What an engine module makes of a record's hints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegParse {
    /// Not a disaggregated request.
    None,
    Leg(DisaggLeg),
    /// The hints say the request is one leg, but not enough to join it: the role, and why.
    Unjoinable(DisaggRole, &'static str),
}

/// The disaggregated view of one leg, written with its record (`disagg`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DisaggInfo {
    /// Shared by both legs of one request; absent on a leg that could not be joined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub role: Option<DisaggRole>,
    pub scheme: Option<&'static str>,
    /// The other leg's `request_id` (on the decode leg, once joined).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_request_id: Option<String>,
    /// Why this leg was not joined (`prefill_leg_not_seen`, `transfer_params_mismatch`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unjoined: Option<&'static str>,
    /// Stitched phases, on the decode leg: P's arrival, P's queue wait and prefill (P's record),
    /// the wait for the remote KV cache (D's queued → D's first schedule, by D's scheduler),
    /// D's first step (D's schedule → D's first token), and the TTFT of the whole request
    /// (P's arrival → D's first token on the wire).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_arrival_mono_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_queue_wait_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_ms: Option<f64>,
    /// P's response end → D's arrival: the proxy's hop between the legs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_wait_ms: Option<f64>,
    /// The KV transfer's own time, as the engine's KV connector measured it (vLLM: the
    /// duration NIXL's transfer agent reported, post → done), and where it came from
    /// (`vllm_kv_connector_stats`). `kv_transfer_wait_ms` is the scheduler-observed wait,
    /// which also holds the steps before the load started and after it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_decode_step_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// On the proxy's record: the prefill leg's `request_id` (`peer_request_id` is the decode
    /// leg's, whose stream the proxy relayed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_request_id: Option<String>,
    /// On the proxy's record: the client's request read by the proxy (its record's arrival).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_arrival_mono_ns: Option<u64>,
    /// On the proxy's record: proxy's arrival → P's arrival (the proxy's hop to P).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_to_prefill_ms: Option<f64>,
    /// On the proxy's record: D's first token on D's wire → the proxy's first token to the
    /// client (the proxy relaying the stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_ms: Option<f64>,
    /// On the proxy's record: the proxy's arrival → its first token to the client: the TTFT as
    /// the client saw it, at the proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ttft_ms: Option<f64>,
    /// On the proxy's record: the decode leg's arrival and first token on D's wire (the prefill
    /// leg's end is `decode_arrival_mono_ns` − `handoff_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_arrival_mono_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_first_token_mono_ns: Option<u64>,
}

/// 64-bit FNV-1a: a stable digest (the same on every agent and every run) for join keys.
pub fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    let mut h = if seed == 0 {
        0xcbf2_9ce4_8422_2325
    } else {
        seed
    };
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
