//! SGLang's IPC decoded from fixtures its own code pickled (tests/engine/sglang/make_fixtures.py,
//! SGLang 0.5.23), through ZMTP framing as the kernel captures it.
use inferscope_model::{Counter, RequestRecord, StepRef};

use super::{
    Engine, ProcessInfo, Sglang, SglangIpc,
    layout::{self, V0_5_23},
    messages::{self, DecodeError, IpcMessage, Output},
    state::{IpcState, Sighting},
};
use crate::{
    capture::gpu::KernelRecord,
    engines::{EngineIpc, IpcBytes, IpcDirection},
    join::timeline::TimelineLimits,
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
    let IpcMessage::Outputs { outputs: outs, .. } = m else {
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
    let IpcMessage::Outputs { outputs: outs, .. } = m else {
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
    // Kept, joined: outputs after its record (a client that left) are not a new request's.
    assert!(ipc.state().request(&rid).unwrap().joined);
    let mut again = record.clone();
    again.engine_steps.clear();
    ipc.enrich(&mut again);
    assert_eq!(again.engine_steps, Vec::new());
}

/// SGLang's `--smg-grpc-mode`: the scheduler's rid is the request id the call's message named.
#[test]
fn a_grpc_call_joins_by_the_request_id_of_its_message() {
    let e = expected();
    let rid = e["output"]["rids"][0].as_str().unwrap().to_owned();
    let mut ipc = SglangIpc::default();
    ipc.set_version(10, "0.5.23");
    ipc.set_scheduler(10, 10);
    let stream = zmtp(&[fixture("output.pickle")]);
    feed(&mut ipc, 10, 5, IpcDirection::Write, &stream, 64);
    let mut record = RequestRecord {
        path: "/sglang.grpc.scheduler.SglangScheduler/Generate".into(),
        rpc_request_id: Some(rid.clone()),
        arrival_mono_ns: 100_000_000_000,
        first_token_mono_ns: Some(100_500_000_000),
        end_mono_ns: 101_000_000_000,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    assert_eq!(record.admitted_mono_ns, Some(100_375_000_000));
    assert_eq!(record.prompt_tokens, Some(37));
    assert!(ipc.state().request(&rid).unwrap().joined);
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
    let mut b = crate::join::testing::Driver::new(TimelineLimits::default());
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

/// The greeting of [`zmtp`] alone, and one payload's frame after it.
fn greeting() -> Vec<u8> {
    zmtp(&[])
}

fn frame(payload: Vec<u8>) -> Vec<u8> {
    zmtp(&[payload])[greeting().len()..].to_vec()
}

fn feed_at(
    ipc: &mut SglangIpc,
    (tgid, fd): (u32, i32),
    direction: IpcDirection,
    bytes: &[u8],
    at: u64,
) -> Vec<crate::correlate::StepRecord> {
    let mut steps = Vec::new();
    ipc.on_bytes_at(
        &IpcBytes {
            tgid,
            tid: tgid + 1,
            fd,
            conn_gen: 1,
            direction,
            data: bytes,
            lost: 0,
        },
        at,
        &mut steps,
    );
    steps
}

const STEP_FIXTURES: [&str; 4] = [
    "steps_1_prefill.pickle",
    "steps_2_decode.pickle",
    "steps_3_mixed.pickle",
    "steps_4_reprefill.pickle",
];

/// The scheduler (10) writes four untimed batches; the tokenizer manager (20) reads each,
/// 40 µs later. `scheduler_traced`: the scheduler's writes are captured (else only the reads,
/// as with `--port`).
fn four_steps(scheduler_traced: bool) -> (SglangIpc, Vec<crate::correlate::StepRecord>) {
    let mut ipc = SglangIpc::default();
    ipc.set_version(10, "0.5.23");
    ipc.set_version(20, "0.5.23");
    ipc.set_scheduler(10, 10);
    ipc.set_scheduler(20, 10);
    let mut steps = Vec::new();
    steps.extend(feed_at(
        &mut ipc,
        (10, 5),
        IpcDirection::Write,
        &greeting(),
        1,
    ));
    steps.extend(feed_at(
        &mut ipc,
        (20, 6),
        IpcDirection::Read,
        &greeting(),
        1,
    ));
    for (k, name) in STEP_FIXTURES.iter().enumerate() {
        let bytes = frame(fixture(name));
        let sent = 200_000_000_000 + k as u64 * 5_000_000;
        if scheduler_traced {
            steps.extend(feed_at(
                &mut ipc,
                (10, 5),
                IpcDirection::Write,
                &bytes,
                sent,
            ));
        }
        let again = feed_at(&mut ipc, (20, 6), IpcDirection::Read, &bytes, sent + 40_000);
        if scheduler_traced {
            assert!(again.is_empty(), "{name}: seen again");
        }
        steps.extend(again);
    }
    (ipc, steps)
}

/// Every output batch is a step: its members with their phase (first prefill, re-prefill
/// after a retraction, decode), its tokens where the counts give them, and, SGLang timing
/// none of them here, an end at the batch's first capture (the scheduler's send where it is
/// traced) and an unknown start.
#[test]
fn every_output_batch_is_a_step_ending_at_its_first_capture() {
    let want = expected()["steps"].as_array().unwrap().clone();
    for scheduler_traced in [true, false] {
        let (ipc, steps) = four_steps(scheduler_traced);
        assert_eq!(
            steps.len(),
            want.len(),
            "scheduler traced: {scheduler_traced}"
        );
        for (k, (got, want)) in steps.iter().zip(&want).enumerate() {
            let sent = 200_000_000_000 + k as u64 * 5_000_000;
            let (end, pid, kernel_pid) = if scheduler_traced {
                // Seen sent by the scheduler itself: its kernels are its own.
                (sent, 10, None)
            } else {
                (sent + 40_000, 20, Some(10))
            };
            assert_eq!((got.start_mono_ns, got.end_mono_ns), (end, end));
            assert_eq!(got.duration_ms, 0.0);
            assert_eq!(got.start_from, Some("unknown"));
            assert_eq!(
                (got.pid, got.tid, got.kernel_pid),
                (pid, pid + 1, kernel_pid)
            );
            let members: Vec<(String, String)> = got
                .requests
                .iter()
                .map(|m| (m.request_id.clone(), m.phase.to_owned()))
                .collect();
            let want_members: Vec<(String, String)> = want["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m[0].as_str().unwrap().to_owned(),
                        m[1].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            assert_eq!(members, want_members, "step {k}");
            assert_eq!(got.sequences, want_members.len() as u64);
            assert_eq!(
                Some(got.prefilling),
                want["prefilling"].as_u64(),
                "step {k}"
            );
            assert_eq!(got.batch_tokens, want["tokens"].as_u64(), "step {k}");
            // SGLang's outputs carry no engine-wide state.
            assert_eq!(
                (
                    got.kv_cache_usage,
                    got.running_requests,
                    got.waiting_requests
                ),
                (None, None, None)
            );
        }
        let counters: std::collections::HashMap<_, _> = ipc.counters().into_iter().collect();
        assert_eq!(counters.get(&Counter::SglangSteps), Some(&4));
        assert_eq!(counters.get(&Counter::SglangStepsUntimed), Some(&4));
        let sightings = if scheduler_traced { 8 } else { 4 };
        assert_eq!(counters.get(&Counter::SglangOutputs), Some(&sightings));
        assert_eq!(counters.get(&Counter::SglangStepsUnstamped), None);
    }
}

/// Outputs of one request, `n` tokens generated so far.
fn one_output(rid: &str, n: u64) -> IpcMessage {
    IpcMessage::Outputs {
        outputs: vec![Output {
            rid: rid.repeat(32),
            completion_tokens: Some(n),
            ..Default::default()
        }],
        scheduler: true,
    }
}

fn sighting(at: Option<u64>, scheduler_class: bool) -> Sighting {
    Sighting {
        tgid: 20,
        tid: 21,
        kernel_pid: Some(10),
        at,
        scheduler_class,
    }
}

/// A batch seen only without a capture time (bytes fed without one) waits for a sighting
/// with one; when none comes, the step is counted, not made.
#[test]
fn a_batch_never_given_a_time_is_counted_not_invented() {
    let mut state = IpcState::default();
    let mut steps = Vec::new();
    for n in 1..=300u64 {
        state.apply(one_output("r", n), sighting(None, true), &mut steps);
    }
    assert!(steps.is_empty());
    let counters: std::collections::HashMap<_, _> = state.stats.iter().collect();
    // All but the 256 batches still remembered.
    assert_eq!(counters.get(&Counter::SglangStepsUnstamped), Some(&44));
    // A remembered one still becomes a step when a stamped sighting shows up, once.
    state.apply(
        one_output("r", 300),
        sighting(Some(5_000), true),
        &mut steps,
    );
    state.apply(
        one_output("r", 300),
        sighting(Some(6_000), true),
        &mut steps,
    );
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].end_mono_ns, 5_000);
    assert_eq!(steps[0].requests[0].phase, "decode");
    // Its tokens since its previous output (299 seen before it).
    assert_eq!(steps[0].batch_tokens, Some(1));
}

/// With the scheduler's outputs in view, the detokenizer's forwards (BatchStrOutput) make no
/// steps: they repeat them, or in multi-tokenizer mode carry parts of them. Where only the
/// forwards are seen (`--port` on SGLang with its detokenizer) they are the steps.
#[test]
fn forwarded_outputs_are_steps_only_where_the_schedulers_are_not_seen() {
    let mut state = IpcState::default();
    let mut steps = Vec::new();
    state.apply(one_output("r", 1), sighting(Some(1_000), true), &mut steps);
    // Part of another batch, forwarded: no step.
    state.apply(one_output("q", 1), sighting(Some(2_000), false), &mut steps);
    assert_eq!(steps.len(), 1);
    let mut state = IpcState::default();
    let mut steps = Vec::new();
    for n in 1..=3 {
        state.apply(
            one_output("q", n),
            sighting(Some(n * 1_000), false),
            &mut steps,
        );
    }
    let ends: Vec<u64> = steps.iter().map(|s| s.end_mono_ns).collect();
    assert_eq!(ends, [1_000, 2_000, 3_000]);
}

#[test]
fn decodes_both_aborts() {
    let e = expected();
    let m = messages::decode(&fixture("abort_running.pickle"), &V0_5_23).unwrap();
    assert_eq!(
        m,
        IpcMessage::Abort {
            rid: e["abort_running"]["rid"].as_str().map(str::to_owned),
            all: false
        }
    );
    let m = messages::decode(&fixture("abort_queued.pickle"), &V0_5_23).unwrap();
    assert_eq!(
        m,
        IpcMessage::Abort {
            rid: e["abort_queued"]["rid"].as_str().map(str::to_owned),
            all: false
        }
    );
}

/// Aborted while queued (the scheduler's AbortReq back to the tokenizer manager, before any
/// output): its prompt is known, its admission is not, and its retractions are unknown, not 0
/// (a request that was retracted goes back to that queue, and a request not streamed sends
/// no output before its last).
#[test]
fn a_request_aborted_while_queued() {
    let e = expected();
    let rid = e["abort_queued"]["rid"].as_str().unwrap().to_owned();
    let mut ipc = SglangIpc::default();
    ipc.set_version(20, "0.5.23");
    feed(
        &mut ipc,
        20,
        5,
        IpcDirection::Write,
        &zmtp(&[fixture("request.pickle")]),
        4096,
    );
    feed(
        &mut ipc,
        20,
        6,
        IpcDirection::Read,
        &zmtp(&[fixture("abort_queued.pickle")]),
        4096,
    );
    assert!(ipc.state().request(&rid).unwrap().aborted);
    let mut record = RequestRecord {
        response_id: Some(rid.clone()),
        arrival_mono_ns: 100_000_000_000,
        end_mono_ns: 101_000_000_000,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    assert_eq!(record.prompt_tokens, e["request"]["prompt_tokens"].as_u64());
    assert_eq!(record.preemptions, None);
    assert_eq!(record.engine_unknown, vec!["preemptions"]);
    assert_eq!(
        (record.admitted_mono_ns, record.queue_wait_ms),
        (None, None)
    );
    assert_eq!(record.completion_tokens, None);
    assert!(record.engine_steps.is_empty());
    let counters: std::collections::HashMap<_, _> = ipc.counters().into_iter().collect();
    assert_eq!(
        counters.get(&Counter::SglangPreemptionsUnknownAborted),
        Some(&1)
    );
    assert_eq!(counters.get(&Counter::SglangRequestsJoined), Some(&1));
}

/// Retracted once (its output said so), re-prefilled, then its client left (the tokenizer
/// manager's AbortReq): SGLang would ship a later retraction only with a later output, so
/// its preemptions are unknown, not the 1 last seen.
#[test]
fn a_request_aborted_after_a_retraction() {
    let e = expected();
    let rid = e["abort_running"]["rid"].as_str().unwrap().to_owned();
    let (mut ipc, _) = four_steps(true);
    assert_eq!(
        ipc.state().request(&rid).unwrap().retractions,
        e["abort_running"]["retractions"].as_u64().unwrap()
    );
    feed(
        &mut ipc,
        20,
        7,
        IpcDirection::Write,
        &zmtp(&[fixture("abort_running.pickle")]),
        4096,
    );
    let mut record = RequestRecord {
        response_id: Some(rid.clone()),
        arrival_mono_ns: 100_000_000_000,
        first_token_mono_ns: Some(200_000_000_000),
        end_mono_ns: 201_000_000_000,
        aborted: true,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    assert_eq!(record.preemptions, None);
    assert!(record.engine_unknown.contains(&"preemptions"));
    // The rest of what its outputs said stands.
    assert_eq!(record.prompt_tokens, Some(7));
    assert_eq!(record.completion_tokens, Some(3));
    assert_eq!(record.cached_tokens, Some(0));
    // Without --enable-metrics its admission is not shipped.
    assert_eq!(record.admitted_mono_ns, None);
    assert!(record.engine_unknown.contains(&"admitted_mono_ns"));
    // The same request not aborted reports its retraction.
    let (mut ipc, _) = four_steps(true);
    let mut record = RequestRecord {
        response_id: Some(rid),
        arrival_mono_ns: 100_000_000_000,
        first_token_mono_ns: Some(200_000_000_000),
        end_mono_ns: 201_000_000_000,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    assert_eq!(record.preemptions, Some(1));
}

/// Its client left after the first token: its record is joined then, and SGLang's later
/// outputs for it (it runs one more step to abort it) are decode steps of a known request, not
/// a new first prefill with stale bounds.
#[test]
fn outputs_after_the_record_are_not_a_new_prefill() {
    let output = |n: u64, finish| IpcMessage::Outputs {
        outputs: vec![Output {
            rid: "g".repeat(32),
            completion_tokens: Some(n),
            prompt_tokens: Some(9),
            cached_tokens: Some(0),
            retractions: Some(0),
            finish_reason: finish,
            wait_queue_entry: Some(100.0),
            forward_entry: Some(100.25),
            prefill_finished: Some(100.5),
        }],
        scheduler: true,
    };
    let mut state = IpcState::default();
    let mut steps = Vec::new();
    state.apply(
        output(1, None),
        sighting(Some(100_600_000_000), true),
        &mut steps,
    );
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].start_from, Some("forward_entry"));
    let mut record = RequestRecord {
        response_id: Some("g".repeat(32)),
        arrival_mono_ns: 99_000_000_000,
        first_token_mono_ns: Some(100_700_000_000),
        end_mono_ns: 100_800_000_000,
        aborted: true,
        ..Default::default()
    };
    state.enrich(&mut record);
    assert_eq!(record.admitted_mono_ns, Some(100_250_000_000));
    state.apply(
        output(2, Some("abort")),
        sighting(Some(100_900_000_000), true),
        &mut steps,
    );
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1].start_from, Some("unknown"));
    assert_eq!(steps[1].end_mono_ns, 100_900_000_000);
    assert_eq!(steps[1].requests[0].phase, "decode");
    assert_eq!(steps[1].batch_tokens, Some(1));
    // Joined once; a new request reusing the rid starts afresh.
    let mut again = record.clone();
    state.enrich(&mut again);
    let counters: std::collections::HashMap<_, _> = state.stats.iter().collect();
    assert_eq!(counters.get(&Counter::SglangRequestsJoined), Some(&1));
    state.apply(
        IpcMessage::Add(vec![messages::AddRequest {
            rid: "g".repeat(32),
            prompt_tokens: Some(4),
        }]),
        sighting(None, false),
        &mut steps,
    );
    let fresh = state.request(&"g".repeat(32)).unwrap();
    assert!(!fresh.joined && fresh.outputs == 0 && fresh.prompt_tokens == Some(4));
}

/// With overlap scheduling SGLang sends a request retracted in this step once more with no
/// new token (its retraction count already grown); its next output, one token more, is its
/// re-prefill.
#[test]
fn a_re_prefill_after_an_overlap_retraction_output() {
    let output = |n: u64, retractions: u64| IpcMessage::Outputs {
        outputs: vec![Output {
            rid: "o".repeat(32),
            completion_tokens: Some(n),
            prompt_tokens: Some(6),
            cached_tokens: Some(0),
            retractions: Some(retractions),
            ..Default::default()
        }],
        scheduler: true,
    };
    let mut state = IpcState::default();
    let mut steps = Vec::new();
    for (k, (n, retractions)) in [(1, 0), (2, 0), (2, 1), (3, 1), (4, 1)]
        .into_iter()
        .enumerate()
    {
        state.apply(
            output(n, retractions),
            sighting(Some(1_000 * (k as u64 + 1)), true),
            &mut steps,
        );
    }
    let phases: Vec<&str> = steps.iter().map(|s| s.requests[0].phase).collect();
    assert_eq!(phases, ["prefill", "decode", "decode", "prefill", "decode"]);
    let tokens: Vec<Option<u64>> = steps.iter().map(|s| s.batch_tokens).collect();
    assert_eq!(tokens, [Some(6), Some(1), Some(0), None, Some(1)]);
}

#[test]
fn claims_the_server_and_its_titled_processes() {
    let p = |cmdline: &str| ProcessInfo {
        tgid: 1,
        cmdline: cmdline.into(),
        mapped_files: Vec::new(),
    };
    assert!(Sglang.claims(&p("python -m sglang.launch_server --model-path m")));
    assert!(Sglang.claims(&p("/v/bin/sglang serve --model-path m")));
    assert!(Sglang.claims(&p("sglang::scheduler_TP0")));
    assert!(Sglang.claims(&p("sglang::detokenizer")));
    assert!(!Sglang.claims(&p("python serve.py sglang")));
    assert!(Sglang.ipc().is_some());
}

#[test]
fn reads_the_engine_fixture() {
    let got = super::super::fixture_signals(
        "sglang",
        include_bytes!("../../../../tests/fixtures/metrics/sglang.txt"),
    );
    super::super::assert_signals(
        &got,
        // Prompt and generation counters are split by is_streaming: 800+200, 1500+500.
        [
            Some(0.42),
            Some(6.0),
            Some(2.0),
            Some(4.0),
            Some(1000.0),
            Some(2000.0),
        ],
    );
}
