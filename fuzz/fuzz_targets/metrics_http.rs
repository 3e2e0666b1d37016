//! Feeds arbitrary bytes, as an engine's answer to a metrics GET, to the response parser the
//! scraper uses, prefix by prefix as reads would deliver them. Beyond "never panics": a body is
//! never larger than the limit, and once the framing says a body is complete, more bytes do not
//! change it.
#![no_main]

use inferscope::capture::metrics::http::parse_response;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let max_body = if cfg & 1 == 0 { 1 << 20 } else { usize::from(cfg >> 1) };
    let step = usize::from(cfg >> 4) + 1;
    let mut complete: Option<Vec<u8>> = None;
    let mut end = 0;
    while end < rest.len() {
        end = (end + step).min(rest.len());
        match parse_response(&rest[..end], max_body, false) {
            Ok(Some(body)) => {
                assert!(body.len() <= max_body);
                if let Some(first) = &complete {
                    assert_eq!(first, &body, "more bytes changed a complete body");
                }
                complete = Some(body);
            }
            Ok(None) => assert!(complete.is_none(), "a complete body became incomplete"),
            Err(_) => {}
        }
    }
    if let Ok(Some(body)) = parse_response(rest, max_body, true) {
        assert!(body.len() <= max_body);
    }
});
