//! Feeds arbitrary bytes to `inferscope diagnose`'s file readers (request, step, engine,
//! device and engine-config JSON Lines) and window parser, then runs the diagnosis and the report on whatever
//! parsed. Beyond "never panics": counts add up and the confidence stays in 0..=1.
//!
//! Input layout: byte 0 picks which reader sees the bytes; up to the first NUL is the window
//! text (`BASELINE|WINDOW`), the rest the file.
#![no_main]

use inferscope::testing::diagnose::{
    self, DeviceSample, EngineConfigSample, EngineSample, Inputs, RequestSample, Timeline,
    parse_window, read_jsonl, read_steps,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let (spec, file) = match rest.iter().position(|b| *b == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&b""[..], rest),
    };
    let mut inputs = Inputs::default();
    let Ok((requests, stats)) = read_jsonl::<RequestSample, _>(file) else {
        return;
    };
    let lines = file.split(|b| *b == b'\n').count() as u64;
    assert!(stats.parsed + stats.invalid + stats.too_long <= lines);
    inputs.requests = requests;
    match cfg % 5 {
        1 => inputs.steps = read_steps(file).map(|v| v.0).unwrap_or_default(),
        2 => {
            inputs.engine = read_jsonl::<EngineSample, _>(file)
                .map(|v| v.0)
                .unwrap_or_default()
        }
        3 => {
            inputs.devices = read_jsonl::<DeviceSample, _>(file)
                .map(|v| v.0)
                .unwrap_or_default()
        }
        4 => {
            inputs.configs = read_jsonl::<EngineConfigSample, _>(file)
                .map(|v| v.0)
                .unwrap_or_default()
        }
        _ => {}
    }
    let spec = String::from_utf8_lossy(spec);
    let (b, w) = spec.split_once('|').unwrap_or(("..+10s", "-10s.."));
    let (Ok(b), Ok(w)) = (parse_window(b), parse_window(w)) else {
        return;
    };
    let Some(timeline) = Timeline::of(&inputs.requests) else {
        return;
    };
    let Ok((base, win)) = timeline.windows(b, w) else {
        return;
    };
    let d = diagnose::diagnose(&inputs, base, win);
    assert!((0.0..=1.0).contains(&d.confidence));
    let shares: f64 = d.causes.iter().map(|c| c.share).sum();
    assert!(d.causes.iter().all(|c| (0.0..=1.0).contains(&c.share)));
    assert!(shares <= 1.0 + 0.01 * d.causes.len() as f64, "{shares}");
    assert!(d.preempted_requests.len() <= 20);
    let _ = diagnose::render(&d);
});
