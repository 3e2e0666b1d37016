//! vLLM on its real scheduler (tests/engine/vllm): `vllm serve` on CPU with vLLM's own API
//! server, EngineCore, Scheduler, KV cache manager and ZeroMQ IPC; only the forward pass
//! sleeps. The real agent records it with eBPF; every record and step is checked against what
//! vLLM's scheduler itself logged (CLOCK_MONOTONIC): admission, prompt tokens, preemptions and
//! step times, with nothing invented and no IPC message lost.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use inferscope_integration_tests::{
    agent::{self, Recorder, read_records},
    daemon::Daemon,
    free_port, mock_cuda,
    vllm::{Truth, VllmOptions, VllmServer},
    vllm_load::{self, IdSource, Job, Kind, Outcome},
};
use serde_json::Value;

fn work_dir(name: &str) -> std::path::PathBuf {
    inferscope_integration_tests::test_dir(name)
}

fn prefix(kind: Kind) -> &'static str {
    match kind {
        Kind::Completion | Kind::CompletionN2 | Kind::CompletionBatch => "cmpl-",
        _ => "chatcmpl-",
    }
}

/// The external id vLLM gave the job's request.
fn external(job: &Job, outcome: &Outcome) -> Option<String> {
    match &job.id {
        IdSource::Header(id) | IdSource::Body(id) => Some(format!("{}{id}", prefix(job.kind))),
        IdSource::Generated => outcome.response_id.clone(),
    }
}

fn record_external(r: &Value) -> Option<String> {
    if let Some(id) = r["response_id"].as_str() {
        return Some(id.to_owned());
    }
    let x = r["x_request_id"].as_str()?;
    let p = if r["path"].as_str() == Some("/v1/completions") {
        "cmpl-"
    } else {
        "chatcmpl-"
    };
    Some(format!("{p}{x}"))
}

fn parent(id: &str) -> &str {
    match id.split_once('_') {
        Some((k, rest)) if k.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => id,
    }
}

#[derive(Debug, Default)]
struct Summary {
    records: usize,
    /// Clients that left while queued with no record (the test client closes its socket, and
    /// uvicorn closes its end when it reads the EOF: asserted 0).
    queued_aborts_open: usize,
    /// Clients that left while queued, recorded as client aborts (asserted: all of them).
    queued_aborts_recorded: usize,
    /// Clients that left mid-stream, recorded as client aborts (asserted: all of them).
    midstream_aborts_recorded: usize,
    admitted: usize,
    admission_max_err_ns: u64,
    preempted_requests: usize,
    preemptions_unknown: usize,
    long_prompts: usize,
    steps_truth: usize,
    steps_matched: usize,
    step_start_known: usize,
    step_start_within_1ms: usize,
    step_start_max_err_ns: u64,
    /// Steps whose start came from a SCHEDULED/PREEMPTED stamp, and their largest error.
    step_start_scheduled: usize,
    step_start_scheduled_max_err_ns: u64,
    /// Steps chained on the previous step's end (each exactly its engine's previous step).
    step_start_previous: usize,
    /// Records whose step counts (prefill, decode) equal vLLM's own per-request step list.
    request_steps_exact: usize,
    /// Of those, prefilled over more than one step (chunked prefill, or budget shared).
    request_prefill_chunked: usize,
    /// Aborted records: their steps up to the client's leaving (a subset of vLLM's).
    request_steps_aborted: usize,
}

/// Checks one server's records and steps against its scheduler's ground truth.
fn check(
    (pid, engine_core): (u32, u32),
    jobs: &[Job],
    outcomes: &[Outcome],
    records: &[Value],
    steps: &[Value],
    truth: &Truth,
) -> Summary {
    let mut s = Summary::default();
    let mine: Vec<&Value> = records
        .iter()
        .filter(|r| r["pid"] == pid && r["method"] == "POST")
        .collect();
    s.records = mine.len();
    assert!(
        mine.len() <= jobs.len(),
        "records nobody asked for: {mine:#?}"
    );
    let by_external: HashMap<String, &Value> = mine
        .iter()
        .filter_map(|r| record_external(r).map(|e| (e, *r)))
        .collect();
    let mut joined_engine_ids: HashSet<&String> = HashSet::new();
    for (job, outcome) in jobs.iter().zip(outcomes) {
        let ext = external(job, outcome)
            .unwrap_or_else(|| panic!("{job:?} got no stream id: {outcome:?}"));
        let members = truth.members(&ext);
        joined_engine_ids.extend(members.iter().map(|(id, _)| *id));
        let Some(rec) = by_external.get(&ext) else {
            // Only a client that left while its request was queued may lack a record here, and
            // only until the server closes its end (asserted 0 below: the test client closes
            // its socket, and uvicorn closes its end as soon as it reads the EOF).
            assert_eq!(
                job.kind,
                Kind::AbortQueued,
                "no record for {ext}: {outcome:?}"
            );
            s.queued_aborts_open += 1;
            continue;
        };
        assert_eq!(rec["engine"], "vllm", "{rec:#?}");
        if outcome.aborted_by_client {
            // The client left (before any answer, or mid-stream): a client abort.
            assert_eq!(rec["aborted"], true, "{job:?} {ext}: {rec:#?}");
            assert_eq!(rec["ended_by"], "client", "{job:?} {ext}: {rec:#?}");
            match job.kind {
                Kind::AbortQueued => s.queued_aborts_recorded += 1,
                Kind::AbortMidStream => s.midstream_aborts_recorded += 1,
                other => panic!("{other:?} aborted by the client: {outcome:?}"),
            }
        }
        let completed = !outcome.aborted_by_client;
        if completed {
            assert!(outcome.done, "{job:?}: {outcome:?}");
            let want = match job.kind {
                Kind::CompletionN2 => 2,
                Kind::CompletionBatch => 3,
                _ => 1,
            };
            assert_eq!(members.len(), want, "{ext}: {members:#?}");
        }
        // Admission: the first SCHEDULED of any of its engine requests, to the nanosecond
        // the engine stamped it (allowed: 1 ms).
        let scheduled = members
            .iter()
            .filter_map(|(_, t)| t.scheduled.first().copied())
            .min();
        match scheduled {
            Some(want) => {
                let got = rec["admitted_mono_ns"].as_u64().unwrap_or_else(|| {
                    panic!("{ext}: scheduled at {want}, no admission: {rec:#?}")
                });
                let err = got.abs_diff(want);
                assert!(
                    err <= 1_000_000,
                    "{ext}: admitted {got}, vLLM {want}: {rec:#?}"
                );
                s.admission_max_err_ns = s.admission_max_err_ns.max(err);
                s.admitted += 1;
            }
            None => assert!(
                rec["admitted_mono_ns"].is_null(),
                "{ext}: never scheduled, yet admitted: {rec:#?}"
            ),
        }
        if !members.is_empty() {
            let mut seen = HashSet::new();
            let prompt: u64 = members
                .iter()
                .filter(|(id, _)| seen.insert(parent(id)))
                .map(|(_, t)| t.prompt_tokens)
                .sum();
            assert_eq!(rec["prompt_tokens"], prompt, "{ext}: {rec:#?}");
            if prompt >= 2800 {
                s.long_prompts += 1;
            }
        }
        let preempted: usize = members.iter().map(|(_, t)| t.preempted.len()).sum();
        let aborted = rec["aborted"] == true || members.iter().any(|(_, t)| t.aborted);
        if scheduled.is_some() {
            if aborted {
                // vLLM tells a preemption only with the request's next output.
                assert!(rec["preemptions"].is_null(), "{ext}: {rec:#?}");
                s.preemptions_unknown += 1;
            } else {
                assert_eq!(rec["preemptions"], preempted as u64, "{ext}: {rec:#?}");
                if preempted > 0 {
                    s.preempted_requests += 1;
                }
            }
        }
        // Per-request steps: the steps vLLM scheduled any of its engine requests in, prefill
        // up to its first token (chunks included), all listed, none invented.
        if scheduled.is_some() {
            let ids: Vec<&String> = members.iter().map(|(id, _)| *id).collect();
            let want = truth.steps_of(&ids);
            let want_prefill = want.iter().filter(|(_, p)| *p).count() as u64;
            let want_decode = want.len() as u64 - want_prefill;
            let got_prefill = rec["prefill_steps"].as_u64();
            let got_decode = rec["decode_steps"].as_u64();
            if aborted {
                // Steps between the client's leaving and the engine's abort are not listed.
                let (p, d) = (got_prefill.unwrap_or(0), got_decode.unwrap_or(0));
                assert!(
                    p <= want_prefill && p + d <= want.len() as u64,
                    "{ext}: aborted, steps ({p}, {d}) beyond vLLM's ({want_prefill}, \
                     {want_decode}): {rec:#?}"
                );
                s.request_steps_aborted += 1;
            } else {
                assert_eq!(
                    (got_prefill, got_decode),
                    (Some(want_prefill), Some(want_decode)),
                    "{ext}: (prefill, decode) steps vs vLLM's {want:?}: {rec:#?}"
                );
                s.request_steps_exact += 1;
                if want_prefill > 1 {
                    s.request_prefill_chunked += 1;
                }
            }
        }
    }
    // Every client that left is recorded as a client abort: those that left mid-stream, and
    // those that left while queued (none still open).
    let jobs_of = |kind: Kind| {
        jobs.iter()
            .zip(outcomes)
            .filter(|(j, o)| j.kind == kind && o.aborted_by_client)
            .count()
    };
    assert_eq!(s.queued_aborts_open, 0, "{s:#?}");
    assert_eq!(
        s.queued_aborts_recorded,
        jobs_of(Kind::AbortQueued),
        "{s:#?}"
    );
    assert_eq!(
        s.midstream_aborts_recorded,
        jobs_of(Kind::AbortMidStream),
        "{s:#?}"
    );
    assert!(s.queued_aborts_recorded >= 1, "{s:#?}");
    assert!(s.midstream_aborts_recorded >= 1, "{s:#?}");
    // Every engine request belongs to a client request.
    let stray: Vec<&String> = truth
        .requests
        .keys()
        .filter(|id| !joined_engine_ids.contains(id))
        .collect();
    assert!(
        stray.is_empty(),
        "engine requests without a client: {stray:?}"
    );

    // Steps: one agent step per EngineCoreOutputs the scheduler produced, same end stamp.
    let agent_steps: Vec<&Value> = steps
        .iter()
        .filter(|st| st["engine"] == "vllm" && st["pid"] == pid)
        .collect();
    let by_end: HashMap<u64, &Value> = agent_steps
        .iter()
        .filter_map(|st| st["end_mono_ns"].as_u64().map(|e| (e, *st)))
        .collect();
    assert_eq!(
        by_end.len(),
        agent_steps.len(),
        "two agent steps with one end"
    );
    let truth_ends: HashSet<u64> = truth.steps.iter().map(|t| t.end_ns).collect();
    let invented: Vec<&&Value> = agent_steps
        .iter()
        .filter(|st| {
            !st["end_mono_ns"]
                .as_u64()
                .is_some_and(|e| truth_ends.contains(&e))
        })
        .collect();
    assert!(
        invented.is_empty(),
        "agent steps vLLM never took: {invented:#?}"
    );
    s.steps_truth = truth.steps.len();
    for (i, t) in truth.steps.iter().enumerate() {
        let Some(st) = by_end.get(&t.end_ns) else {
            panic!("vLLM's step {t:?} not recorded");
        };
        s.steps_matched += 1;
        // Its kernels are the EngineCore's (the step is seen on the API server's socket).
        assert_eq!(
            st["kernel_pid"].as_u64().or(st["pid"].as_u64()),
            Some(u64::from(engine_core)),
            "{st:#?}"
        );
        assert_eq!(st["running_requests"].as_u64(), t.running, "{st:#?} {t:?}");
        assert_eq!(st["waiting_requests"].as_u64(), t.waiting, "{st:#?} {t:?}");
        let start = st["start_mono_ns"].as_u64().unwrap();
        // Exact by construction (vLLM 0.33.0 on CPU runs steps one after another, no async
        // scheduling: vllm/platforms/cpu.py forces it off): schedule() is entered (the truth's
        // start) after the previous step's EngineCoreOutputs was built (its timestamp,
        // vllm/v1/engine/__init__.py EngineCoreOutputs.__post_init__), and a SCHEDULED /
        // PREEMPTED stamp is taken inside schedule() (vllm/v1/core/sched/scheduler.py,
        // `scheduled_timestamp`), after its entry.
        match st["start_from"].as_str() {
            Some("scheduled") => {
                s.step_start_scheduled += 1;
                let err = start.abs_diff(t.start_ns);
                s.step_start_scheduled_max_err_ns = s.step_start_scheduled_max_err_ns.max(err);
                // The start is one of the SCHEDULED/PREEMPTED stamps vLLM took in this step's
                // schedule(), to the stamp (how far that stamp lies after schedule()'s entry is
                // Python's own work before it: within 1 ms on a quiet machine, 1.17 ms once in
                // a full run on two loaded cores; counted in step_start_within_1ms below).
                let lo = i
                    .checked_sub(1)
                    .map_or(t.start_ns, |p| truth.steps[p].end_ns);
                let stamped = truth
                    .requests
                    .values()
                    .flat_map(|r| r.scheduled.iter().chain(&r.preempted))
                    .any(|&x| x > lo && x <= t.end_ns && x.abs_diff(start) <= 1_000);
                assert!(
                    stamped,
                    "not a stamp of this step's schedule(): {st:#?} {t:?}"
                );
                assert!(
                    start >= t.start_ns,
                    "stamp before schedule(): {st:#?} {t:?}"
                );
                assert!(
                    i == 0 || start > truth.steps[i - 1].end_ns,
                    "stamp of an earlier step: {st:#?} {t:?}"
                );
            }
            Some("previous_step") => {
                s.step_start_previous += 1;
                // Its own engine's previous step, never another's.
                let prev = i.checked_sub(1).map(|p| truth.steps[p].end_ns);
                assert_eq!(Some(start), prev, "{st:#?} {t:?}");
                assert!(
                    start <= t.start_ns,
                    "chained after schedule(): {st:#?} {t:?}"
                );
            }
            Some("unknown") => assert_eq!(start, t.end_ns, "{st:#?}"),
            other => panic!("start_from {other:?}: {st:#?}"),
        }
        if st["start_from"] != "unknown" {
            s.step_start_known += 1;
            let err = start.abs_diff(t.start_ns);
            s.step_start_max_err_ns = s.step_start_max_err_ns.max(err);
            if err <= 1_000_000 {
                s.step_start_within_1ms += 1;
            }
        }
    }
    assert_eq!(
        s.steps_matched, s.steps_truth,
        "every step vLLM took is recorded"
    );
    assert!(
        s.step_start_scheduled >= 1,
        "no step started at its stamp: {s:#?}"
    );
    s
}

/// A few requests of every kind before the agent attaches: the first requests a fresh vLLM
/// serves run its lazy start-up work (tokenizer, renderers) on the event loop.
fn warm_up(server: &VllmServer) -> u64 {
    let jobs = vllm_load::mix(8, "warm");
    let _ = vllm_load::run_all(server.port, &jobs, 8);
    // The engine's own log of the warm-up lags its answers by an unknown count of lines: a
    // settle, not a wait on something countable.
    std::thread::sleep(Duration::from_millis(500));
    server.truth_mark()
}

/// Waits until the agent wrote `n` POST records of `pids` (a request whose client left while
/// it was queued ends when the server closes its connection, which may take uvicorn seconds).
fn wait_records(out: &std::path::Path, pids: &[u32], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let got = read_records(out)
            .iter()
            .filter(|r| r["method"] == "POST" && pids.iter().any(|p| r["pid"] == *p))
            .count();
        if got >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn assert_nothing_lost(counters: &agent::Counters, log: &str) {
    for name in [
        "zmtp_desync",
        "vllm_ipc_truncated",
        "vllm_outputs_partial",
        "vllm_requests_partial",
        "vllm_ipc_bad_msgpack",
        "vllm_ipc_layout_mismatch",
        "vllm_ipc_layout_assumed",
        "capture_chunks_lost",
        "capture_chunks_orphaned",
        "zmtp_frames_dropped",
        "kernel_ringbuf_full_drops",
    ] {
        assert_eq!(counters.get(name), 0, "{name} in\n{log}");
    }
    assert!(counters.get("vllm_version_from_package") >= 1, "{log}");
    assert!(counters.get("vllm_engine_core_found") >= 1, "{log}");
}

/// One server under load: chat and completions (n = 2, batched prompts), ids of every kind,
/// aborts mid-stream and while queued, ~3,000-token prompts (9 KiB new-request messages), and
/// a KV pool small enough that vLLM preempts.
#[test]
fn vllm_real_scheduler_under_load() {
    // Real vLLM servers (each an API server and an EngineCore) with the agent: two such tests
    // on 2 cores starve each other's engines into timeouts, and one of them traces every engine.
    let _machine = inferscope_integration_tests::exclusive();
    let t0 = Instant::now();
    let dir = work_dir("vllm-real");
    let port = free_port();
    // 200 blocks of 16 tokens: one 3,000-token prompt takes 188 of them.
    let opts = VllmOptions {
        kv_blocks: 200,
        max_num_seqs: 8,
        max_model_len: 3100,
        ..Default::default()
    };
    let server = VllmServer::start(&dir.join("vllm"), port, &opts);
    let started = t0.elapsed();
    let mark = warm_up(&server);
    let steps_path = dir.join("steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    // The agent attaches after vLLM's start-up handshake: the version comes from the package.
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string(), "--steps", &steps_arg]);
    recorder.wait_attached(server.pid(), Duration::from_secs(60));

    let jobs = vllm_load::mix(64, "one");
    let cpu_before = recorder.cpu_seconds();
    let outcomes = vllm_load::run_all(port, &jobs, 16);
    wait_records(&recorder.out, &[server.pid()], jobs.len());
    // The agent's tail of work on the load counts in its CPU time.
    std::thread::sleep(Duration::from_millis(500));
    let cpu = recorder.cpu_seconds() - cpu_before;
    eprintln!(
        "agent CPU during the load: {cpu:.2} s for {} requests ({:.1} s per 1,000)",
        jobs.len(),
        cpu * 1000.0 / jobs.len() as f64
    );
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let steps = read_records(&steps_path);
    let truth = server.read_truth_since(mark);
    let pid = server.pid();
    let engine_core = server.engine_core_pid().expect("vLLM's EngineCore process");
    drop(server);

    let s = check(
        (pid, engine_core),
        &jobs,
        &outcomes,
        &records,
        &steps,
        &truth,
    );
    eprintln!(
        "vLLM real scheduler, one server: {s:#?} (engine start {started:?}, total {:?})",
        t0.elapsed()
    );
    assert_nothing_lost(&agent::Counters::beside(&log_path), &log);
    assert!(counters.get("capture_chunked_syscalls") > 0, "{log}");
    assert!(s.long_prompts >= 4, "{s:#?}");
    assert!(
        s.preempted_requests > 0,
        "the KV pool must make vLLM preempt: {s:#?}"
    );
    assert!(s.preemptions_unknown > 0, "{s:#?}");
    // Steps back to back: a step with no SCHEDULED stamp starts where the previous one of its
    // engine ended. That is an estimate (the engine's work between steps is not on the IPC):
    // 84-99.7 % within 1 ms over eleven server-runs on a 2-core machine shared with other
    // builds (fewer under load). Chaining steps across engines (the bug this guards) put 13 % within
    // 1 ms.
    assert!(
        s.step_start_within_1ms * 100 >= s.step_start_known * 75,
        "{s:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two vLLM servers under one agent (found by discovery): each server's steps chain on its own
/// engine, never on the other's.
#[test]
fn two_vllm_servers_under_one_agent() {
    // Real vLLM servers (each an API server and an EngineCore) with the agent: two such tests
    // on 2 cores starve each other's engines into timeouts, and one of them traces every engine.
    let _machine = inferscope_integration_tests::exclusive();
    let t0 = Instant::now();
    let dir = work_dir("vllm-two");
    let steps_path = dir.join("steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    let ports = [free_port(), free_port()];
    let opts = VllmOptions {
        kv_blocks: 256,
        max_num_seqs: 8,
        ..Default::default()
    };
    // Both start at once (their start-ups overlap: most of it is waiting on imports).
    let (dir_a, opts_a) = (dir.join("a"), opts.clone());
    let start_a = std::thread::spawn(move || VllmServer::start(&dir_a, ports[0], &opts_a));
    let b = VllmServer::start(&dir.join("b"), ports[1], &opts);
    let a = start_a.join().expect("starting server a");
    let (mark_a, mark_b) = (warm_up(&a), warm_up(&b));
    let mut recorder = Recorder::start(&dir, &["--auto", "--steps", &steps_arg]);
    recorder.wait_attached(a.pid(), Duration::from_secs(60));
    recorder.wait_attached(b.pid(), Duration::from_secs(60));
    let jobs_a = vllm_load::mix(24, "a");
    let jobs_b = vllm_load::mix(24, "b");
    let (ja, jb) = (jobs_a.clone(), jobs_b.clone());
    let (pa, pb) = (ports[0], ports[1]);
    let ta = std::thread::spawn(move || vllm_load::run_all(pa, &ja, 8));
    let tb = std::thread::spawn(move || vllm_load::run_all(pb, &jb, 8));
    let (oa, ob) = (ta.join().unwrap(), tb.join().unwrap());
    wait_records(
        &recorder.out,
        &[a.pid(), b.pid()],
        jobs_a.len() + jobs_b.len(),
    );
    // The steps of the last requests may follow their records: a short settle.
    std::thread::sleep(Duration::from_millis(500));
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let steps = read_records(&steps_path);
    let (truth_a, truth_b) = (a.read_truth_since(mark_a), b.read_truth_since(mark_b));
    let (pid_a, pid_b) = (a.pid(), b.pid());
    let core = |s: &VllmServer| s.engine_core_pid().expect("vLLM's EngineCore process");
    let (core_a, core_b) = (core(&a), core(&b));
    drop((a, b));
    for (name, pid, jobs, outcomes, truth) in [
        ("a", (pid_a, core_a), &jobs_a, &oa, &truth_a),
        ("b", (pid_b, core_b), &jobs_b, &ob, &truth_b),
    ] {
        let s = check(pid, jobs, outcomes, &records, &steps, truth);
        eprintln!("vLLM server {name} of two: {s:#?}");
        // Chained across the two servers, 13 % were within 1 ms (see the one-server test);
        // 84-100 % per server in eight runs.
        assert!(
            s.step_start_within_1ms * 100 >= s.step_start_known * 75,
            "server {name}: {s:#?}"
        );
    }
    assert_nothing_lost(&agent::Counters::beside(&log_path), &log);
    eprintln!("two servers: {:?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The number before `suffix` on the line of `text` that starts with `prefix`.
fn number_after(text: &str, prefix: &str) -> Option<u64> {
    let rest = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(prefix))?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Kernels per request on vLLM's real scheduler: the CUPTI shim is injected into the EngineCore
/// as on a GPU (its worker drives the mock CUDA driver, whose cuInit loads the real shim through
/// CUDA_INJECTION64_PATH, and launches two kernels per step), and `inferscope run` joins every
/// request's steps (seen on the API server's IPC, by engine id) and the kernels they launched:
/// `inspect` draws each request's steps, and its prefill / decode kernels are exactly the
/// worker's launches in vLLM's own per-request step list. The launch uprobes see the same
/// launches: each step's are merged with the shim's, counted once (`source both`).
#[test]
fn vllm_kernels_per_request_through_the_shim() {
    // Real vLLM servers (each an API server and an EngineCore) with the agent: two such tests
    // on 2 cores starve each other's engines into timeouts, and one of them traces every engine.
    let _machine = inferscope_integration_tests::exclusive();
    // tests/engine/vllm/inferscope_vllm/worker.py: two eager kernels and a graph of three.
    const KERNELS_PER_STEP: u64 = 5;
    let t0 = Instant::now();
    let dir = work_dir("vllm-kernels");
    let shim_socket = dir.join("shim.sock");
    let shim_arg = shim_socket.to_string_lossy().into_owned();
    let mut daemon = Daemon::start(
        &dir,
        // No target: the daemon discovers engines as they start (vLLM among them).
        &["--shim-socket", &shim_arg, "--nvml-interval", "off"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !shim_socket.exists() {
        assert!(
            Instant::now() < deadline,
            "no shim socket:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mock = mock_cuda::mock_dir();
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let opts = VllmOptions {
        kv_blocks: 256,
        max_num_seqs: 8,
        env: vec![
            (
                "INFERSCOPE_VLLM_MOCK_CUDA".into(),
                path(&mock.join("libcuda.so")),
            ),
            (
                "CUDA_INJECTION64_PATH".into(),
                path(&mock_cuda::shim_library()),
            ),
            ("INFERSCOPE_SHIM_SOCKET".into(), shim_arg.clone()),
            // The shim finds the mock libcupti as it would the real one.
            ("LD_LIBRARY_PATH".into(), path(mock)),
        ],
        ..Default::default()
    };
    let server = VllmServer::start(&dir.join("vllm"), free_port(), &opts);
    daemon.wait_attached(server.pid(), Duration::from_secs(60));
    // The EngineCore (not traced: it serves no requests) gets its launch probes at the
    // daemon's next scan of the engine's workers (every 2 s): only then are its launches seen.
    let core = server.engine_core_pid().expect("vLLM's EngineCore process");
    let probed = format!("GPU launch probes attached pid={core} ");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.log_text().contains(&probed) {
        assert!(
            Instant::now() < deadline,
            "the EngineCore {core} was never probed:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = warm_up(&server);
    let jobs: Vec<Job> = vllm_load::mix(32, "k")
        .into_iter()
        .filter(|j| !matches!(j.kind, Kind::AbortMidStream | Kind::AbortQueued))
        .collect();
    let outcomes = vllm_load::run_all(server.port, &jobs, 8);
    // Timelines close once the kernels of their steps can have arrived: the daemon's own 2 s
    // settle, which no output announces; twice that here.
    std::thread::sleep(Duration::from_secs(4));
    let truth = server.read_truth();
    let mut checked = 0;
    let mut chunked = 0;
    for (job, outcome) in jobs.iter().zip(&outcomes) {
        assert!(outcome.done, "{job:?}: {outcome:?}");
        let ext = external(job, outcome).expect("stream id");
        let ids: Vec<&String> = truth.members(&ext).iter().map(|(id, _)| *id).collect();
        let want = truth.steps_of(&ids);
        let want_prefill = want.iter().filter(|(_, p)| *p).count() as u64;
        let want_decode = want.len() as u64 - want_prefill;
        let id = outcome.response_id.clone().expect("stream id");
        let out = daemon.client(&["inspect", &id, "--steps", "1000"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "inspect {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            number_after(&text, "steps ("),
            Some(want.len() as u64),
            "{ext}: vLLM's steps {want:?}\n{text}"
        );
        let drawn = |phase: &str| {
            text.lines()
                .skip_while(|l| !l.starts_with("steps ("))
                .filter(|l| l.starts_with(&format!("{phase} ")))
                .count() as u64
        };
        assert_eq!(
            (drawn("prefill"), drawn("decode")),
            (want_prefill, want_decode),
            "{ext}\n{text}"
        );
        assert_eq!(
            number_after(&text, "GPU prefill: "),
            Some(KERNELS_PER_STEP * want_prefill),
            "{ext}\n{text}"
        );
        assert_eq!(
            number_after(&text, "GPU decode: "),
            Some(KERNELS_PER_STEP * want_decode),
            "{ext}\n{text}"
        );
        // The launch uprobes (on by default, attached to the EngineCore when it loaded the
        // driver) saw the same launches: merged launch by launch, each counted once, the
        // kernels they saw unnamed (handles looked up nowhere) named by the shim, the graph
        // (graph#1: the one graph the worker launches) listed with the kernels of its nodes.
        let merged: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("· source both:"))
            .collect();
        assert_eq!(merged.len() as u64, want.len() as u64, "{ext}\n{text}");
        for line in merged {
            assert!(
                line.contains("launches 2 kernels (2 named) + 1 graphs")
                    && line.contains("3 both, 0 uprobe only, 0 shim only, 2 named by the shim"),
                "{ext}: {line}\n{text}"
            );
        }
        assert!(
            text.contains("(host enqueue; launch uprobes and shim merged)"),
            "{ext}\n{text}"
        );
        let graphs = text
            .lines()
            .filter(|l| {
                l.trim_start() == "graph#1: 3 kernel nodes · gemm_bf16×2, rms_norm_kernel×1"
            })
            .count();
        assert_eq!(graphs as u64, want.len() as u64, "{ext}\n{text}");
        checked += 1;
        if want_prefill > 1 {
            chunked += 1;
        }
    }
    let engine_core = server.engine_core_pid();
    drop(server);
    let scrape = daemon.scrape();
    let log = daemon.stop();
    eprintln!(
        "vLLM kernels per request: {checked} requests checked ({chunked} with chunked prefill), \
         EngineCore {engine_core:?}, {:?}",
        t0.elapsed()
    );
    assert!(checked >= 20, "{checked}");
    let received = scrape.lines().find_map(|l| {
        l.strip_prefix("inferscope_agent_events_total{counter=\"shim_kernels_received\"} ")
    });
    assert!(
        received.is_some_and(|v| v.trim() != "0"),
        "no kernels received: {received:?}\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vllm serve --grpc` (smg-grpc-servicer's VllmEngine on vLLM's AsyncLLM): streaming
/// `Generate` calls multiplexed over HTTP/2 connections as a router sends them, some cancelled
/// mid-stream. Each call is one record that names the request id its message carried, joined
/// to the engine request vLLM's scheduler logged under that id (admission at its own stamp,
/// prompt tokens), with its response messages counted exactly and its times inside the
/// client's own: the wire arrival after the client handed the call to grpcio, the first
/// message before the client received it.
#[test]
fn vllm_grpc_calls_are_joined_to_the_scheduler() {
    let _machine = inferscope_integration_tests::exclusive();
    let dir = work_dir("vllm-grpc");
    let port = free_port();
    let opts = VllmOptions {
        grpc: true,
        ..Default::default()
    };
    let server = VllmServer::start(&dir.join("vllm"), port, &opts);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string()]);
    recorder.wait_attached(server.pid(), Duration::from_secs(60));

    let calls = inferscope_integration_tests::grpc_engine::run_calls(
        &inferscope_integration_tests::vllm::vllm_python(),
        port,
        &[
            "96",
            "16",
            "--channels",
            "3",
            "--tag",
            "grpc",
            "--cancel-every",
            "12",
            // With the prompt's text, as routers send it: calls up to ~12 KiB, so grpcio's
            // reads (up to 64 KiB) hold several calls and cross the capture limit, and are
            // captured whole (in chunks) only because the agent marks HTTP/2 servers for it.
            "--with-text",
            "--prompt-lens",
            "8,40,160,600,1200",
        ],
    );
    assert_eq!(calls.len(), 96);
    let generate = "/vllm.grpc.engine.VllmEngine/Generate";
    recorder.wait_records(Duration::from_secs(30), "every call's record", |r| {
        r.iter().filter(|r| r["path"] == generate).count() >= calls.len()
    });
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let truth = server.read_truth();
    drop(server);

    let mut cancelled = 0;
    let mut wire_minus_send = Vec::new();
    for call in &calls {
        let id = call["id"].as_str().unwrap();
        let r =
            inferscope_integration_tests::grpc_engine::record_of(&records, call, generate, "vllm");
        if call["cancelled"] == true {
            cancelled += 1;
        }
        // The engine request vLLM's scheduler logged for this call (`<id>-<8 chars>`).
        let engine: Vec<_> = truth
            .requests
            .iter()
            .filter(|(k, _)| k.rsplit_once('-').is_some_and(|(head, _)| head == id))
            .collect();
        assert_eq!(engine.len(), 1, "{id}: {engine:?}");
        let (_, t) = engine[0];
        assert_eq!(r["prompt_tokens"], t.prompt_tokens, "{r}");
        assert_eq!(r["prompt_tokens"], call["prompt_tokens"], "{r} {call}");
        assert_eq!(
            r["admitted_mono_ns"].as_u64(),
            t.scheduled.first().copied(),
            "admission at vLLM's own stamp: {r}"
        );
        let wire = r["arrival_wire_mono_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("no wire arrival: {r}"));
        let first = r["first_token_mono_ns"].as_u64().unwrap();
        let send = call["send_ns"].as_u64().unwrap();
        assert!(wire >= send, "wire before the client sent: {r} {call}");
        assert!(
            first > wire && first <= call["first_ns"].as_u64().unwrap(),
            "{r} {call}"
        );
        wire_minus_send.push(wire - send);
    }
    assert!(cancelled >= 4, "{cancelled} calls cancelled");
    wire_minus_send.sort_unstable();
    eprintln!(
        "vLLM gRPC: {} calls, {cancelled} cancelled; wire − client send: median {:.3} ms, max {:.3} ms; {} syscalls captured in chunks, {} cut",
        calls.len(),
        wire_minus_send[wire_minus_send.len() / 2] as f64 / 1e6,
        wire_minus_send[wire_minus_send.len() - 1] as f64 / 1e6,
        counters.get("capture_chunked_syscalls"),
        counters.get("kernel_payload_truncated"),
    );
    assert_eq!(counters.get("rpc_request_ids_read") as usize, calls.len());
    // Reads past the capture limit were captured whole, so no framing was lost.
    assert!(counters.get("capture_chunked_syscalls") > 0, "{log}");
    for zero in [
        "rpc_request_ids_unread",
        "vllm_requests_unjoined",
        "arrival_wire_unknown",
        "requests_lost",
        "h2_framing_lost",
        "h2_hpack_unknown_fields",
        "h2_header_blocks_lost",
        "capture_chunks_lost",
        "capture_chunks_orphaned",
        "kernel_chunks_unsent",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero} in\n{log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
