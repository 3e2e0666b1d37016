//! Scheduler uprobes on the real llama.cpp engine: TTFT split into queue wait and prefill, per
//! request, with admission joined exactly through the engine's task id.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Command, time::Duration};

use inferscope_integration_tests::{
    agent::{self, Recorder, read_records},
    client::Client,
    engine::{self, Engine},
    free_port,
    split::assert_llamacpp_split,
};
use serde_json::Value;

/// The README's first command, `inferscope demo`: it starts the bundled engine, loads it, and
/// shows what the agent saw. Every stream the demo's clients read is one record with all its
/// tokens and TTFT split into queue wait and prefill, and no prompt text reaches the output.
#[test]
fn the_demo_records_every_stream_its_clients_read() {
    let _machine = inferscope_integration_tests::exclusive();
    let dir = inferscope_integration_tests::test_dir("demo");
    let out = dir.join("demo.jsonl");
    let output = Command::new(agent::binary())
        .arg("demo")
        .arg("--python")
        .arg(engine::python())
        .args(["--port", &free_port().to_string()])
        .args(["--requests", "6", "--concurrency", "3", "--slots", "2"])
        .args(["--max-tokens", "12", "--out"])
        .arg(&out)
        .output()
        .expect("run inferscope demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("client saw 6 streams; 6 matched an agent record by stream id"),
        "{stdout}\n{stderr}"
    );
    let text = std::fs::read_to_string(&out).unwrap();
    for shown in [stdout.as_ref(), stderr.as_ref(), text.as_str()] {
        assert!(
            !shown.contains("Write three short sentences"),
            "prompt text in the demo's output:\n{shown}"
        );
    }
    let records = read_records(&out);
    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 6, "{records:#?}");
    // The demo's readiness probes (GET /health, 503 while the model loads) are recorded, but the
    // table and the summary hold the 6 requests alone, and one line counts the probes.
    let probes = records.iter().filter(|r| r["path"] == "/health").count();
    assert_eq!(probes + 6, records.len(), "{records:#?}");
    let table_rows = stdout.lines().filter(|l| l.contains("chatcmpl-")).count();
    assert_eq!(table_rows, 6, "{stdout}");
    assert!(
        stdout
            .lines()
            .all(|l| l.contains("readiness probe") || !l.contains(" 503 ")),
        "{stdout}"
    );
    assert!(stdout.contains("\n6 requests (0 aborted)"), "{stdout}");
    let probes_line = stdout.lines().find(|l| l.contains("readiness probe"));
    match probes {
        0 => assert_eq!(probes_line, None, "{stdout}"),
        n => assert!(
            probes_line.is_some_and(|l| l.starts_with(&format!("+ {n} readiness probe"))),
            "{n} probes recorded:\n{stdout}"
        ),
    }
    for r in chats {
        assert_eq!(r["status"], 200, "{r:#}");
        assert_eq!(r["output_chunks"], 12, "{r:#}");
        assert_eq!(r["completion_tokens"], 12, "{r:#}");
        assert!(r["prompt_tokens"].as_u64().is_some_and(|n| n > 0), "{r:#}");
        let ttft = r["ttft_ms"].as_f64().expect("ttft");
        let queue = r["queue_wait_ms"].as_f64().expect("queue wait");
        let prefill = r["prefill_ms"].as_f64().expect("prefill");
        assert!(ttft > 0.0 && queue >= 0.0 && prefill > 0.0, "{r:#}");
        assert!((queue + prefill - ttft).abs() < 0.01, "{r:#}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn queue_wait_and_prefill_for_six_streams_on_two_slots() {
    // Asserts engine timing to 5 ms: another test's engine on the same 2 cores would skew it.
    let _machine = inferscope_integration_tests::exclusive();
    let dir = inferscope_integration_tests::test_dir("sched");
    let port = free_port();
    // The engine runs before the agent: hooks attach to a live process.
    let engine = Engine::start(port, 2);
    let steps_path = dir.join("steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    // --token-hooks: the engine's own first token too (tests/llama_server.rs runs without).
    let mut recorder = Recorder::start(
        &dir,
        &[
            "--port",
            &port.to_string(),
            "--steps",
            &steps_arg,
            "--token-hooks",
        ],
    );
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    let topics = ["rivers", "owls", "glaciers", "pianos", "comets", "gardens"];
    let clients: Vec<_> = topics
        .iter()
        .enumerate()
        .map(|(i, topic)| {
            let prompt = format!("({i}) Write two sentences about {topic}.");
            std::thread::spawn(move || Client::connect(port).chat(&prompt, 16, None))
        })
        .collect();
    let streams: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    recorder.wait_chat_records(6);
    let log = recorder.log_text();
    let records = recorder.stop();
    drop(engine);

    assert!(log.contains("scheduler hook attached"), "{log}");
    // The wheel carries DWARF for server_task (not for server_slot, whose code is built
    // without -g): the task id's offset is read, not assumed.
    assert!(
        log.lines()
            .any(|l| l.contains("struct offset from DWARF") && l.contains("server_task")),
        "{log}"
    );
    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 6, "{records:#?}");
    for s in &streams {
        assert!(
            chats
                .iter()
                .any(|r| r["response_id"].as_str() == s.response_id.as_deref())
        );
    }

    for r in &chats {
        assert_llamacpp_split(r, true);
        assert!(r["engine_slot"].as_u64().is_some_and(|s| s < 2), "{r:#?}");
        // One decode step per token after the first.
        let tokens = r["completion_tokens"].as_u64().expect("usage");
        let decode = r["decode_steps"].as_u64().expect("decode_steps");
        assert!(
            decode.abs_diff(tokens - 1) <= 1,
            "{decode} decode steps for {tokens} tokens: {r:#?}"
        );
    }
    // Step records: each lists the requests in the batch with their phase.
    let steps = inferscope_integration_tests::agent::read_records(&steps_path);
    assert!(steps.len() >= 16, "{steps:#?}");
    // With 2 slots, every admission after the first two had to wait for a slot to free: the
    // engine parked those requests, and a finishing request's slot took each back.
    let mut by_admission: Vec<&&Value> = chats.iter().collect();
    by_admission.sort_by_key(|r| r["admitted_mono_ns"].as_u64());
    let mut waited = 0;
    let mut gaps_ms = Vec::new();
    for (i, r) in by_admission.iter().enumerate() {
        let admitted = r["admitted_mono_ns"].as_u64().expect("admitted");
        let Some(deferred) = r["deferred_mono_ns"].as_u64() else {
            assert!(i < 2, "only the first two find a free slot: {r:#?}");
            continue;
        };
        assert!(r["queue_wait_ms"].as_f64().unwrap_or(0.0) > 10.0, "{r:#?}");
        let requeued = r["requeued_mono_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("requeued_mono_ns: {r:#?}"));
        assert!(deferred < requeued && requeued <= admitted, "{r:#?}");
        // The engine's finish of an earlier request freed the slot.
        let since_finish_ms = chats
            .iter()
            .filter(|other| other["request_id"] != r["request_id"])
            .filter_map(|other| other["engine_finished_mono_ns"].as_u64())
            .filter(|finished| *finished <= admitted)
            .map(|finished| (admitted - finished) as f64 / 1e6)
            .fold(f64::INFINITY, f64::min);
        gaps_ms.push(since_finish_ms);
        waited += 1;
    }
    for step in &steps {
        assert!(step["end_mono_ns"].as_u64() >= step["start_mono_ns"].as_u64());
        let members = step["requests"].as_array().expect("requests");
        assert!(members.len() <= 2, "2 slots: {step:#?}");
        assert_eq!(step["sequences"].as_u64(), Some(members.len() as u64));
        let prefilling = members.iter().filter(|m| m["phase"] == "prefill").count();
        assert_eq!(step["prefilling"].as_u64(), Some(prefilling as u64));
    }
    for r in &chats {
        let id = r["request_id"].as_str().expect("id");
        let phases: Vec<&str> = steps
            .iter()
            .flat_map(|s| s["requests"].as_array().into_iter().flatten())
            .filter(|m| m["request_id"] == id)
            .filter_map(|m| m["phase"].as_str())
            .collect();
        assert_eq!(phases.first(), Some(&"prefill"), "{id}: {phases:?}");
        assert_eq!(
            phases.iter().filter(|p| **p == "prefill").count(),
            1,
            "{id}: {phases:?}"
        );
    }
    let handoffs: Vec<f64> = chats
        .iter()
        .filter_map(|r| r["first_token_handoff_ms"].as_f64())
        .collect();
    eprintln!("finish-to-admission gaps {gaps_ms:.3?} ms; first-token hand-offs {handoffs:.3?} ms");
    // Each deferred admission follows an earlier request's finish in the engine within 5 ms.
    assert!(
        gaps_ms.iter().all(|g| *g <= 5.0),
        "finish-to-admission gaps {gaps_ms:?} ms: {chats:#?}"
    );
    assert!(
        waited >= 3,
        "at least 3 of 6 requests waited for one of 2 slots: {chats:#?}"
    );
}

#[test]
fn an_engine_without_the_hooked_functions_still_gets_socket_records_and_a_clear_warning() {
    let _machine = inferscope_integration_tests::exclusive();
    let dir = inferscope_integration_tests::test_dir("nohooks");
    // A server named like llama.cpp's (so the llama.cpp plugin claims it) that has none of its
    // scheduler functions: what a stripped or unfamiliar build looks like to the agent.
    let fake = dir.join("llama-server");
    std::fs::copy(env!("CARGO_BIN_EXE_sse_load"), &fake).expect("copying sse_load");
    let port = free_port();
    let mut server = std::process::Command::new(&fake)
        .args(["serve", "--port", &port.to_string(), "--tokens", "5"])
        .spawn()
        .expect("starting the stand-in server");
    let mut recorder = Recorder::start(&dir, &["--auto"]);
    recorder.wait_attached(server.id(), Duration::from_secs(30));
    let stream = Client::connect(port).chat("hello", 5, None);
    // --auto traces every engine on the machine: keep this server's records.
    let pid = server.id();
    recorder.wait_records(Duration::from_secs(30), "the stream's record", |records| {
        records.iter().any(|r| r["pid"] == pid)
    });
    let log = recorder.log_text();
    let records: Vec<Value> = recorder
        .stop()
        .into_iter()
        .filter(|r| r["pid"] == pid)
        .collect();
    let _ = server.kill();
    let _ = server.wait();

    assert!(
        log.contains("scheduler function not found")
            && log.contains("admission (queue wait vs prefill)"),
        "{log}"
    );
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert_eq!(r["engine"], "llamacpp");
    assert_eq!(r["response_id"].as_str(), stream.response_id.as_deref());
    assert_eq!(r["output_chunks"], 5);
    assert!(r["ttft_ms"].is_f64());
    assert!(r["queue_wait_ms"].is_null() && r["prefill_ms"].is_null());
}
