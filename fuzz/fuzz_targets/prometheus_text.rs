//! Feeds arbitrary bytes to the Prometheus text parser (what an engine's metrics endpoint
//! returned). Beyond "never panics" it checks the bounds: no more samples than the limit, names
//! that are valid metric names, and no more labels than the limit.
#![no_main]

use inferscope_decode::prometheus::{Limits, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, body)) = data.split_first() else {
        return;
    };
    let limits = if cfg & 1 == 0 {
        Limits::default()
    } else {
        // Small limits reach the truncation and drop paths with small inputs.
        Limits {
            max_bytes: usize::from(cfg),
            max_line_bytes: usize::from(cfg >> 2),
            max_labels: usize::from(cfg >> 5),
            max_samples: usize::from(cfg >> 4),
        }
    };
    let mut seen = 0usize;
    let stats = parse(body, &limits, |s| {
        seen += 1;
        assert!(!s.name.is_empty());
        assert!(
            s.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        );
        assert!(!s.name.as_bytes()[0].is_ascii_digit());
        assert!(s.labels.len() <= limits.max_labels);
    });
    assert!(seen <= limits.max_samples);
    assert_eq!(seen as u64, stats.samples);
    assert_eq!(stats.truncated, body.len() > limits.max_bytes);
});
