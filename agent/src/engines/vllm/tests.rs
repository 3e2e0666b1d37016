//! The vLLM 0.33.0 fixtures (tests/fixtures/vllm: real ZMTP streams of messages encoded with the
//! wheel's own classes) replayed through the decoder, compared with the values they encode.
use inferscope_model::{Counter, RequestRecord, StepRecord, clock::mono_seconds_to_ns};
use serde_json::Value;

use super::VllmIpc;
use crate::engines::{EngineIpc, IpcBytes, IpcDirection, IpcVerdict};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../tests/fixtures/vllm/0.33.0/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn expected() -> Value {
    serde_json::from_slice(&fixture("expected.json")).unwrap()
}

fn ns(v: &Value) -> Option<u64> {
    v.as_f64().and_then(mono_seconds_to_ns)
}

/// Feeds one fixture stream as syscalls of `chunk` bytes on (tgid, fd).
fn feed(
    ipc: &mut VllmIpc,
    steps: &mut Vec<StepRecord>,
    bytes: &[u8],
    tgid: u32,
    fd: i32,
    direction: IpcDirection,
    chunk: usize,
) -> IpcVerdict {
    let mut verdict = IpcVerdict::Keep;
    for data in bytes.chunks(chunk) {
        verdict = ipc.on_bytes(
            &IpcBytes {
                tgid,
                tid: tgid,
                fd,
                conn_gen: 1,
                direction,
                data,
                lost: 0,
            },
            steps,
        );
    }
    verdict
}

/// The API server's view: it writes the input socket (ROUTER), reads the engine's start-up
/// message there, and reads the output socket (PULL). Inputs before outputs, as in the scenario
/// (each request is added before any output names it).
fn api_server_view(transport: &str, chunk: usize) -> (VllmIpc, Vec<StepRecord>) {
    api_server_view_with(transport, chunk, VllmIpc::default())
}

fn api_server_view_with(
    transport: &str,
    chunk: usize,
    mut ipc: VllmIpc,
) -> (VllmIpc, Vec<StepRecord>) {
    let mut steps = Vec::new();
    let pid = 100;
    let input_from = fixture(&format!("{transport}-input.from_engine.bin"));
    let input_to = fixture(&format!("{transport}-input.to_engine.bin"));
    let output_from = fixture(&format!("{transport}-output.from_engine.bin"));
    let output_to = fixture(&format!("{transport}-output.to_engine.bin"));
    use IpcDirection::{Read, Write};
    assert_eq!(
        feed(&mut ipc, &mut steps, &input_from, pid, 7, Read, chunk),
        IpcVerdict::Keep
    );
    assert_eq!(
        feed(&mut ipc, &mut steps, &input_to, pid, 7, Write, chunk),
        IpcVerdict::Keep
    );
    assert_eq!(
        feed(&mut ipc, &mut steps, &output_to, pid, 8, Write, chunk),
        IpcVerdict::Keep
    );
    assert_eq!(
        feed(&mut ipc, &mut steps, &output_from, pid, 8, Read, chunk),
        IpcVerdict::Keep
    );
    (ipc, steps)
}

fn assert_matches_expected(ipc: &VllmIpc, steps: &[StepRecord]) {
    let want = expected();
    for r in want["requests"].as_array().unwrap() {
        let id = r["request_id"].as_str().unwrap();
        let got = ipc
            .state()
            .request(id)
            .unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(
            got.external_req_id.as_deref(),
            r["external_req_id"].as_str(),
            "{id}"
        );
        assert_eq!(got.prompt_tokens, r["prompt_tokens"].as_u64(), "{id}");
        assert_eq!(got.queued_ns, ns(&r["queued"]), "{id}");
        assert_eq!(got.scheduled_ns, ns(&r["scheduled"]), "{id}");
        assert_eq!(got.preemptions, r["preemptions"].as_u64().unwrap(), "{id}");
        assert_eq!(
            got.output_tokens,
            r["output_tokens"].as_u64().unwrap(),
            "{id}"
        );
        assert_eq!(got.first_output_ns, ns(&r["first_output_ts"]), "{id}");
        let aborted_while_waiting = r["finish_reason"] == "abort";
        if aborted_while_waiting {
            assert!(got.aborted, "{id}");
        } else {
            assert_eq!(got.finish_reason, r["finish_reason"].as_str(), "{id}");
        }
    }
    let want_steps = want["steps"].as_array().unwrap();
    assert_eq!(steps.len(), want_steps.len());
    for (got, s) in steps.iter().zip(want_steps) {
        assert_eq!(Some(got.end_mono_ns), ns(&s["timestamp"]));
        assert_eq!(got.kv_cache_usage, s["kv_cache_usage"].as_f64());
        assert_eq!(got.running_requests, s["running"].as_u64());
        assert_eq!(got.waiting_requests, s["waiting"].as_u64());
        assert_eq!(got.requests.len() as u64, s["outputs"].as_u64().unwrap());
        assert_eq!(got.engine, "vllm");
    }
}

#[test]
fn replayed_fixture_streams_give_the_encoded_values() {
    for transport in ["ipc", "tcp"] {
        for chunk in [1, 13, 4096, usize::MAX] {
            let (ipc, steps) = api_server_view(transport, chunk);
            assert_matches_expected(&ipc, &steps);
            let counters: std::collections::BTreeMap<_, _> = ipc.counters().into_iter().collect();
            assert_eq!(counters.get(&Counter::VllmIpcReady), Some(&1));
            assert_eq!(counters.get(&Counter::VllmIpcLayoutAssumed), None);
            assert_eq!(counters.get(&Counter::VllmIpcLayoutMismatch), None);
        }
    }
}

#[test]
fn both_processes_traced_count_each_message_once() {
    let (mut ipc, mut steps) = api_server_view("ipc", 4096);
    // The EngineCore process (pid 200) sees the same messages from the other side.
    let engine = 200;
    use IpcDirection::{Read, Write};
    for (file, fd, dir) in [
        ("ipc-input.from_engine.bin", 3, Write),
        ("ipc-input.to_engine.bin", 3, Read),
        ("ipc-output.to_engine.bin", 4, Read),
        ("ipc-output.from_engine.bin", 4, Write),
    ] {
        feed(&mut ipc, &mut steps, &fixture(file), engine, fd, dir, 4096);
    }
    assert_matches_expected(&ipc, &steps);
}

#[test]
fn the_step_records_chain_busy_steps() {
    let (_, steps) = api_server_view("tcp", 4096);
    // Step 1 follows an idle engine: its start is unknown. Later ones start where the previous
    // (busy) step ended, or at a SCHEDULED stamp after that, which the step's schedule() took.
    assert_eq!(steps[0].start_mono_ns, steps[0].end_mono_ns);
    assert_eq!(steps[0].start_from, Some("unknown"));
    for w in steps.windows(2) {
        match w[1].start_from {
            Some("scheduled") => {
                assert!(w[1].start_mono_ns > w[0].end_mono_ns);
                assert!(w[1].start_mono_ns <= w[1].end_mono_ns);
            }
            _ => assert_eq!(w[1].start_mono_ns, w[0].end_mono_ns),
        }
    }
    assert!(steps.iter().any(|s| s.start_from == Some("scheduled")));
    let b = "chatcmpl-fixture-b-a0b1c2d3";
    let phase = |i: usize| {
        steps[i]
            .requests
            .iter()
            .find(|m| m.request_id == b)
            .map(|m| m.phase)
    };
    assert_eq!(phase(1), Some("prefill"));
    assert_eq!(phase(2), Some("decode"));
}

fn http_record(response_id: &str, arrival: u64, first_token: u64, end: u64) -> RequestRecord {
    RequestRecord {
        response_id: Some(response_id.into()),
        arrival_mono_ns: arrival,
        first_token_mono_ns: Some(first_token),
        end_mono_ns: end,
        ..Default::default()
    }
}

#[test]
fn http_requests_are_joined_by_their_stream_id() {
    let want = expected();
    let (mut ipc, _) = api_server_view("ipc", 4096);
    let first_step = ns(&want["steps"][0]["timestamp"]).unwrap();
    for r in want["requests"].as_array().unwrap() {
        // D never left the queue (no events): its HTTP request spans the first step.
        let queued = ns(&r["queued"]).unwrap_or(first_step);
        let scheduled = ns(&r["scheduled"]);
        let ext = r["external_req_id"].as_str().unwrap();
        let first_token = ns(&r["first_output_ts"]).map_or(queued + 1_000_000, |t| t + 100_000);
        let mut rec = http_record(
            ext,
            queued - 2_000_000,
            first_token,
            first_token + 1_000_000,
        );
        ipc.enrich(&mut rec);
        assert_eq!(rec.admitted_mono_ns, scheduled, "{ext}");
        assert_eq!(rec.prompt_tokens, r["prompt_tokens"].as_u64(), "{ext}");
        match scheduled {
            Some(s) => {
                assert_eq!(rec.preemptions, r["preemptions"].as_u64(), "{ext}");
                let wait = (s - (queued - 2_000_000)) as f64 / 1e6;
                assert_eq!(rec.queue_wait_ms, Some(wait), "{ext}");
                assert_eq!(
                    rec.prefill_ms,
                    Some((first_token - s) as f64 / 1e6),
                    "{ext}"
                );
            }
            None => assert_eq!(rec.preemptions, None, "{ext}"),
        }
    }
    // Joined requests are forgotten.
    assert!(ipc.state().is_empty());
}

#[test]
fn an_admission_outside_the_http_request_is_never_attached() {
    let want = expected();
    let a = &want["requests"][0];
    let queued = ns(&a["queued"]).unwrap();
    let ext = a["external_req_id"].as_str().unwrap();
    let (mut ipc, _) = api_server_view("ipc", 4096);
    // The HTTP request arrived after the engine queued it: another request with the same id.
    let mut late = http_record(ext, queued + 1, queued + 10, queued + 20);
    ipc.enrich(&mut late);
    assert_eq!(late.admitted_mono_ns, None);
    assert_eq!(late.prompt_tokens, None);
    let counters: std::collections::BTreeMap<_, _> = ipc.counters().into_iter().collect();
    assert_eq!(counters.get(&Counter::VllmJoinOutsideRequestTime), Some(&1));
    // An unknown id is left alone.
    let mut other = http_record("chatcmpl-unknown", 0, 1, 2);
    ipc.enrich(&mut other);
    assert_eq!(other, http_record("chatcmpl-unknown", 0, 1, 2));
}

#[test]
fn an_unsupported_version_is_counted_and_not_decoded() {
    let mut ipc = VllmIpc::default();
    let mut steps = Vec::new();
    let mut ready = fixture("ipc-input.from_engine.bin");
    let at = ready.windows(6).position(|w| w == b"0.33.0").unwrap();
    ready[at..at + 6].copy_from_slice(b"0.99.0");
    use IpcDirection::{Read, Write};
    feed(&mut ipc, &mut steps, &ready, 1, 7, Read, 4096);
    feed(
        &mut ipc,
        &mut steps,
        &fixture("ipc-input.to_engine.bin"),
        1,
        7,
        Write,
        4096,
    );
    feed(
        &mut ipc,
        &mut steps,
        &fixture("ipc-output.from_engine.bin"),
        1,
        8,
        Read,
        4096,
    );
    assert!(ipc.state().is_empty());
    assert!(steps.is_empty());
    let counters: std::collections::BTreeMap<_, _> = ipc.counters().into_iter().collect();
    // 5 inputs + 6 outputs.
    assert_eq!(counters.get(&Counter::VllmIpcUnsupportedVersion), Some(&11));
}

#[test]
fn joined_late_the_newest_layout_is_checked_and_used() {
    // No greeting, no start-up message: the agent attached to a running engine. Each syscall
    // holds whole messages (an idle libzmq socket writes one batch per message).
    let bytes = fixture("ipc-output.from_engine.bin");
    let want = expected();
    let first_step = ns(&want["steps"][0]["timestamp"]).unwrap();
    let mut ipc = VllmIpc::default();
    let mut steps = Vec::new();
    // Skip greeting + READY: the first message is a long frame (flags 0x02, 8-byte size)
    // holding an array of 9 fields (EngineCoreOutputs: 0x99).
    let start = bytes
        .windows(10)
        .position(|w| w[0] == 0x02 && w[9] == 0x99)
        .unwrap();
    feed(
        &mut ipc,
        &mut steps,
        &bytes[start..],
        1,
        8,
        IpcDirection::Read,
        usize::MAX,
    );
    assert_eq!(steps.len(), want["steps"].as_array().unwrap().len());
    assert_eq!(steps[0].end_mono_ns, first_step);
    let counters: std::collections::BTreeMap<_, _> = ipc.counters().into_iter().collect();
    assert_eq!(counters.get(&Counter::VllmIpcLayoutAssumed), Some(&6));
}

#[test]
fn garbage_and_other_protocols_never_panic_and_are_given_up() {
    let mut ipc = VllmIpc::default();
    let mut steps = Vec::new();
    let http = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n";
    let verdicts: Vec<IpcVerdict> = (0..100)
        .map(|_| {
            feed(
                &mut ipc,
                &mut steps,
                http,
                1,
                9,
                IpcDirection::Read,
                usize::MAX,
            )
        })
        .collect();
    // Given up after the hunt limit (the kernel then stops copying the socket).
    assert_eq!(
        verdicts.iter().position(|v| *v == IpcVerdict::NotIpc),
        Some(64)
    );
    assert!(steps.is_empty(), "steps invented from HTTP bytes");
    assert_eq!(
        counter(&ipc, "zmtp_not_zmtp"),
        1,
        "giving up is counted once: {:?}",
        ipc.counters()
    );
    // A ZMTP greeting followed by corrupt messages: counted, nothing applied beyond what the
    // intact prefix holds.
    let clean = fixture("tcp-output.from_engine.bin");
    let n = clean.len();
    let mut bytes = clean.clone();
    for (i, b) in bytes.iter_mut().enumerate().skip(n / 3) {
        *b = b.wrapping_mul(31).wrapping_add(i as u8);
    }
    let mut prefix_steps = Vec::new();
    feed(
        &mut VllmIpc::default(),
        &mut prefix_steps,
        &clean[..n / 3],
        1,
        10,
        IpcDirection::Read,
        97,
    );
    let mut ipc = VllmIpc::default();
    let mut steps = Vec::new();
    let verdict = feed(&mut ipc, &mut steps, &bytes, 1, 10, IpcDirection::Read, 97);
    assert!(
        steps.len() <= prefix_steps.len(),
        "{} steps from corrupt bytes, {} in the intact prefix",
        steps.len(),
        prefix_steps.len()
    );
    assert_eq!(steps[..], prefix_steps[..steps.len()]);
    let failures: u64 = ipc
        .counters()
        .iter()
        .filter(|(c, _)| FAILURE_COUNTERS.contains(&c.name()))
        .map(|(_, v)| v)
        .sum();
    assert!(
        failures >= 1 || verdict == IpcVerdict::NotIpc,
        "corruption neither counted nor given up: {:?}",
        ipc.counters()
    );
}

/// Counters that say bytes were refused, cut or skipped rather than applied.
const FAILURE_COUNTERS: [&str; 10] = [
    "zmtp_not_zmtp",
    "zmtp_old_version",
    "zmtp_desync",
    "zmtp_frames_incomplete",
    "zmtp_frames_dropped",
    "zmtp_hunt_skipped",
    "vllm_ipc_truncated",
    "vllm_ipc_bad_msgpack",
    "vllm_ipc_layout_mismatch",
    "vllm_ipc_not_vllm",
];

fn counter(ipc: &VllmIpc, name: &str) -> u64 {
    ipc.counters()
        .iter()
        .find(|(c, _)| c.name() == name)
        .map_or(0, |(_, v)| *v)
}

/// A kernel launched by process `pid` at `launch` (running 10 µs from 5 µs later).
fn kernel(pid: u32, launch: u64) -> crate::join::timeline::KernelRecord {
    crate::join::timeline::KernelRecord {
        pid,
        name: format!("k{launch}"),
        device_id: 0,
        context_id: 1,
        stream_id: 7,
        correlation_id: launch as u32,
        launch_tid: pid,
        launch_api: "cuLaunchKernel".into(),
        launch_mono_ns: launch,
        start_mono_ns: launch + 5_000,
        end_mono_ns: launch + 15_000,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        static_shared_bytes: 0,
        dynamic_shared_bytes: 0,
        graph_id: 0,
        graph_node_id: 0,
        tensor_core: false,
    }
}

/// The replayed steps carry engine ids; the HTTP records joined to them get their steps (named
/// by the agent's id, with the phase) and the kernels launched inside those steps by the
/// EngineCore process (the steps are seen on the API server's sockets), split into prefill and
/// decode, as llama.cpp's hook steps do.
#[test]
fn replayed_steps_give_http_requests_their_steps_and_kernels() {
    use crate::join::timeline::TimelineLimits;
    let want = expected();
    let (engine_core, api_server) = (200, 100);
    let mut ipc = VllmIpc::default();
    ipc.set_engine_core(api_server, 0, engine_core);
    let (mut ipc, steps) = api_server_view_with("ipc", 4096, ipc);
    assert!(steps.iter().all(|s| s.pid == api_server));
    assert!(steps.iter().all(|s| s.gpu_pid() == engine_core));
    let mut timeline = crate::join::testing::Driver::new(TimelineLimits::default());
    let mut launches = Vec::new();
    for step in &steps {
        // Two kernels inside each step's window (none in a step after an idle gap: its start
        // is its end, which the next step starts at).
        let mut at = Vec::new();
        if step.start_mono_ns < step.end_mono_ns {
            at.push(step.start_mono_ns + (step.end_mono_ns - step.start_mono_ns) / 2);
            at.push(step.end_mono_ns - 1);
        }
        launches.push(at.len() as u64);
        for t in at {
            timeline.on_kernel(kernel(engine_core, t), 1);
            // The API server launches nothing; a kernel of another process never joins.
            timeline.on_kernel(kernel(300, t), 1);
        }
        timeline.on_step(step.clone());
    }
    let last_step = steps.last().unwrap().end_mono_ns;
    let mut out = Vec::new();
    for r in want["requests"].as_array().unwrap() {
        if r["scheduled"].is_null() {
            continue;
        }
        let queued = ns(&r["queued"]).unwrap();
        let ext = r["external_req_id"].as_str().unwrap();
        let first_token = ns(&r["first_output_ts"]).unwrap() + 100_000;
        let mut rec = http_record(ext, queued - 2_000_000, first_token, last_step + 1);
        rec.request_id = format!("100-1-{ext}");
        rec.pid = 100;
        ipc.enrich(&mut rec);
        let prefill = rec
            .prefill_steps
            .unwrap_or_else(|| panic!("{ext}: {rec:#?}"));
        let decode = rec.decode_steps.unwrap();
        assert!(prefill >= 1 && decode >= 1, "{ext}: {rec:#?}");
        assert_eq!(rec.engine_steps.len() as u64, prefill + decode);
        timeline.on_request(rec, 2, &mut out);
    }
    timeline.flush(3, &mut out);
    assert_eq!(out.len(), 3);
    for t in &out {
        let id = &t.request.request_id;
        assert!(t.unknown.is_empty(), "{id}: {:?}", t.unknown);
        assert_eq!(t.steps.len(), t.request.engine_steps.len());
        let mut want_kernels = [0u64; 2];
        for (step, r) in t.steps.iter().zip(&t.request.engine_steps) {
            assert_eq!(step.end_mono_ns, r.end_mono_ns);
            let member = step
                .requests
                .iter()
                .find(|m| m.request_id == *id)
                .expect("the step names the request by the agent's id");
            assert_eq!(member.phase, r.phase);
            let i = steps
                .iter()
                .position(|s| s.end_mono_ns == step.end_mono_ns)
                .unwrap();
            want_kernels[usize::from(r.phase == "decode")] += launches[i];
            assert_eq!(t.kernels_of(step).count() as u64, launches[i]);
        }
        assert_eq!(t.prefill_gpu.as_ref().unwrap().kernels, want_kernels[0]);
        assert_eq!(t.decode_gpu.as_ref().unwrap().kernels, want_kernels[1]);
    }
}

/// What the kernel copies of one send or receive at most (`LARGE_CAPTURE`: 16 ring-buffer
/// records of 8 KiB); the rest of a longer syscall is reported lost.
const CAPTURE_MAX: usize = 128 * 1024;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The msgpack body of the fixture's first ADD message (request A's `EngineCoreRequest`, as
/// the 0.33.0 wheel's classes encode it).
fn first_add_body() -> Vec<u8> {
    let messages: Value = serde_json::from_slice(&fixture("messages.json")).unwrap();
    let frames = messages
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["direction"] == "to_engine_input" && m["frames"][0] == "00")
        .map(|m| m["frames"].as_array().unwrap().clone())
        .unwrap();
    unhex(frames[1].as_str().unwrap())
}

/// One ZMTP frame: flags (MORE, LONG), size, body.
fn zmtp_frame(more: bool, body: &[u8]) -> Vec<u8> {
    let more = u8::from(more);
    let mut out = match u8::try_from(body.len()) {
        Ok(len) => vec![more, len],
        Err(_) => {
            let mut h = vec![0x02 | more];
            h.extend_from_slice(&(body.len() as u64).to_be_bytes());
            h
        }
    };
    out.extend_from_slice(body);
    out
}

fn msgpack_str(s: &str) -> Vec<u8> {
    assert!(s.len() < 256);
    let mut out = if s.len() < 32 {
        vec![0xa0 | s.len() as u8]
    } else {
        vec![0xd9, s.len() as u8]
    };
    out.extend_from_slice(s.as_bytes());
    out
}

/// A two-frame input message: the request type byte, then the msgpack body.
fn input_message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = zmtp_frame(true, &[kind]);
    m.extend(zmtp_frame(false, body));
    m
}

/// Request A's real `EngineCoreRequest` with another id and a prompt of `n` token ids (3
/// bytes each, as vLLM's msgpack writes ids from 256 on).
fn long_prompt_add(id: &str, n: u32) -> Vec<u8> {
    let body = first_add_body();
    let mut r = inferscope_decode::msgpack::Reader::new(&body);
    r.array_len().unwrap();
    let id_at = r.position();
    r.skip().unwrap();
    r.skip().unwrap();
    let after_prompt = r.position();
    let mut out = body[..id_at].to_vec();
    out.extend(msgpack_str(id));
    out.push(0xdd);
    out.extend_from_slice(&n.to_be_bytes());
    for k in 0..n {
        out.push(0xcd);
        out.extend_from_slice(&(256 + (k % 9_700) as u16).to_be_bytes());
    }
    out.extend_from_slice(&body[after_prompt..]);
    out
}

/// One syscall on the API server's input socket (fd 7), `lost` bytes beyond `data`.
fn input_syscall(ipc: &mut VllmIpc, steps: &mut Vec<StepRecord>, data: &[u8], lost: u64) {
    ipc.on_bytes(
        &IpcBytes {
            tgid: 100,
            tid: 100,
            fd: 7,
            conn_gen: 1,
            direction: IpcDirection::Write,
            data,
            lost,
        },
        steps,
    );
}

/// A new-request message longer than the capture (a ~43k-token prompt) is cut inside its
/// prompt ids: the token count, read from the ids array's header before the cut, is kept,
/// the cut is counted, and the stream goes on at the next message.
#[test]
fn an_add_cut_inside_its_prompt_ids_keeps_the_token_count() {
    const N: u32 = 50_000;
    let (mut ipc, mut steps) = api_server_view("ipc", 4096);
    let id = "chatcmpl-long-0a1b2c3d";
    let message = input_message(0x00, &long_prompt_add(id, N));
    assert!(message.len() > CAPTURE_MAX + 4096, "{}", message.len());
    let lost = (message.len() - CAPTURE_MAX) as u64;
    input_syscall(&mut ipc, &mut steps, &message[..CAPTURE_MAX], lost);
    // The next message is read whole: the stream is still in step.
    let mut abort = vec![0x91];
    abort.extend(msgpack_str(id));
    input_syscall(&mut ipc, &mut steps, &input_message(0x01, &abort), 0);

    let got = ipc.state().request(id).expect("the cut request is kept");
    assert_eq!(got.prompt_tokens, Some(u64::from(N)));
    assert!(got.aborted);
    assert_eq!(counter(&ipc, "vllm_requests_partial"), 1);
    assert_eq!(counter(&ipc, "zmtp_frames_incomplete"), 1);
    assert_eq!(counter(&ipc, "vllm_ipc_truncated"), 0);
    // The fixture's four and the cut one.
    assert_eq!(counter(&ipc, "vllm_requests_added"), 5);
    let mut record = RequestRecord {
        response_id: Some("chatcmpl-long".into()),
        end_mono_ns: u64::MAX,
        aborted: true,
        ..Default::default()
    };
    ipc.enrich(&mut record);
    assert_eq!(record.prompt_tokens, Some(u64::from(N)));
    assert!(record.engine_unknown.is_empty(), "{record:#?}");
}

/// Request A's new-request message not seen at all, or cut before its prompt's token count:
/// the record still gets what the outputs carried (admission), and says its prompt tokens are
/// unknown rather than leaving them out silently. The cut is counted.
#[test]
fn a_lost_or_cut_add_leaves_prompt_tokens_unknown() {
    let want = expected();
    let a = &want["requests"][0];
    let body = first_add_body();
    let input_to = fixture("ipc-input.to_engine.bin");
    let at = input_to
        .windows(body.len())
        .position(|w| w == body.as_slice())
        .unwrap();
    // The type frame (3 bytes) and the short frame header (2) before the body.
    assert!(body.len() < 256);
    let (start, end) = (at - 5, at + body.len());
    for cut in [false, true] {
        let mut ipc = VllmIpc::default();
        let mut steps = Vec::new();
        use IpcDirection::{Read, Write};
        let input_from = fixture("ipc-input.from_engine.bin");
        feed(&mut ipc, &mut steps, &input_from, 100, 7, Read, 4096);
        if cut {
            // Cut five bytes into the body: inside the request id.
            input_syscall(
                &mut ipc,
                &mut steps,
                &input_to[..at + 5],
                (body.len() - 5) as u64,
            );
        } else {
            input_syscall(&mut ipc, &mut steps, &input_to[..start], 0);
        }
        input_syscall(&mut ipc, &mut steps, &input_to[end..], 0);
        let output_to = fixture("ipc-output.to_engine.bin");
        let output_from = fixture("ipc-output.from_engine.bin");
        feed(&mut ipc, &mut steps, &output_to, 100, 8, Write, 4096);
        feed(&mut ipc, &mut steps, &output_from, 100, 8, Read, 4096);

        assert_eq!(counter(&ipc, "vllm_ipc_truncated"), u64::from(cut));
        assert_eq!(counter(&ipc, "vllm_requests_added"), 3);
        let queued = ns(&a["queued"]).unwrap();
        let first_token = ns(&a["first_output_ts"]).unwrap() + 100_000;
        let mut rec = http_record(
            a["external_req_id"].as_str().unwrap(),
            queued - 2_000_000,
            first_token,
            first_token + 1_000_000,
        );
        ipc.enrich(&mut rec);
        assert_eq!(rec.admitted_mono_ns, ns(&a["scheduled"]), "cut: {cut}");
        assert_eq!(rec.prompt_tokens, None, "cut: {cut}");
        assert_eq!(rec.engine_unknown, vec!["prompt_tokens"], "cut: {cut}");
    }
}

/// The fixture's output stream from its first `EngineCoreOutputs` on: what an agent that
/// attached after the start-up handshake sees (each syscall holds whole messages).
fn outputs_joined_late() -> Vec<u8> {
    let bytes = fixture("ipc-output.from_engine.bin");
    // A long frame (flags 0x02, 8-byte size) holding an array of 9 fields: 0x99.
    let start = bytes
        .windows(10)
        .position(|w| w[0] == 0x02 && w[9] == 0x99)
        .unwrap();
    bytes[start..].to_vec()
}

/// The version as discovery reads it: a site-packages with a real
/// `vllm-<version>.dist-info/METADATA`.
fn package_version(version: &str) -> Option<String> {
    let root = tempfile::tempdir().unwrap();
    let seen_as = "/venv/lib/python3.11/site-packages";
    let dist = root
        .path()
        .join(seen_as.trim_start_matches('/'))
        .join(format!("vllm-{version}.dist-info"));
    std::fs::create_dir_all(&dist).unwrap();
    std::fs::write(
        dist.join("METADATA"),
        format!("Metadata-Version: 2.4\nName: vllm\nVersion: {version}\nSummary: x\n\n"),
    )
    .unwrap();
    crate::engines::package::version_in(root.path(), seen_as, "vllm")
}

/// The version from the installed package, with no handshake seen: 0.99 (no pinned layout)
/// is refused and counted, its messages counted and left undecoded; 0.33.0 pins the layout
/// (nothing assumed) and every message is decoded.
#[test]
fn the_package_version_pins_or_refuses_the_layout() {
    let want_steps = expected()["steps"].as_array().unwrap().len();
    let bytes = outputs_joined_late();
    for (version, supported) in [("0.99.0", false), ("0.33.0", true)] {
        let mut ipc = VllmIpc::default();
        let mut steps = Vec::new();
        let found = package_version(version);
        assert_eq!(found.as_deref(), Some(version));
        ipc.learn_package_version(1, found.as_deref());
        feed(
            &mut ipc,
            &mut steps,
            &bytes,
            1,
            8,
            IpcDirection::Read,
            usize::MAX,
        );
        let c = |name: &str| counter(&ipc, name);
        assert_eq!(c("vllm_ipc_layout_assumed"), 0, "{version}");
        if supported {
            assert_eq!(steps.len(), want_steps);
            assert_eq!(c("vllm_version_from_package"), 1);
            assert_eq!(c("vllm_version_unsupported"), 0);
            assert_eq!(c("vllm_ipc_messages"), 6);
        } else {
            assert!(steps.is_empty(), "{steps:#?}");
            assert!(ipc.state().is_empty());
            assert_eq!(c("vllm_version_unsupported"), 1);
            assert_eq!(c("vllm_version_from_package"), 0);
            assert_eq!(c("vllm_ipc_unsupported_version"), 6);
            assert_eq!(c("vllm_ipc_messages"), 0);
        }
    }
    // No metadata found: counted, and the newest layout is assumed (and checked).
    let mut ipc = VllmIpc::default();
    ipc.learn_package_version(1, None);
    let mut steps = Vec::new();
    feed(
        &mut ipc,
        &mut steps,
        &bytes,
        1,
        8,
        IpcDirection::Read,
        usize::MAX,
    );
    assert_eq!(counter(&ipc, "vllm_version_package_not_found"), 1);
    assert_eq!(counter(&ipc, "vllm_ipc_layout_assumed"), 6);
}
