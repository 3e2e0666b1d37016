//! Feeds arbitrary bytes to the inert pickle reader (with tight and default bounds) and, framed
//! as ZMTP messages split at arbitrary points, to SGLang's IPC decoder. Beyond "never panics" it
//! checks the documented bounds: no value nests deeper than the limit, and kept strings are
//! never longer than MAX_KEPT_STR.
//!
//! Input layout: byte 0 picks the limits and the syscall size; the rest is one pickle.
#![no_main]

use inferscope::testing::{IpcBytes, IpcDirection, engine};
use inferscope_decode::pickle::{self, MAX_KEPT_STR, PickleLimits, Value};
use libfuzzer_sys::fuzz_target;

fn check(v: &Value, limits: &PickleLimits, depth: u16) {
    assert!(depth <= limits.max_depth + 1);
    match v {
        Value::Str(s) => assert!(s.len() <= MAX_KEPT_STR),
        Value::Tuple(items, _) | Value::List(items, _) | Value::Set(items, _) => {
            items.iter().for_each(|i| check(i, limits, depth + 1))
        }
        Value::Dict(entries, _) => entries.iter().for_each(|(k, v)| {
            check(k, limits, depth + 1);
            check(v, limits, depth + 1)
        }),
        Value::Reduce(a, b, _) | Value::NewObj(a, b, _) | Value::Build(a, b, _) => {
            check(a, limits, depth + 1);
            check(b, limits, depth + 1)
        }
        _ => {}
    }
}

/// A ZMTP 3.0 NULL greeting, READY(PUSH), then `body` as one frame.
fn zmtp(body: &[u8]) -> Vec<u8> {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0];
    let mut mech = [0u8; 20];
    mech[..4].copy_from_slice(b"NULL");
    g.extend_from_slice(&mech);
    g.extend_from_slice(&[0u8; 32]);
    let mut ready = vec![5];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&4u32.to_be_bytes());
    ready.extend_from_slice(b"PUSH");
    g.push(0x04);
    g.push(ready.len() as u8);
    g.extend_from_slice(&ready);
    g.push(0x02);
    g.extend_from_slice(&(body.len() as u64).to_be_bytes());
    g.extend_from_slice(body);
    g
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, body)) = data.split_first() else {
        return;
    };
    let tight = PickleLimits {
        max_depth: 4,
        max_work: 512,
        max_stack: 64,
        max_memo: 16,
        max_items: 32,
    };
    for limits in [tight, PickleLimits::default()] {
        if let Ok(v) = pickle::read(body, &limits) {
            assert!(v.depth() <= limits.max_depth);
            check(&v, &limits, 0);
        }
    }
    let Some(mut ipc) = engine("sglang").and_then(|e| e.ipc()) else {
        return;
    };
    let stream = zmtp(body);
    let size = usize::from(cfg).max(1);
    let mut steps = Vec::new();
    for chunk in stream.chunks(size) {
        ipc.on_bytes(
            &IpcBytes {
                tgid: 1,
                tid: 1,
                fd: 3,
                conn_gen: 1,
                direction: IpcDirection::Write,
                data: chunk,
                lost: 0,
            },
            &mut steps,
        );
    }
    let mut record = inferscope_model::RequestRecord {
        response_id: Some("a".repeat(32)),
        end_mono_ns: u64::MAX,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    let _ = ipc.counters();
});
