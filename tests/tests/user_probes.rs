//! User-defined probes on a native engine inferscope ships no profile for (tests/native-engine):
//! a spec file names its functions, and the agent splits TTFT and records steps from them. Bad
//! probes (a missing symbol, a wrong offset) are disabled with a warning, and the engine and the
//! socket-level records carry on unharmed.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use inferscope_integration_tests::{
    agent::{self, Recorder, read_records},
    client::Client,
    free_port, native_engine,
    native_engine::NativeEngine,
};
use serde_json::Value;

const GOOD_SPEC: &str = r#"
[[probe]]
object = "native-engine"
symbol = "engine_enqueue"
event = "arrival"
id_from = "thread"
id = { from = "arg0", type = "u64" }

[[probe]]
object = "native-engine"
symbol = "engine_admit"
event = "admit"
# struct task *t: t->req (offset 8) points to the request, whose id sits at offset 24.
id = { from = "arg0", deref = [8], offset = 24, type = "u64" }

[[probe]]
object = "native-engine"
symbol = "engine_step"
event = "step_begin"
id = { from = "arg0", type = "u32" }

[[probe]]
object = "native-engine"
symbol = "engine_step"
event = "step_end"
at = "return"

[[probe]]
object = "native-engine"
symbol = "engine_first_token"
event = "first_token"
id = { from = "arg0" }

[[probe]]
object = "native-engine"
symbol = "engine_finish"
event = "finish"
id = { from = "arg0" }
"#;

const BAD_SPEC: &str = r#"
max_failures = 2

[[probe]]
object = "native-engine"
symbol = "engine_enqueue"
event = "arrival"
id = { from = "arg0" }

[[probe]]
name = "misspelt"
object = "native-engine"
symbol = "engine_enqueue_v2"
event = "arrival"
id = { from = "arg0" }

[[probe]]
name = "wrong-offset"
object = "native-engine"
symbol = "engine_admit"
event = "admit"
# One dereference too many: the request's first word is 0, so the final read is at address 24.
id = { from = "arg0", deref = [8, 0], offset = 24 }
"#;

/// The first code byte of `symbol` in the running engine, and the same byte in its file. A live
/// uprobe shows as an int3 (0xcc) in the process; a removed one restores the file's byte.
fn entry_bytes(pid: u32, symbol: &str) -> (u8, u8) {
    let bin = native_engine::binary();
    let nm = std::process::Command::new("nm")
        .arg(bin)
        .output()
        .expect("running nm");
    let text = String::from_utf8_lossy(&nm.stdout);
    let value = text
        .lines()
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            let (v, _, name) = (parts.next()?, parts.next()?, parts.next()?);
            (name == symbol).then(|| u64::from_str_radix(v, 16).ok())?
        })
        .unwrap_or_else(|| panic!("{symbol} not in nm output"));
    // PIE: the file is mapped from offset 0 at the lowest address; text addresses equal file
    // offsets in the executable's layout (checked by reading the file there).
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let base = maps
        .lines()
        .find(|l| l.contains("native-engine"))
        .and_then(|l| l.split('-').next())
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .expect("engine mapping");
    let mut live = [0u8];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("/proc/PID/mem");
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut live, base + value).expect("reading");
    let file = std::fs::read(bin).expect("reading the engine binary");
    (live[0], file[value as usize])
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    inferscope_integration_tests::test_dir(name)
}

fn write_spec(dir: &Path, text: &str) -> String {
    let path = dir.join("probes.toml");
    std::fs::write(&path, text).expect("writing the spec");
    path.to_string_lossy().into_owned()
}

/// The engine's request id, which it puts in its response id ("chatcmpl-<id>").
fn engine_id(record: &Value) -> i64 {
    record["response_id"]
        .as_str()
        .and_then(|s| s.strip_prefix("chatcmpl-"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("response id: {record:#?}"))
}

#[test]
fn user_probes_split_ttft_and_record_steps() {
    let dir = temp_dir("user-probes");
    let port = free_port();
    let mut engine = NativeEngine::start(port);
    let spec = write_spec(&dir, GOOD_SPEC);
    let steps_path = dir.join("steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    let mut recorder = Recorder::start(
        &dir,
        &[
            "--port",
            &port.to_string(),
            "--probes",
            &spec,
            "--steps",
            &steps_arg,
        ],
    );
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    // Six concurrent streams on two slots: four wait in the queue.
    let clients: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || Client::connect(port).chat(&format!("prompt {i}"), 6, None))
        })
        .collect();
    let streams: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    assert!(streams.iter().all(|s| s.completed && s.content_chunks == 6));
    recorder.wait_chat_records(6);
    let log = recorder.log_text();
    let (live, file) = entry_bytes(engine.pid(), "engine_admit");
    assert_eq!(
        live, 0xcc,
        "a live uprobe is an int3 at the function's entry"
    );
    assert_ne!(file, 0xcc);
    let records = recorder.stop();
    // SIGINT: the agent removed every probe on its way out.
    assert_eq!(entry_bytes(engine.pid(), "engine_admit"), (file, file));
    assert_eq!(
        entry_bytes(engine.pid(), "engine_step").0,
        entry_bytes(engine.pid(), "engine_step").1
    );
    assert_eq!(log.matches("user probe attached").count(), 6, "{log}");
    assert!(!log.contains("user probe disabled"), "{log}");

    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 6, "{records:#?}");
    let mut waited = 0;
    for r in &chats {
        // The exact join: the id the probes read is the engine's id for this very request.
        assert_eq!(r["engine_task_id"].as_i64(), Some(engine_id(r)), "{r:#?}");
        let arrival = r["arrival_mono_ns"].as_u64().expect("arrival");
        let admitted = r["admitted_mono_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("admitted_mono_ns: {r:#?}"));
        assert!(admitted >= arrival, "{r:#?}");
        let queue = r["queue_wait_ms"].as_f64().expect("queue_wait_ms");
        let prefill = r["prefill_ms"].as_f64().expect("prefill_ms");
        // Admission → the engine's first token is one 4 ms step.
        assert!((3.0..200.0).contains(&prefill), "prefill {prefill}: {r:#?}");
        if queue > 10.0 {
            waited += 1;
        }
        assert_eq!(r["preemptions"], 0);
        let prefill_steps = r["prefill_steps"].as_u64().expect("prefill_steps");
        let decode_steps = r["decode_steps"].as_u64().expect("decode_steps");
        assert!(prefill_steps >= 1, "{r:#?}");
        assert!(decode_steps >= 4, "{r:#?}");
    }
    assert!(
        waited >= 3,
        "{waited} requests waited in the queue: {chats:#?}"
    );

    let steps = read_records(&steps_path);
    assert!(steps.len() >= 6 * 6 / 2, "{} steps", steps.len());
    for s in &steps {
        assert_eq!(s["pid"].as_u64(), Some(u64::from(engine.pid())));
        let tokens = s["batch_tokens"]
            .as_u64()
            .expect("batch tokens from step_begin");
        let members = s["requests"].as_array().expect("requests");
        assert!(members.len() <= 2, "two slots: {s:#?}");
        assert!(tokens >= 1, "{s:#?}");
    }
    // Every request took part in steps, prefilling first.
    for r in &chats {
        let id = r["request_id"].as_str().expect("request_id");
        let phases: Vec<&str> = steps
            .iter()
            .flat_map(|s| s["requests"].as_array().into_iter().flatten())
            .filter(|m| m["request_id"] == id)
            .filter_map(|m| m["phase"].as_str())
            .collect();
        assert!(phases.len() >= 5, "{id}: {phases:?}");
        assert_eq!(phases[0], "prefill", "{id}: {phases:?}");
    }

    // The agent is gone (SIGINT) and took its probes with it: the engine serves on.
    assert!(engine.is_running());
    let after = Client::connect(port).chat("after", 6, None);
    assert!(after.completed && after.content_chunks == 6);
}

#[test]
fn bad_probes_are_disabled_and_socket_records_keep_coming() {
    let dir = temp_dir("user-probes-bad");
    let port = free_port();
    let mut engine = NativeEngine::start(port);
    let spec = write_spec(&dir, BAD_SPEC);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string(), "--probes", &spec]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    let mut client = Client::connect(port);
    for i in 0..6 {
        let stream = client.chat(&format!("prompt {i}"), 6, None);
        assert!(
            stream.completed && stream.content_chunks == 6,
            "request {i}"
        );
        // Traffic shaping: room for the agent to notice the failures and detach the probe
        // between requests (the test counts the failed reads before it went).
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(recorder.is_running(), "{}", recorder.log_text());
    recorder.wait_chat_records(6);
    inferscope_integration_tests::wait_until(
        Duration::from_secs(10),
        "the failing probe detached",
        || {
            let (live, file) = entry_bytes(engine.pid(), "engine_admit");
            live == file
        },
    );
    let (live, file) = entry_bytes(engine.pid(), "engine_enqueue");
    assert_eq!((live, file != 0xcc), (0xcc, true), "the good probe is live");
    // The disabled probe is gone while the agent still runs.
    let (live, file) = entry_bytes(engine.pid(), "engine_admit");
    assert_eq!(live, file, "the failing probe was detached");
    let records = recorder.stop_with("-TERM");
    // SIGTERM removes the probes too.
    let (live, file) = entry_bytes(engine.pid(), "engine_enqueue");
    assert_eq!(live, file);
    // Read after the agent exited: the counters are logged on the way out.
    let counters = agent::Counters::beside(&dir.join("agent.log"));
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();

    assert!(engine.is_running(), "the engine survived");
    assert!(
        log.contains("user probe not attached") && log.contains("engine_enqueue_v2"),
        "missing symbol reported: {log}"
    );
    assert!(
        log.contains("2 reads in a row failed"),
        "bad offset reported: {log}"
    );
    assert_eq!(log.matches("user probe attached").count(), 2, "{log}");
    assert_eq!(counters.get("user_probes_disabled"), 1, "{log}");
    let failed = counters.get("user_probe_read_failed");
    assert!(
        (2..=3).contains(&failed),
        "{failed} failed reads before the probe went: {log}"
    );

    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 6, "{records:#?}");
    for r in &chats {
        // Socket-level timing as always; the good arrival probe still links the id.
        assert!(r["ttft_ms"].as_f64().is_some(), "{r:#?}");
        assert_eq!(r["engine_task_id"].as_i64(), Some(engine_id(r)), "{r:#?}");
        assert!(r["admitted_mono_ns"].is_null(), "{r:#?}");
    }
}

const LATE_SPEC: &str = r#"
[[probe]]
object = "native-engine"
symbol = "engine_enqueue"
event = "arrival"
id = { from = "arg0", type = "u64" }

[[probe]]
name = "plugin"
object = "libengine_plugin"
symbol = "plugin_first_token"
event = "first_token"
id = { from = "arg0", type = "u64" }
"#;

#[test]
fn a_probe_in_a_library_loaded_later_attaches_when_the_library_appears() {
    let dir = temp_dir("user-probes-late");
    let port = free_port();
    let mut engine = NativeEngine::start_with(port, Some(native_engine::plugin()));
    let spec = write_spec(&dir, LATE_SPEC);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string(), "--probes", &spec]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    // The engine loads its plugin once this first request is done.
    let first = Client::connect(port).chat("one", 6, None);
    // The agent looks at processes with missing probes every 2 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !recorder.log_text().contains("late=true") {
        assert!(
            std::time::Instant::now() < deadline,
            "the plugin's probe was not attached: {}",
            recorder.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let second = Client::connect(port).chat("two", 6, None);
    let second_id = second.response_id.clone();
    recorder.wait_records(
        Duration::from_secs(30),
        "the second request's record",
        |records| {
            records
                .iter()
                .any(|r| r["response_id"].as_str() == second_id.as_deref())
        },
    );
    let records = recorder.stop();
    // Read after the agent exited: the counters are logged on the way out.
    let counters = agent::Counters::beside(&dir.join("agent.log"));
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(engine.is_running());

    assert!(
        log.contains("user probe waiting") && log.contains("libengine_plugin"),
        "{log}"
    );
    assert_eq!(counters.get("hooks_attached_late"), 1, "{log}");
    let by_stream = |id: &Option<String>| {
        records
            .iter()
            .find(|r| r["response_id"].as_str() == id.as_deref())
            .unwrap_or_else(|| panic!("{id:?} in {records:#?}"))
    };
    let before = by_stream(&first.response_id);
    let after = by_stream(&second.response_id);
    assert!(
        before["engine_first_token_mono_ns"].is_null(),
        "{before:#?}"
    );
    let engine_first = after["engine_first_token_mono_ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("the late probe saw the first token: {after:#?}"));
    let wire_first = after["first_token_mono_ns"].as_u64().expect("first token");
    assert!(engine_first <= wire_first, "{after:#?}");
}
