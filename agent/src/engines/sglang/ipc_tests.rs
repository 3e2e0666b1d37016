//! SGLang's IPC decoded from fixtures its own code pickled (tests/engine/sglang/make_fixtures.py,
//! SGLang 0.5.23), through ZMTP framing as the kernel captures it.
use super::{
    SglangIpc,
    layout::{self, V0_5_23},
    messages::{self, DecodeError, IpcMessage},
};
use crate::model::Counter;
use crate::{
    capture::gpu::KernelRecord,
    correlate::timeline::{TimelineBuilder, TimelineLimits},
    engines::{EngineIpc, IpcBytes, IpcDirection},
    model::{RequestRecord, StepRef},
};

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/sglang/0.5.23"
);

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}/{name}")).unwrap()
}

fn expected() -> serde_json::Value {
    serde_json::from_slice(&fixture("expected.json")).unwrap()
}

#[test]
fn the_fixtures_are_of_the_pinned_version() {
    let v = expected()["sglang_version"].as_str().unwrap().to_owned();
    assert_eq!(layout::for_version(&v), Some(&V0_5_23));
}

#[test]
fn decodes_a_tokenized_request() {
    let e = expected();
    let m = messages::decode(&fixture("request.pickle"), &V0_5_23).unwrap();
    let IpcMessage::Add(adds) = m else {
        panic!("{m:?}")
    };
    assert_eq!(adds.len(), 1);
    assert_eq!(adds[0].rid, e["request"]["rid"].as_str().unwrap());
    assert_eq!(
        adds[0].prompt_tokens,
        e["request"]["prompt_tokens"].as_u64()
    );
}

#[test]
fn decodes_a_batched_output_with_times_and_retractions() {
    let e = &expected()["output"];
    let m = messages::decode(&fixture("output.pickle"), &V0_5_23).unwrap();
    let IpcMessage::Outputs(outs) = m else {
        panic!("{m:?}")
    };
    assert_eq!(outs.len(), 2);
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.rid, e["rids"][i].as_str().unwrap());
        assert_eq!(
            o.finish_reason,
            e["finished"][i]
                .as_str()
                .map(|s| if s == "length" { "length" } else { "other" })
        );
        assert_eq!(o.prompt_tokens, e["prompt_tokens"][i].as_u64());
        assert_eq!(o.completion_tokens, e["completion_tokens"][i].as_u64());
        assert_eq!(o.cached_tokens, e["cached_tokens"][i].as_u64());
        assert_eq!(o.retractions, e["retractions"][i].as_u64());
        assert_eq!(o.forward_entry, e["forward_entry_time"][i].as_f64());
        assert_eq!(o.wait_queue_entry, e["wait_queue_entry_time"][i].as_f64());
    }
    // Without --enable-metrics the stats objects are empty: no times, the rest intact.
    let m = messages::decode(&fixture("output_no_timing.pickle"), &V0_5_23).unwrap();
    let IpcMessage::Outputs(outs) = m else {
        panic!("{m:?}")
    };
    assert!(
        outs.iter()
            .all(|o| o.forward_entry.is_none() && o.retractions.is_some())
    );
}

#[test]
fn other_layouts_and_non_pickles_are_refused() {
    let mut other = V0_5_23;
    other.outputs = &["SomethingElse"];
    other.request = "Renamed";
    assert_eq!(
        messages::decode(&fixture("output.pickle"), &other),
        Ok(IpcMessage::Other)
    );
    let mut wrong_stats = V0_5_23;
    wrong_stats.time_stats = ("x", "y");
    assert_eq!(
        messages::decode(&fixture("output.pickle"), &wrong_stats),
        Err(DecodeError::Layout)
    );
    assert_eq!(
        messages::decode(&[0x93, 1, 2], &V0_5_23),
        Err(DecodeError::NotPickle)
    );
}

/// A ZMTP 3.0 NULL greeting, READY, then each payload as one single-frame message.
fn zmtp(payloads: &[Vec<u8>]) -> Vec<u8> {
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
    for p in payloads {
        g.push(0x02);
        g.extend_from_slice(&(p.len() as u64).to_be_bytes());
        g.extend_from_slice(p);
    }
    g
}

fn feed(
    ipc: &mut SglangIpc,
    tgid: u32,
    fd: i32,
    direction: IpcDirection,
    bytes: &[u8],
    chunk: usize,
) -> Vec<crate::correlate::StepRecord> {
    let mut steps = Vec::new();
    for c in bytes.chunks(chunk) {
        ipc.on_bytes(
            &IpcBytes {
                tgid,
                tid: tgid,
                fd,
                conn_gen: 1,
                direction,
                data: c,
                lost: 0,
            },
            &mut steps,
        );
    }
    steps
}

#[test]
fn joins_the_http_request_by_rid_seen_on_both_ends() {
    let e = expected();
    let rid = e["output"]["rids"][0].as_str().unwrap().to_owned();
    let mut ipc = SglangIpc::default();
    ipc.set_version(10, "0.5.23");
    ipc.set_version(20, "0.5.23");
    ipc.set_scheduler(10, 10);
    ipc.set_scheduler(20, 10);
    let stream = zmtp(&[fixture("output.pickle")]);
    // Written by the scheduler, read by the tokenizer manager: one message seen twice, split
    // across syscalls at odd sizes.
    let steps = feed(&mut ipc, 10, 5, IpcDirection::Write, &stream, 7);
    let again = feed(&mut ipc, 20, 6, IpcDirection::Read, &stream, 1000);
    // The first sighting is a prefill step timed by SGLang's clocks; the second adds nothing.
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].start_mono_ns, 100_375_000_000);
    assert_eq!(steps[0].end_mono_ns, 100_750_000_000);
    assert_eq!(steps[0].prefilling, 2);
    // Seen in the scheduler itself: its kernels are its own.
    assert_eq!(steps[0].kernel_pid, None);
    assert!(again.is_empty());
    assert_eq!(ipc.state().request(&rid).unwrap().retractions, 2);
    let mut record = RequestRecord {
        response_id: Some(rid.clone()),
        arrival_mono_ns: 100_000_000_000,
        first_token_mono_ns: Some(100_500_000_000),
        end_mono_ns: 101_000_000_000,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    assert_eq!(record.admitted_mono_ns, Some(100_375_000_000));
    assert_eq!(record.queue_wait_ms, Some(375.0));
    assert_eq!(record.prefill_ms, Some(125.0));
    assert_eq!(record.preemptions, Some(2));
    assert_eq!(record.prompt_tokens, Some(37));
    assert_eq!(record.cached_tokens, Some(4));
    assert_eq!(record.completion_tokens, Some(16));
    // Its first prefill is its one step SGLang timed; how many it ran is not in the IPC.
    assert_eq!(
        record.engine_steps,
        vec![StepRef {
            pid: 10,
            end_mono_ns: 100_750_000_000,
            phase: "prefill"
        }]
    );
    assert_eq!((record.prefill_steps, record.decode_steps), (None, None));
    assert!(record.engine_unknown.contains(&"prefill_steps"));
    assert!(record.engine_unknown.contains(&"decode_steps"));
    assert!(ipc.state().request(&rid).is_none());
}

fn kernel(pid: u32, launch: u64) -> KernelRecord {
    KernelRecord {
        pid,
        name: format!("k{launch}"),
        device_id: 0,
        context_id: 1,
        stream_id: 7,
        correlation_id: launch as u32,
        launch_tid: pid,
        launch_api: "cuLaunchKernel".into(),
        launch_mono_ns: launch,
        start_mono_ns: launch + 1_000,
        end_mono_ns: launch + 2_000,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        static_shared_bytes: 0,
        dynamic_shared_bytes: 0,
        graph_id: 0,
        graph_node_id: 0,
        tensor_core: false,
    }
}

/// Seen in the tokenizer manager (20), run by the scheduler (30): the step names the
/// scheduler as the process of its kernels, and the request's timeline joins them through its
/// engine-listed step. SGLang on CPU launches no CUDA work, so this join is tested here, not
/// against a live engine.
#[test]
fn the_prefill_step_joins_the_scheduler_kernels_into_the_request_timeline() {
    let rid = expected()["output"]["rids"][0].as_str().unwrap().to_owned();
    let mut ipc = SglangIpc::default();
    ipc.set_version(20, "0.5.23");
    ipc.set_scheduler(20, 30);
    let stream = zmtp(&[fixture("output.pickle")]);
    let steps = feed(&mut ipc, 20, 6, IpcDirection::Read, &stream, 4096);
    assert_eq!(steps.len(), 1);
    assert_eq!((steps[0].pid, steps[0].kernel_pid), (20, Some(30)));
    let mut record = RequestRecord {
        request_id: "20-1-0".into(),
        pid: 20,
        response_id: Some(rid),
        arrival_mono_ns: 100_000_000_000,
        first_token_mono_ns: Some(100_800_000_000),
        end_mono_ns: 101_000_000_000,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    let now = 102_000_000_000;
    let mut b = TimelineBuilder::new(TimelineLimits::default());
    b.on_step(steps[0].clone());
    // In the step: the scheduler's; not: the server's own, and one launched before it.
    b.on_kernel(kernel(30, 100_500_000_000), now);
    b.on_kernel(kernel(30, 100_700_000_000), now);
    b.on_kernel(kernel(20, 100_600_000_000), now);
    b.on_kernel(kernel(30, 100_100_000_000), now);
    let mut out = Vec::new();
    b.on_request(record, now, &mut out);
    b.poll(now + 2_000_000_000, &mut out);
    let t = &out[0];
    assert_eq!(t.steps.len(), 1);
    assert!(
        t.steps[0]
            .requests
            .iter()
            .any(|m| m.request_id == "20-1-0" && m.phase == "prefill")
    );
    assert_eq!(t.prefill_gpu.as_ref().unwrap().kernels, 2);
    assert_eq!(t.decode_gpu.as_ref().unwrap().kernels, 0);
    assert!(t.kernels.iter().all(|k| k.pid == 30));
    assert!(t.unknown.is_empty(), "{:?}", t.unknown);
}

#[test]
fn an_unsupported_version_is_refused_and_counted() {
    let mut ipc = SglangIpc::default();
    ipc.set_version(10, "0.4.9");
    feed(
        &mut ipc,
        10,
        5,
        IpcDirection::Write,
        &zmtp(&[fixture("output.pickle")]),
        4096,
    );
    let counters: std::collections::HashMap<_, _> = ipc.counters().into_iter().collect();
    assert_eq!(
        counters.get(&Counter::SglangIpcUnsupportedVersion),
        Some(&1)
    );
    assert_eq!(counters.get(&Counter::SglangIpcMessages), None);
}

#[test]
fn hostile_pickles_in_the_stream_are_counted_not_decoded() {
    let mut ipc = SglangIpc::default();
    let mut deep = vec![0x80, 4];
    deep.extend(std::iter::repeat_n(b']', 100));
    deep.extend(std::iter::repeat_n(b'a', 99));
    deep.push(b'.');
    let os = b"\x80\x04cos\nsystem\nX\x02\x00\x00\x00lsR.".to_vec();
    feed(
        &mut ipc,
        10,
        5,
        IpcDirection::Write,
        &zmtp(&[deep, os, vec![0x80, 4, 0xfe]]),
        4096,
    );
    let counters: std::collections::HashMap<_, _> = ipc.counters().into_iter().collect();
    assert_eq!(counters.get(&Counter::PickleTooDeep), Some(&1));
    assert_eq!(counters.get(&Counter::PickleUnknownOpcode), Some(&1));
    // os.system(...) is a name in a tree, matching no SGLang class: ignored.
    assert_eq!(counters.get(&Counter::SglangIpcMessages), Some(&1));
}
