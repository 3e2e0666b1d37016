//! Scheduler uprobes on the standalone `llama-server` executable (scripts/build-llama-server.sh
//! builds it from the llama.cpp source vendored in the pinned xllamacpp, with shared libraries
//! like distro packages): the server's scheduler lives in its own shared object and the engine
//! steps in libllama.so, not in one Python extension module as in tests/scheduler_hooks.rs.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use inferscope_integration_tests::{
    agent::{Recorder, read_records},
    client::{Client, ClientStream},
    engine::{Engine, llama_server_dir},
    free_port,
    split::assert_llamacpp_split,
};
use serde_json::Value;

fn temp_dir(name: &str) -> std::path::PathBuf {
    inferscope_integration_tests::test_dir(name)
}

/// `n` concurrent streaming chats of 16 tokens each.
fn concurrent_streams(port: u16, n: usize) -> Vec<ClientStream> {
    let topics = ["rivers", "owls", "glaciers", "pianos", "comets", "gardens"];
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let prompt = format!("({i}) Write two sentences about {}.", topics[i % 6]);
            std::thread::spawn(move || Client::connect(port).chat(&prompt, 16, None))
        })
        .collect();
    clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect()
}

/// The chat records, one per stream, matched by the response id each client saw.
fn chats<'a>(records: &'a [Value], streams: &[ClientStream]) -> Vec<&'a Value> {
    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), streams.len(), "{records:#?}");
    for s in streams {
        assert!(
            chats
                .iter()
                .any(|r| r["response_id"].as_str() == s.response_id.as_deref()),
            "no record for {:?}: {chats:#?}",
            s.response_id
        );
    }
    chats
}

/// The log lines that mention `needle`, for assertion messages.
fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

/// Whether the agent reports the hook on `symbol` attached.
fn attached(log: &str, symbol: &str) -> bool {
    lines_with(log, "scheduler hook attached")
        .iter()
        .any(|l| l.contains(&format!("symbol=\"{symbol}")))
}

fn assert_full_hooks(log: &str) {
    for symbol in [
        "server_queue::post",
        "server_queue::defer",
        "server_queue::pop_deferred_task",
        "server_context_impl::launch_slot_with_task",
        "server_context_impl::send_final_response",
        "server_slot::release",
        "llama_decode",
    ] {
        assert!(
            attached(log, symbol),
            "{symbol} not attached: {:#?}",
            lines_with(log, "scheduler")
        );
    }
}

/// Every request split (see `assert_llamacpp_split`; no per-token hooks here); returns how many
/// waited for a slot: the engine parked them until a freed slot took them back.
fn assert_split(chats: &[&Value]) -> usize {
    chats
        .iter()
        .filter(|r| assert_llamacpp_split(r, false))
        .inspect(|r| assert!(r["queue_wait_ms"].as_f64() > Some(10.0), "{r:#?}"))
        .count()
}

fn record_against(
    binary: &Path,
    dir: &Path,
    agent_first: bool,
) -> (String, Vec<Value>, Vec<Value>, Vec<ClientStream>) {
    let port = free_port();
    let steps_path = dir.join("steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    let agent_args = ["--port", &port.to_string(), "--steps", &steps_arg];
    let (engine, mut recorder) = if agent_first {
        let mut recorder = Recorder::start(dir, &agent_args);
        // The agent is up (its probes are loaded) before the engine exists.
        inferscope_integration_tests::agent::wait_log(
            &recorder.log,
            "recording",
            Duration::from_secs(30),
        );
        assert!(recorder.is_running(), "{}", recorder.log_text());
        let engine = Engine::start_binary(binary, port, 2, &dir.join("engine.log"));
        (engine, recorder)
    } else {
        let engine = Engine::start_binary(binary, port, 2, &dir.join("engine.log"));
        (engine, Recorder::start(dir, &agent_args))
    };
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));
    let streams = concurrent_streams(port, 6);
    recorder.wait_chat_records(6);
    let log = recorder.log_text();
    let records = recorder.stop();
    drop(engine);
    (log, records, read_records(&steps_path), streams)
}

#[test]
fn unstripped_binary_splits_ttft_for_six_streams_on_two_slots() {
    let dir = temp_dir("llama-server");
    let binary = llama_server_dir().join("llama-server");
    let (log, records, steps, streams) = record_against(&binary, &dir, false);

    assert_full_hooks(&log);
    let chats = chats(&records, &streams);
    for r in &chats {
        assert_eq!(r["engine"], "llamacpp");
    }
    let waited = assert_split(&chats);
    assert!(
        waited >= 3,
        "at least 3 of 6 requests waited for one of 2 slots: {chats:#?}"
    );
    // Steps come from libllama.so (llama_process in this build), each with its batch's requests and phases.
    assert!(steps.len() >= 16, "{steps:#?}");
    for step in &steps {
        let members = step["requests"].as_array().expect("requests");
        assert!(members.len() <= 2, "2 slots: {step:#?}");
    }
}

#[test]
fn binary_started_after_the_agent_gets_its_hooks() {
    let dir = temp_dir("llama-server-late");
    let binary = llama_server_dir().join("llama-server");
    let (log, records, steps, streams) = record_against(&binary, &dir, true);

    assert_full_hooks(&log);
    let chats = chats(&records, &streams);
    let waited = assert_split(&chats);
    assert!(waited >= 3, "{chats:#?}");
    assert!(!steps.is_empty());
}

#[test]
fn stripped_distro_layout_gives_socket_records_steps_and_names_what_is_missing() {
    let dir = temp_dir("llama-server-stripped");
    let binary = llama_server_dir().join("stripped/llama-server");
    let (log, records, steps, streams) = record_against(&binary, &dir, false);

    // `strip --strip-all` removed .symtab everywhere: the agent says so for each engine object.
    let notes = lines_with(
        &log,
        "stripped build: only exported functions can be hooked",
    );
    for object in ["stripped/llama-server", "stripped/libllama.so"] {
        assert!(
            notes.iter().any(|l| l.contains(object)),
            "no stripped-build note for {object}: {notes:#?}\n{log}"
        );
    }
    // The server is linked into the executable, which exports none of it: the task and
    // admission hooks are missing, and the agent names what that costs.
    let missing = lines_with(&log, "scheduler function not found");
    for lost in [
        "the join from HTTP request to engine task",
        "admission (queue wait vs prefill)",
        "the engine's own finish time",
    ] {
        assert!(
            missing.iter().any(|l| l.contains(lost)),
            "no note about {lost}: {missing:#?}\n{log}"
        );
    }
    assert!(!attached(&log, "server_queue::post"), "{log}");
    assert!(
        !attached(&log, "server_context_impl::launch_slot_with_task"),
        "{log}"
    );
    // libllama.so's exported C API still gives the engine steps.
    assert!(attached(&log, "llama_decode"), "{log}");
    assert!(attached(&log, "llama_process"), "{log}");
    assert!(steps.len() >= 16, "{steps:#?}");
    for step in &steps {
        assert!(step["end_mono_ns"].as_u64() >= step["start_mono_ns"].as_u64());
        // Without the task join no request can be placed in a batch.
        assert_eq!(step["requests"], serde_json::json!([]), "{step:#?}");
    }
    // Socket-level records for every stream, without a split it cannot make.
    let chats = chats(&records, &streams);
    for r in &chats {
        assert_eq!(r["engine"], "llamacpp");
        assert!(r["ttft_ms"].is_f64(), "{r:#?}");
        // 16 tokens asked for; the model may end its answer sooner.
        assert!(
            r["output_chunks"]
                .as_u64()
                .is_some_and(|n| (1..=16).contains(&n)),
            "{r:#?}"
        );
        assert!(r["engine_prompt_ms"].is_f64(), "{r:#?}");
        assert!(
            r["queue_wait_ms"].is_null() && r["prefill_ms"].is_null(),
            "{r:#?}"
        );
    }
}

#[test]
fn stripped_shared_layout_keeps_every_hook_through_its_exports() {
    let dir = temp_dir("llama-server-stripped-shared");
    let binary = llama_server_dir().join("stripped-shared/llama-server");
    let (log, records, steps, streams) = record_against(&binary, &dir, false);

    let notes = lines_with(
        &log,
        "stripped build: only exported functions can be hooked",
    );
    assert!(
        notes
            .iter()
            .any(|l| l.contains("stripped-shared/libllama-server-impl.so")),
        "{log}"
    );
    // The server's scheduler sits in libllama-server-impl.so with default visibility: its C++
    // functions are in .dynsym, which stripping keeps, so every hook resolves.
    assert_full_hooks(&log);
    assert!(
        lines_with(&log, "scheduler function not found").is_empty(),
        "{log}"
    );
    let chats = chats(&records, &streams);
    let waited = assert_split(&chats);
    assert!(waited >= 3, "{chats:#?}");
    assert!(steps.len() >= 16, "{steps:#?}");
}
