//! Fields of an HTTP/2 stream's record that a call (`h2_calls`) and a plain stream
//! (`h2_connection`) fill alike.
use inferscope_decode::http2::{Messages, Value};

use super::request::RequestProgress;

/// A record's tokens from the gRPC response messages of its stream or call: first and last
/// message, their count and the gaps between them.
pub(super) fn tokens_from(p: &mut RequestProgress, response: &Messages) {
    p.first_token_ns = response.first_ts_ns;
    p.last_token_ns = response.last_ts_ns;
    p.output_chunks = u64::from(response.count);
    p.gaps_ns = response.gaps_ns.iter().map(|&g| u64::from(g)).collect();
    p.gaps_dropped = response.gaps_dropped;
}

/// The content-type for the record: `unknown` when it came from an HPACK entry never seen.
pub(super) fn content_type(v: &Value<String>) -> Option<String> {
    match v {
        Value::Known(v) => Some(v.clone()),
        Value::Unknown => Some("unknown".to_owned()),
        Value::Absent => None,
    }
}

/// A header for the record: `unknown` when it came from an HPACK entry never seen.
pub(super) fn text(v: &Value<String>) -> String {
    match v {
        Value::Known(s) => s.clone(),
        Value::Unknown => "unknown".to_owned(),
        Value::Absent => String::new(),
    }
}
