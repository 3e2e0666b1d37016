//! The one-line-per-request view printed while recording to a terminal.
use inferscope_model::{RequestRecord, clock::ms_number};

fn ms(v: Option<f64>) -> String {
    ms_number(v, 1, "-")
}

pub(crate) fn header() -> String {
    format!(
        "{:<16} {:>7} {:>5} {:>9} {:>9} {:>9} {:>8} {:>9} {:>6} {:>6} {:>6}  {}",
        "request",
        "pid",
        "status",
        "ttft_ms",
        "queue_ms",
        "prefill",
        "tpot_ms",
        "e2e_ms",
        "chunks",
        "p_tok",
        "c_tok",
        "id"
    )
}

pub(crate) fn line(r: &RequestRecord) -> String {
    let opt = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
    format!(
        "{:<16} {:>7} {:>5} {:>9} {:>9} {:>9} {:>8} {:>9.1} {:>6} {:>6} {:>6}  {}{}",
        r.request_id,
        r.pid,
        r.status.map_or_else(|| "-".into(), |s| s.to_string()),
        ms(r.ttft_ms),
        ms(r.queue_wait_ms),
        ms(r.prefill_ms),
        ms(r.tpot_ms),
        r.e2e_ms,
        r.output_chunks,
        opt(r.prompt_tokens),
        opt(r.completion_tokens),
        r.response_id.as_deref().unwrap_or("-"),
        match (&r.incomplete, r.ended_by) {
            (_, crate::correlate::EndedBy::Client) => "  (aborted by the client)".to_owned(),
            (Some(reason), _) => format!("  (incomplete: {reason})"),
            (None, crate::correlate::EndedBy::Server) => "  (cut by the server)".to_owned(),
            (None, _) => String::new(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_lines_have_the_same_columns() {
        let record = RequestRecord {
            request_id: "1-2-0".into(),
            response_id: Some("chatcmpl-x".into()),
            ttft_ms: Some(12.5),
            queue_wait_ms: Some(2.0),
            prefill_ms: Some(10.5),
            ..Default::default()
        };
        let columns = |s: &str| s.split_whitespace().count();
        assert_eq!(columns(&header()), columns(&line(&record)));
        assert!(line(&record).contains("10.5"));
    }
}
