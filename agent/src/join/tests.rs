use std::collections::HashSet;

use inferscope_model::{Counter, RequestRecord};

use super::*;

/// An engine whose IPC has not yet told of the requests named in `untold`.
#[derive(Default)]
struct Engine {
    untold: HashSet<String>,
    enriched: Vec<String>,
}

impl EngineWord for Engine {
    fn awaits_engine(&self, record: &RequestRecord) -> bool {
        self.untold.contains(&record.request_id)
    }

    fn enrich(&mut self, record: &mut RequestRecord) {
        self.enriched.push(record.request_id.clone());
    }
}

fn record(id: &str) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        engine: "vllm".into(),
        ..RequestRecord::default()
    }
}

const T0: u64 = 5_000_000_000;

fn ids(out: &[RequestTimeline]) -> Vec<&str> {
    out.iter().map(|t| t.request.request_id.as_str()).collect()
}

fn gauge(join: &Join) -> Option<u64> {
    join.counters()
        .into_iter()
        .find(|(c, _)| *c == Counter::JoinRecordsWaiting)
        .map(|(_, v)| v)
}

#[test]
fn records_awaiting_their_engine_wait_bounded_in_time() {
    let limits = TimelineLimits::default();
    let wait = limits.settle_ns;
    let mut join = Join::new(limits);
    let mut engine = Engine::default();
    engine.untold.insert("gone".into());
    engine.untold.insert("told-later".into());
    let mut out = Vec::new();
    for id in ["gone", "told-later", "done"] {
        join.push(record(id), T0);
    }
    join.poll(T0, &mut engine, &mut out);
    assert_eq!(ids(&out), ["done"]);
    assert_eq!(gauge(&join), Some(2));
    assert_eq!(join.stats.get(Counter::RecordsHeldForEngine), 2);
    // The engine tells of one: it goes on at once, with what the engine said.
    engine.untold.remove("told-later");
    out.clear();
    join.poll(T0 + wait / 2, &mut engine, &mut out);
    assert_eq!(ids(&out), ["told-later"]);
    assert!(engine.enriched.contains(&"told-later".to_string()));
    // The other waits out its wait, no longer.
    out.clear();
    join.poll(T0 + wait - 1, &mut engine, &mut out);
    assert!(out.is_empty());
    join.poll(T0 + wait, &mut engine, &mut out);
    assert_eq!(ids(&out), ["gone"]);
    assert_eq!(join.stats.get(Counter::RecordsHeldForEngineUntold), 1);
    assert_eq!(join.stats.get(Counter::RecordsHeldForEngine), 2);
    assert_eq!(gauge(&join), Some(0));
    // Stopping hands every record on at once, none of them counted as untold.
    out.clear();
    engine.untold.insert("last".into());
    join.push(record("last"), T0);
    join.flush(T0, &mut engine, &mut out);
    assert_eq!(ids(&out), ["last"]);
    assert_eq!(join.stats.get(Counter::RecordsHeldForEngineUntold), 1);
}

#[test]
fn the_queue_is_bounded_and_the_oldest_go_on_early_counted() {
    let limits = TimelineLimits {
        waiting_records: 3,
        ..TimelineLimits::default()
    };
    let mut join = Join::new(limits);
    let mut engine = Engine::default();
    let mut out = Vec::new();
    for i in 0..5 {
        let id = format!("r{i}");
        engine.untold.insert(id.clone());
        join.push(record(&id), T0);
    }
    join.poll(T0, &mut engine, &mut out);
    assert_eq!(ids(&out), ["r0", "r1"]);
    assert_eq!(join.stats.get(Counter::JoinRecordsReleasedEarly), 2);
    assert_eq!(gauge(&join), Some(3));
}

#[test]
fn every_record_leaves_exactly_once() {
    let mut join = Join::new(TimelineLimits::default());
    let mut engine = Engine::default();
    let mut out = Vec::new();
    let n = 1000;
    for i in 0..n {
        let id = format!("r{i}");
        if i % 3 == 0 {
            engine.untold.insert(id.clone());
        }
        join.push(record(&id), T0 + i);
        join.poll(T0 + i, &mut engine, &mut out);
    }
    join.flush(T0 + n, &mut engine, &mut out);
    let mut seen: Vec<&str> = ids(&out);
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len() as u64, n);
    assert_eq!(out.len() as u64, n);
    // No step and no shim: each says which layers it lacks.
    assert!(
        out.iter()
            .all(|t| t.unknown == ["scheduler", "steps", "gpu"])
    );
}
