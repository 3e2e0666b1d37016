//! Faults the agent must survive without losing anything silently, with real eBPF against real
//! processes on loopback: a stalled agent (ring buffer overflow), a full disk, a second agent on
//! the same sockets. Ground truth is the load client's own count of completed responses.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use inferscope_integration_tests::{
    agent::{self, Recorder},
    daemon::Daemon,
    engine::Engine,
    free_port,
};
use serde_json::Value;

const SSE_LOAD: &str = env!("CARGO_BIN_EXE_sse_load");

/// A helper process that must not outlive a failed test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sse_load serve` on `port` (helper #17's range), ready to accept.
fn sse_server(port: u16, tokens: u32) -> KillOnDrop {
    sse_server_with(port, tokens, &[])
}

/// The same with more of `serve`'s options (`--write-log`, `--hold-ms`).
fn sse_server_with(port: u16, tokens: u32, extra: &[&std::ffi::OsStr]) -> KillOnDrop {
    let child = Command::new(SSE_LOAD)
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--tokens",
            &tokens.to_string(),
        ])
        .args(extra)
        .spawn()
        .expect("starting sse_load serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sse_load serve did not listen");
        thread::sleep(Duration::from_millis(50));
    }
    KillOnDrop(child)
}

/// `sse_load load` in the background: `connections` keep-alive clients for `seconds`.
fn start_load(port: u16, connections: u32, seconds: u32) -> Child {
    start_load_n(port, connections, seconds, 100_000_000)
}

/// The same, stopping after `requests` per connection.
fn start_load_n(port: u16, connections: u32, seconds: u32, requests: u32) -> Child {
    Command::new(SSE_LOAD)
        .args([
            "load",
            "--port",
            &port.to_string(),
            "--connections",
            &connections.to_string(),
            "--requests",
            &requests.to_string(),
            "--seconds",
            &seconds.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting sse_load load")
}

/// `sse_load load` paced at `rate` requests/s in all over `connections` keep-alive clients.
fn start_paced_load(port: u16, connections: u32, seconds: u32, rate: u32) -> Child {
    start_paced_load_with(port, connections, seconds, rate, &[])
}

/// The same with more of `load`'s options (`--request-ids`).
fn start_paced_load_with(
    port: u16,
    connections: u32,
    seconds: u32,
    rate: u32,
    extra: &[&str],
) -> Child {
    Command::new(SSE_LOAD)
        .args([
            "load",
            "--port",
            &port.to_string(),
            "--connections",
            &connections.to_string(),
            "--requests",
            "100000000",
            "--seconds",
            &seconds.to_string(),
            "--rate",
            &rate.to_string(),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting sse_load load")
}

/// The responses the load client completed, by its own count.
fn completed(load: Child) -> u64 {
    let out = load.wait_with_output().expect("waiting for sse_load load");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("sse_load load printed no count: {text}"))
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("running kill")
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// The agent under test in the stall tests: `record`, or the long-running `run` daemon (which
/// exports as well as it records: the form a DaemonSet runs).
enum StalledAgent {
    Record(Recorder),
    Run(Daemon, std::path::PathBuf, std::path::PathBuf),
}

impl StalledAgent {
    fn start(daemon: bool, dir: &Path, port: u16) -> StalledAgent {
        let port = port.to_string();
        let args = ["--port", port.as_str(), "--ring-buffer-mb", "1"];
        if !daemon {
            return StalledAgent::Record(Recorder::start(dir, &args));
        }
        let records = dir.join("records.jsonl");
        let counters = dir.join("counters.json");
        let (r, c) = (records.to_string_lossy(), counters.to_string_lossy());
        let mut all = args.to_vec();
        all.extend(["--records", &r, "--counters", &c]);
        StalledAgent::Run(Daemon::start(dir, &all), records, counters)
    }

    fn wait_attached(&mut self, pid: u32) {
        match self {
            StalledAgent::Record(r) => r.wait_attached(pid, Duration::from_secs(30)),
            StalledAgent::Run(d, ..) => d.wait_attached(pid, Duration::from_secs(30)),
        }
    }

    fn pid(&self) -> u32 {
        match self {
            StalledAgent::Record(r) => r.pid(),
            StalledAgent::Run(d, ..) => d.pid(),
        }
    }

    fn records_now(&self) -> usize {
        match self {
            StalledAgent::Record(r) => agent::read_records(&r.out).len(),
            StalledAgent::Run(_, records, _) => agent::read_records(records).len(),
        }
    }

    /// Stops the agent: its records, counters and log.
    fn stop(self) -> (Vec<Value>, agent::Counters, String) {
        match self {
            StalledAgent::Record(r) => {
                let log = r.log.clone();
                let records = r.stop();
                let counters = agent::Counters::beside(&log);
                (
                    records,
                    counters,
                    std::fs::read_to_string(log).unwrap_or_default(),
                )
            }
            StalledAgent::Run(d, records, counters) => {
                let log = d.stop();
                (
                    agent::read_records(&records),
                    agent::Counters::read(&counters),
                    log,
                )
            }
        }
    }
}

/// The agent is descheduled for 2 s (SIGSTOP, as a CPU limit would do) while 8 keep-alive
/// connections stream at full rate into a small ring buffer. Every connection is decoded again
/// after the stall, nothing is marked aborted, and records plus counted lost requests equal the
/// responses the client completed.
#[test]
fn a_stalled_agent_leaves_no_connection_dark_and_counts_every_lost_request() {
    // Full-rate load on 2 cores: a second test's load beside it would decide what the stall loses.
    let _machine = inferscope_integration_tests::exclusive();
    stalled_agent_leaves_no_connection_dark(false);
}

/// The same stall for `inferscope run`, where the issue saw 5 of 8 connections stay dark.
#[test]
fn a_stalled_run_daemon_leaves_no_connection_dark_and_counts_every_lost_request() {
    // Full-rate load on 2 cores: a second test's load beside it would decide what the stall loses.
    let _machine = inferscope_integration_tests::exclusive();
    stalled_agent_leaves_no_connection_dark(true);
}

fn stalled_agent_leaves_no_connection_dark(daemon: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let server = sse_server(port, 16);
    let mut agent = StalledAgent::start(daemon, dir.path(), port);
    agent.wait_attached(server.0.id());
    let agent_pid = agent.pid();

    let load = start_load(port, 8, 6);
    // Load shaping: 1 s of load, then the agent stalls for 2 s under it.
    thread::sleep(Duration::from_secs(1));
    signal(agent_pid, "-STOP");
    thread::sleep(Duration::from_secs(2));
    let resumed_ns = inferscope_model::clock::monotonic_now_ns();
    signal(agent_pid, "-CONT");
    let done = completed(load);
    // Let the agent drain what queued up. Requests are lost here by design, so there is no
    // count to wait for: wait until the records stop growing.
    let mut seen = 0;
    inferscope_integration_tests::wait_until(Duration::from_secs(30), "the drain", || {
        thread::sleep(Duration::from_millis(500));
        let now = agent.records_now();
        std::mem::replace(&mut seen, now) == now && now > 0
    });
    let (records, counters, log) = agent.stop();

    let drops = counters.get("kernel_ringbuf_full_drops");
    assert!(drops > 0, "the stall must overflow the ring buffer:\n{log}");
    let lost = counters.get("requests_lost");
    let incomplete = records
        .iter()
        .filter(|r| r["incomplete"].is_string())
        .count();
    eprintln!(
        "{}: client completed {done}; {} records ({incomplete} incomplete), {lost} lost requests, {drops} kernel records dropped",
        if daemon { "run" } else { "record" },
        records.len()
    );
    assert!(
        records.iter().all(|r| r["aborted"] == Value::Bool(false)),
        "nobody aborted anything"
    );
    assert!(
        records
            .iter()
            .filter_map(|r| r["incomplete"].as_str())
            .all(|reason| reason == "events_lost"),
        "the only reason here is the overflow: {:?}",
        records
            .iter()
            .filter(|r| r["incomplete"].is_string() && r["incomplete"] != "events_lost")
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        records.len() as u64 + lost,
        done,
        "records + lost requests = responses the client completed"
    );
    let mut after: Vec<u64> = records
        .iter()
        .filter(|r| {
            r["arrival_mono_ns"]
                .as_u64()
                .is_some_and(|t| t > resumed_ns)
        })
        .filter(|r| r["incomplete"].is_null())
        .filter_map(|r| r["connection_id"].as_u64())
        .collect();
    after.sort_unstable();
    after.dedup();
    assert_eq!(
        after.len(),
        8,
        "every connection is decoded again after the stall"
    );
}

/// The issue's bar for graceful degradation: the agent descheduled for 2 s while 8 keep-alive
/// connections send 3,000 requests/s (16 token events each) into the default 16 MiB ring loses
/// no request. By default the kernel sends the token writes as 40-byte token events once it
/// knows the connections' templates (else the test proves nothing about them), and every
/// request still has its TTFT and all its chunks.
#[test]
fn a_2s_stall_at_3000_requests_per_s_on_the_default_ring_loses_no_request() {
    let run = StallRun::at(3000, &[]);
    run.assert_nothing_lost();
    run.assert_every_record_whole(true);
    assert!(
        run.counters.get("kernel_token_events") > 100_000,
        "the token writes went out as token events"
    );
}

/// The same stall with every write captured in full (streams the kernel has no template for):
/// the adaptive capture behind a filling ring cuts token writes to compact records, and still
/// no request is lost.
#[test]
fn a_2s_stall_without_token_events_is_carried_by_compact_records() {
    let run = StallRun::at(3000, &["--no-token-events"]);
    run.assert_nothing_lost();
    run.assert_every_record_whole(false);
    assert_eq!(run.counters.get("kernel_token_events"), 0);
    assert!(
        run.counters.get("kernel_compact_writes") > 10_000,
        "the stall filled the ring past its pressure mark"
    );
}

/// Twice the rate: behind the pressure mark the kernel batches each connection's token events
/// (8 bytes each instead of a 48-byte record), and the issue's bar is at most 1 % of the
/// requests lost, every one of them counted.
#[test]
fn a_2s_stall_at_6000_requests_per_s_loses_at_most_1_percent_all_counted() {
    let run = StallRun::at(6000, &[]);
    let lost = run.counters.get("requests_lost");
    assert_eq!(
        run.records.len() as u64 + lost,
        run.done,
        "records + counted lost requests = responses the client completed"
    );
    assert!(
        lost * 100 <= run.done,
        "at most 1 % lost: {lost} of {}",
        run.done
    );
    run.assert_every_record_whole(true);
    assert!(
        run.counters.get("kernel_token_batches") > 1_000,
        "the stall filled the ring past its pressure mark, and token events went out batched"
    );
}

/// One run of the stall tests: a paced load, the agent stopped for 2 s in its middle.
struct StallRun {
    done: u64,
    records: Vec<Value>,
    counters: agent::Counters,
    log: String,
}

impl StallRun {
    fn at(rate: u32, extra_args: &[&str]) -> StallRun {
        // Full-rate load on 2 cores: a second test's load beside it would decide what the stall
        // loses.
        let _machine = inferscope_integration_tests::exclusive();
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let server = sse_server(port, 16);
        let port_arg = port.to_string();
        let mut args = vec!["--port", port_arg.as_str()];
        args.extend_from_slice(extra_args);
        let mut recorder = Recorder::start(dir.path(), &args);
        recorder.wait_attached(server.0.id(), Duration::from_secs(30));
        let agent_pid = recorder.pid();
        let log = recorder.log.clone();

        let load = start_paced_load(port, 8, 6, rate);
        // Load shaping: 1.5 s of load, then the agent stalls for 2 s under it.
        thread::sleep(Duration::from_millis(1500));
        signal(agent_pid, "-STOP");
        thread::sleep(Duration::from_secs(2));
        signal(agent_pid, "-CONT");
        let done = completed(load);
        // A record per request, or (where requests were lost: counted only at exit) records
        // that stopped growing for 3 s.
        let mut last = (0usize, Instant::now());
        recorder.wait_records(
            Duration::from_secs(60),
            "a record per request, or the drain's end",
            |records| {
                if records.len() != last.0 {
                    last = (records.len(), Instant::now());
                }
                records.len() as u64 >= done
                    || (!records.is_empty() && last.1.elapsed() > Duration::from_secs(3))
            },
        );
        let records = recorder.stop();
        let counters = agent::Counters::beside(&log);
        let log = std::fs::read_to_string(log).unwrap_or_default();
        eprintln!(
            "{rate}/s: client completed {done}; {} records, {} lost, {} kernel records dropped, {} writes compacted, {} token events, {} token batches",
            records.len(),
            counters.get("requests_lost"),
            counters.get("kernel_ringbuf_full_drops"),
            counters.get("kernel_compact_writes"),
            counters.get("kernel_token_events"),
            counters.get("kernel_token_batches"),
        );
        // The client kept at least 80 % of its pace for 6 s: else the test measured a lighter
        // load than it names.
        assert!(
            done * 10 >= u64::from(rate) * 6 * 8,
            "the client kept its pace ({rate}/s for 6 s): {done}"
        );
        StallRun {
            done,
            records,
            counters,
            log,
        }
    }

    fn assert_nothing_lost(&self) {
        let drops = self.counters.get("kernel_ringbuf_full_drops");
        let lost = self.counters.get("requests_lost");
        assert_eq!((drops, lost), (0, 0), "nothing lost:\n{}", self.log);
        assert_eq!(
            self.records.len() as u64,
            self.done,
            "one record per completed request"
        );
    }

    /// Every record is a whole request: all 16 chunks, its TTFT, and (`ids`) the response id
    /// its first event carries (with token events that write is never cut).
    fn assert_every_record_whole(&self, ids: bool) {
        for r in &self.records {
            assert!(r["incomplete"].is_null() && r["aborted"] == Value::Bool(false));
            assert_eq!(r["output_chunks"], 16, "every token event counted: {r}");
            assert!(r["ttft_ms"].is_number(), "TTFT kept through the cut: {r}");
            if ids {
                assert!(
                    r["response_id"].is_string(),
                    "the id read from the first event: {r}"
                );
            }
        }
    }
}

/// Batched token events against the server's own clock: the server reads CLOCK_MONOTONIC just
/// before and after its first and its last token write of every response, and the agent's
/// first and last token times (the write's entry in the kernel) must fall inside those
/// brackets, with every chunk counted, for responses whose tokens went out in batches (a 4 MiB
/// ring, so a 2 s stall at 1,000 requests/s passes its 1 MiB pressure mark and nothing is lost).
#[test]
fn batched_token_events_keep_each_write_time_to_the_nanosecond() {
    let _machine = inferscope_integration_tests::exclusive();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let truth = dir.path().join("server-writes.txt");
    let server = sse_server_with(port, 16, &["--write-log".as_ref(), truth.as_os_str()]);
    let port_arg = port.to_string();
    let mut recorder = Recorder::start(dir.path(), &["--port", &port_arg, "--ring-buffer-mb", "4"]);
    recorder.wait_attached(server.0.id(), Duration::from_secs(30));
    let log = recorder.log.clone();
    let load = start_paced_load_with(port, 8, 5, 1000, &["--request-ids"]);
    thread::sleep(Duration::from_millis(1500));
    signal(recorder.pid(), "-STOP");
    thread::sleep(Duration::from_secs(2));
    signal(recorder.pid(), "-CONT");
    let done = completed(load);
    recorder.wait_records(
        Duration::from_secs(60),
        "one record per request",
        |records| records.len() as u64 >= done,
    );
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log);
    let writes: std::collections::HashMap<String, [u64; 5]> = std::fs::read_to_string(&truth)
        .expect("the server's write log")
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let id = fields.next()?.to_string();
            let numbers: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
            Some((id, numbers.try_into().ok()?))
        })
        .collect();
    let batches = counters.get("kernel_token_batches");
    eprintln!(
        "client completed {done}; {} records, {} server responses logged, {batches} token batches, {} token events",
        records.len(),
        writes.len(),
        counters.get("kernel_token_events")
    );
    assert_eq!(
        (
            counters.get("kernel_ringbuf_full_drops"),
            counters.get("requests_lost")
        ),
        (0, 0),
        "nothing lost at this rate"
    );
    assert_eq!(
        records.len() as u64,
        done,
        "one record per completed request"
    );
    assert!(
        batches > 500,
        "the stall passed the pressure mark and token events went out batched: {batches}"
    );
    for r in &records {
        let id = r["x_request_id"].as_str().expect("the client's request id");
        let [tokens, first_before, first_after, last_before, last_after] = *writes
            .get(id)
            .unwrap_or_else(|| panic!("{id} is in the server's log"));
        assert_eq!(r["output_chunks"], tokens, "every chunk: {r}");
        let first = r["first_token_mono_ns"].as_u64().expect("first token time");
        let last = r["last_token_mono_ns"].as_u64().expect("last token time");
        assert!(
            (first_before..=first_after).contains(&first),
            "first token write at {first}, the server wrote it in [{first_before}, {first_after}]: {r}"
        );
        assert!(
            (last_before..=last_after).contains(&last),
            "last token write at {last}, the server wrote it in [{last_before}, {last_after}]: {r}"
        );
    }
}

/// Mounts a tmpfs of `kib` KiB at `dir` for the test's lifetime.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, kib: u32) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount")
            .success();
        assert!(ok, "mounting a tmpfs (the tests run as root)");
        Tmpfs(dir.into())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The disk fills while records stream: the JSONL file keeps only whole lines, each failed
/// write is counted, and writing resumes once space returns.
#[test]
fn a_full_disk_drops_whole_lines_and_writing_resumes() {
    // Full-rate load on 2 cores: a second test's load beside it would decide what the stall loses.
    let _machine = inferscope_integration_tests::exclusive();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let server = sse_server(port, 4);
    let fs = Tmpfs::mount(&dir.path().join("small"), 128);
    let filler = fs.0.join("filler");
    std::fs::write(&filler, vec![0u8; 96 * 1024]).expect("filling the tmpfs");
    let out = fs.0.join("records.jsonl");
    let log = dir.path().join("agent.log");
    let mut agent = KillOnDrop(
        Command::new(agent::binary())
            .args(["record", "--port", &port.to_string(), "--out"])
            .arg(&out)
            .arg("--counters")
            .arg(dir.path().join("counters.json"))
            .env("INFERSCOPE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log"))
            .spawn()
            .expect("starting inferscope record"),
    );
    agent::wait_attached(&mut agent.0, &log, server.0.id(), Duration::from_secs(30));

    let first = completed(start_load(port, 1, 2));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("writing a record failed")
    {
        assert!(Instant::now() < deadline, "the disk never filled");
        thread::sleep(Duration::from_millis(100));
    }
    let lines_full = std::fs::read_to_string(&out)
        .unwrap_or_default()
        .lines()
        .count();
    std::fs::remove_file(&filler).expect("freeing space");
    let second = completed(start_load(port, 1, 1));
    assert!(second > 0);
    agent::wait_records(
        &out,
        Duration::from_secs(30),
        "writing resumed",
        |records| records.len() > lines_full,
    );
    signal(agent.0.id(), "-INT");
    let status = agent.0.wait().expect("waiting for the agent");
    let counters = agent::Counters::beside(&log);
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "failed writes make the exit status fail");

    let text = std::fs::read_to_string(&out).expect("reading the records");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "no cut line at the end"
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is a whole JSON object"))
        .collect();
    assert!(
        lines.len() > lines_full,
        "writing resumed after space returned ({lines_full} lines before, {} after)",
        lines.len()
    );
    let failed = counters.get("records_write_failed");
    assert!(failed > 0, "the full disk failed no write: {counters:?}");
    assert!(
        log.contains(&format!(
            "inferscope: {failed} records could not be written"
        )),
        "the exit error names the {failed} failed lines:\n{log}"
    );
    let lost = counters.get("requests_lost");
    assert_eq!(
        lines.len() as u64 + failed + lost,
        first + second,
        "every completed request is a line, a counted failed write or a counted loss"
    );
}

/// A second `run` on the same sockets (a surge roll's new agent) does not take them: it runs
/// beside the first without binding either socket, and stops at once on SIGINT while the first
/// still runs. A path that is not a socket is never removed. The first agent's `top` shows the
/// requests it already holds.
#[test]
fn a_second_agent_waits_beside_the_first_and_leaves_its_sockets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let server = sse_server(port, 4);
    let shim = dir.path().join("shim.sock");
    let shim_arg = shim.to_str().expect("utf-8 path");
    let mut first = Daemon::start(
        dir.path(),
        &["--port", &port.to_string(), "--shim-socket", shim_arg],
    );
    first.wait_attached(server.0.id(), Duration::from_secs(30));
    let done = completed(start_load_n(port, 2, 0, 50));
    assert!(done > 0);
    assert!(first.socket.exists() && shim.exists());
    let socket_inode =
        |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let (api_inode, shim_inode) = (socket_inode(&first.socket), socket_inode(&shim));

    // Beside the first, on its gRPC socket, with a shim socket of its own: it binds neither.
    let other_shim = dir.path().join("other-shim.sock");
    let mut second = Daemon::start_logging_to(
        dir.path(),
        "second.log",
        &[
            "--port",
            &port.to_string(),
            "--shim-socket",
            other_shim.to_str().expect("utf-8"),
        ],
        &[],
    );
    second.wait_attached(server.0.id(), Duration::from_secs(30));
    let log = second.log_text();
    assert!(log.contains("another agent runs on this node"), "{log}");
    assert!(!other_shim.exists(), "a waiting agent binds no shim socket");
    assert_eq!(socket_inode(&first.socket), api_inode);
    let log = second.stop();
    assert!(
        !log.contains("handing over"),
        "no successor: it stops at once\n{log}"
    );
    assert!(!other_shim.exists());

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"keep me").expect("writing a file");
    let out = Command::new(agent::binary())
        .args(["run", "--port", &port.to_string(), "--prometheus", "off"])
        .args(["--grpc", &format!("unix://{}", file.display())])
        .args([
            "--shim-socket",
            dir.path().join("s2.sock").to_str().expect("utf-8"),
        ])
        .env("INFERSCOPE_LOG", "info")
        .output()
        .expect("running a second agent");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(
        std::fs::read(&file).expect("the file is still there"),
        b"keep me"
    );

    assert_eq!(
        (socket_inode(&first.socket), socket_inode(&shim)),
        (api_inode, shim_inode),
        "the first agent's sockets stay"
    );
    let top = first.client(&["top", "--iterations", "1", "--interval", "300ms"]);
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&top.stderr)
    );
    let shown: u64 = text
        .split_once(" — ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert_eq!(
        shown, done,
        "top's first snapshot shows the requests the agent holds:\n{text}"
    );
    let log = first.stop();
    assert!(!log.contains("gRPC API stopped"), "{log}");
}

/// A DaemonSet's surge roll (`maxSurge: 1, maxUnavailable: 0`, deploy/base/daemonset.yaml) under
/// steady load, in the order Kubernetes runs it: the new agent starts beside the old one on the
/// same socket directory, then the old one gets SIGTERM. Every response the client completed is
/// one record of one agent or a counted loss, never two records; both agents recorded part of
/// the load (the cut fell inside it); the new agent takes the sockets over; once both have
/// stopped, nothing of either (program, link, map) is left in the kernel.
#[test]
fn a_surge_roll_under_load_records_every_request_once() {
    // Steady load and two agents on 2 cores: another test's load beside it would decide losses.
    let _machine = inferscope_integration_tests::exclusive();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let server = sse_server(port, 8);
    let pinned_before = pinned();
    let files = |name: &str| {
        (
            dir.path().join(format!("{name}-records.jsonl")),
            dir.path().join(format!("{name}-counters.json")),
        )
    };
    let start = |name: &str| {
        let (records, counters) = files(name);
        Daemon::start_logging_to(
            dir.path(),
            &format!("{name}.log"),
            &[
                "--port",
                &port.to_string(),
                "--records",
                records.to_str().expect("utf-8"),
                "--counters",
                counters.to_str().expect("utf-8"),
            ],
            &[],
        )
    };
    let mut old = start("old");
    old.wait_attached(server.0.id(), Duration::from_secs(30));
    let load = start_paced_load(port, 4, 10, 200);
    thread::sleep(Duration::from_secs(2));

    let mut new = start("new");
    new.wait_attached(server.0.id(), Duration::from_secs(30));
    assert!(
        new.log_text().contains("another agent runs on this node"),
        "{}",
        new.log_text()
    );
    // Kubernetes stops the old pod once the new one is ready: its first capture pass made.
    inferscope_integration_tests::wait_until(
        Duration::from_secs(10),
        "the new agent ready",
        || inferscope_integration_tests::http_get(new.prometheus_port, "/readyz").starts_with("ok"),
    );
    let held: Vec<_> = [old.pid(), new.pid()]
        .iter()
        .flat_map(|pid| bpf_objects_held_by(*pid))
        .collect();
    assert!(held.iter().any(|(k, _)| *k == "link_id"), "{held:?}");
    // Both run for a while: each sees every request.
    thread::sleep(Duration::from_secs(2));
    let old_log = old.stop();
    assert!(
        old_log.contains("handing over to the next agent"),
        "{old_log}"
    );
    assert!(
        old_log.contains("every request read before the cut has ended"),
        "{old_log}"
    );
    inferscope_integration_tests::wait_until(Duration::from_secs(10), "the takeover", || {
        new.log_text().contains("taking over")
    });
    let done = completed(load);
    let mut seen = 0;
    inferscope_integration_tests::wait_until(Duration::from_secs(30), "the last records", || {
        thread::sleep(Duration::from_millis(500));
        let now = agent::read_records(&files("new").0).len();
        std::mem::replace(&mut seen, now) == now && now > 0
    });
    // The new agent serves the API and listens for shims on the sockets the old one left.
    let top = new.client(&["top", "--iterations", "1", "--interval", "300ms"]);
    assert!(
        top.status.success(),
        "{}",
        String::from_utf8_lossy(&top.stderr)
    );
    assert!(std::os::unix::net::UnixStream::connect(dir.path().join("shim.sock")).is_ok());
    let new_log = new.stop();
    assert!(!new_log.contains("after the takeover"), "{new_log}");

    let (old_records, new_records) = (
        agent::read_records(&files("old").0),
        agent::read_records(&files("new").0),
    );
    let (old_counters, new_counters) = (
        agent::Counters::read(&files("old").1),
        agent::Counters::read(&files("new").1),
    );
    let lost = old_counters.get("requests_lost") + new_counters.get("requests_lost");
    let handed_over = old_counters.get("requests_handed_over");
    let left = new_counters.get("requests_left_to_previous_agent");
    eprintln!(
        "surge roll: client completed {done}; old agent {} records ({handed_over} handed over), new agent {} ({left} left to the old one); {lost} lost",
        old_records.len(),
        new_records.len()
    );
    // The overlap was real: the new agent saw requests that were the old one's. (The old
    // agent stops moments after its cut once the short requests before it have ended, so it
    // may hand over none.)
    assert!(left > 0, "the agents did not overlap");
    assert!(!old_records.is_empty() && !new_records.is_empty());
    // The same request seen by both agents has the same read: one kernel clock, one reading
    // thread. The time alone is not a key: two server threads on two CPUs once read two
    // requests of two connections at the same nanosecond (records 3-44 and 4-44 of one run).
    let read_of = |r: &Value| {
        Some((
            r["arrival_read_mono_ns"].as_u64()?,
            r["reader_tid"].as_u64()?,
        ))
    };
    let mut reads: Vec<(u64, u64)> = old_records
        .iter()
        .chain(&new_records)
        .filter_map(read_of)
        .collect();
    let all = reads.len();
    reads.sort_unstable();
    let twice: Vec<(u64, u64)> = reads
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    let described = |read: (u64, u64)| -> Vec<String> {
        let tagged = old_records.iter().map(|r| ("old", r));
        tagged
            .chain(new_records.iter().map(|r| ("new", r)))
            .filter(|(_, r)| read_of(r) == Some(read))
            .map(|(agent, r)| format!("{agent}: {r}"))
            .collect()
    };
    reads.dedup();
    assert_eq!(
        reads.len(),
        all,
        "a request recorded twice: {:#?}",
        twice.iter().map(|&t| described(t)).collect::<Vec<_>>()
    );
    assert_eq!(
        (old_records.len() + new_records.len()) as u64 + lost,
        done,
        "records of both agents + counted losses = responses the client completed\nold:\n{old_log}\nnew:\n{new_log}"
    );

    // Deleted: nothing of either agent stays in the kernel, nothing is pinned.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (progs, links, maps) = (
            bpf_objects_loaded("prog"),
            bpf_objects_loaded("link"),
            bpf_objects_loaded("map"),
        );
        let left: Vec<_> = held
            .iter()
            .filter(|(kind, id)| match *kind {
                "prog_id" => progs.contains_key(id),
                "link_id" => links.contains_key(id),
                _ => maps.contains_key(id),
            })
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left in the kernel: {left:?}");
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(pinned(), pinned_before, "pinned under /sys/fs/bpf");
    assert!(
        !dir.path().join("handover.cut").exists() && !dir.path().join("successor.pid").exists()
    );
}

/// Everything pinned under /sys/fs/bpf.
fn pinned() -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, out);
            }
            out.push(path);
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/sys/fs/bpf"), &mut out);
    out.sort();
    out
}

/// The eBPF objects a process holds open, from its fdinfo: (kind, id) with kind `prog_id`,
/// `link_id` or `map_id`. A bpf link's fdinfo also names its program: only its own id is taken.
fn bpf_objects_held_by(pid: u32) -> std::collections::BTreeSet<(&'static str, u64)> {
    let mut held = std::collections::BTreeSet::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return held;
    };
    for fd in fds.flatten() {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        if let Some(id) = field("link_id:") {
            held.insert(("link_id", id));
        } else if let Some(id) = field("prog_id:") {
            held.insert(("prog_id", id));
        } else if let Some(id) = field("map_id:") {
            held.insert(("map_id", id));
        }
    }
    held
}

/// Ids bpftool lists now for `prog`, `link` or `map`, with the type of each.
fn bpf_objects_loaded(kind: &str) -> std::collections::BTreeMap<u64, String> {
    let out = Command::new("bpftool")
        .args(["-j", kind, "show"])
        .output()
        .expect("running bpftool (scripts/setup.sh installs it)");
    let objects: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    objects
        .iter()
        .filter_map(|o| Some((o["id"].as_u64()?, o["type"].as_str()?.to_owned())))
        .collect()
}

/// kill -9 under load, on the real engine with its scheduler uprobes attached, leaves no
/// program, link (uprobe, tracepoint) or map of the agent's in the kernel; the engine serves on,
/// and a new agent attaches and records again.
#[test]
fn kill_9_leaves_nothing_attached() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let engine = Engine::start(port, 2);
    let mut recorder = Recorder::start(dir.path(), &["--port", &port.to_string()]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(60));
    let held = bpf_objects_held_by(recorder.pid());
    let progs = bpf_objects_loaded("prog");
    let held_progs: Vec<&String> = held
        .iter()
        .filter(|(kind, _)| *kind == "prog_id")
        .filter_map(|(_, id)| progs.get(id))
        .collect();
    // Uprobes are BPF_PROG_TYPE_KPROBE programs (this kernel has no kprobes: they can only be
    // the engine's scheduler hooks); the socket programs are tracepoints.
    assert!(
        held_progs.iter().any(|t| *t == "kprobe") && held_progs.iter().any(|t| *t == "tracepoint"),
        "the agent holds its uprobes and tracepoints: {held_progs:?}"
    );
    assert!(
        held.iter().any(|(kind, _)| *kind == "link_id") && held.iter().any(|(k, _)| *k == "map_id"),
        "the agent holds links and maps: {held:?}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let mut c = inferscope_integration_tests::client::Client::connect(port);
                let _ = c.chat(&format!("Count to {n} in words."), 8, None);
                n += 1;
            }
        })
    };
    // Killed under load, once records flow.
    recorder.wait_records(Duration::from_secs(60), "records under load", |r| {
        !r.is_empty()
    });
    signal(recorder.pid(), "-KILL");
    // The kernel frees a dead process's programs and maps in deferred work after RCU grace
    // periods (~1.2 s here when idle, longer under this load: it once took past 10 s in the
    // suite); a leak never goes, so the wait's length only bounds the test.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Each object still listed, with its name (which one lingers says why).
        let left: Vec<_> = held
            .iter()
            .filter_map(|(kind, id)| {
                let listed = match *kind {
                    "prog_id" => bpf_objects_loaded("prog"),
                    "link_id" => bpf_objects_loaded("link"),
                    _ => bpf_objects_loaded("map"),
                };
                listed.get(id).map(|name| (*kind, *id, name.clone()))
            })
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left in the kernel: {left:?}");
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::SeqCst);
    client.join().expect("client thread");
    drop(recorder);

    let dir2 = tempfile::tempdir().expect("temp dir");
    let mut again = Recorder::start(dir2.path(), &["--port", &port.to_string()]);
    again.wait_attached(engine.pid(), Duration::from_secs(60));
    for n in 0..5 {
        let mut c = inferscope_integration_tests::client::Client::connect(port);
        let s = c.chat(&format!("Name {n} rivers."), 8, None);
        assert!(s.completed, "the engine serves on after the agent's kill");
    }
    let records = again.wait_records(Duration::from_secs(30), "a record per request", |r| {
        r.iter()
            .filter(|r| r["path"] == "/v1/chat/completions")
            .count()
            >= 5
    });
    assert!(
        records
            .iter()
            .filter(|r| r["path"] == "/v1/chat/completions")
            .all(|r| r["queue_wait_ms"].is_number() && r["ttft_ms"].is_number()),
        "a new agent records again, its scheduler hooks included: {records:?}"
    );
    again.stop();
}

/// What the restart test's clients completed, by engine generation (0: before the restart).
#[derive(Default)]
struct RestartLoad {
    stop: AtomicBool,
    paused: AtomicBool,
    epoch: AtomicU32,
    done: [AtomicU64; 2],
    /// Set just before the engine is killed.
    killed: AtomicBool,
    /// Requests the clients did not complete: engine generation, whether the kill had come,
    /// and why (the read's outcome).
    failed: std::sync::Mutex<Vec<(usize, bool, String)>>,
}

/// One client of the restart test: streamed chats of 8 tokens, one after another, each on its
/// own connection (llama.cpp's server closes a connection after a streamed response); a request
/// that fails (the engine died under it) is not counted. Completions count toward the engine
/// generation of their connection.
fn restart_client(port: u16, id: usize, load: &RestartLoad) {
    let mut n = 0u64;
    while !load.stop.load(Ordering::SeqCst) {
        if load.paused.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(20));
            continue;
        }
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        // Connections are made only while not paused, which the test holds from the kill
        // until the new engine is ready (not until it is traced): a connection belongs to one
        // engine generation.
        let epoch = load.epoch.load(Ordering::SeqCst) as usize;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
        n += 1;
        let body = format!(
            r#"{{"model":"smollm2","messages":[{{"role":"user","content":"client {id} question {n}: name a colour"}}],"stream":true,"max_tokens":8}}"#
        );
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(request.as_bytes()).is_err() {
            continue;
        }
        let mut raw = Vec::new();
        let mut buf = [0u8; 16384];
        let outcome = loop {
            match stream.read(&mut buf) {
                Ok(0) => break Err(format!("EOF after {} bytes", raw.len())),
                // A signal to this thread is not the engine's answer.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(format!("{:?} after {} bytes", e.kind(), raw.len())),
                Ok(k) => raw.extend_from_slice(&buf[..k]),
            }
            if raw.ends_with(b"\r\n0\r\n\r\n") {
                break Ok(());
            }
        };
        match outcome {
            Ok(()) => {
                load.done[epoch].fetch_add(1, Ordering::SeqCst);
            }
            Err(why) => {
                let killed = load.killed.load(Ordering::SeqCst);
                if let Ok(mut failed) = load.failed.lock() {
                    failed.push((epoch, killed, why));
                }
            }
        }
    }
}

/// The engine (llama.cpp) is killed under load and started again on the same port while the
/// agent runs: the agent attaches to the new process, and for each engine generation the
/// records of completed requests plus the requests counted lost equal what the clients
/// completed: nothing is lost silently before, across or after the restart. The clients go on
/// as soon as the new engine answers, without waiting for the agent: the requests it serves
/// before the /proc rescan would have found it are followed from their accept (the kernel
/// traces a process accepting on a watched port, capture::process::adopt).
#[test]
fn an_engine_restarted_under_load_is_reattached_and_nothing_is_lost_silently() {
    // Full-rate load on 2 cores: a second test's load beside it would decide what the stall loses.
    let _machine = inferscope_integration_tests::exclusive();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let mut first = Engine::start(port, 2);
    let first_pid = first.pid();
    let mut recorder = Recorder::start(dir.path(), &["--port", &port.to_string()]);
    recorder.wait_attached(first_pid, Duration::from_secs(60));
    let log = recorder.log.clone();

    let load = Arc::new(RestartLoad::default());
    let clients: Vec<_> = (0..3)
        .map(|id| {
            let load = Arc::clone(&load);
            thread::spawn(move || restart_client(port, id, &load))
        })
        .collect();
    // Load shaping: 5 s of load before the crash.
    thread::sleep(Duration::from_secs(5));
    // A crash under load: requests in flight die with the engine.
    load.killed.store(true, Ordering::SeqCst);
    first.child.kill().expect("killing the engine");
    first.child.wait().expect("reaping the engine");
    load.paused.store(true, Ordering::SeqCst);
    load.epoch.store(1, Ordering::SeqCst);
    let before = load.done[0].load(Ordering::SeqCst);

    let second = Engine::start(port, 2);
    let second_pid = second.pid();
    let ready = Instant::now();
    load.paused.store(false, Ordering::SeqCst);
    recorder.wait_attached(second_pid, Duration::from_secs(30));
    let reattach = ready.elapsed();
    // Served before the agent logged its attach: the requests a rescan-only attach loses.
    let before_attach = load.done[1].load(Ordering::SeqCst);
    // Load shaping: 5 s of load on the restarted engine.
    thread::sleep(Duration::from_secs(5));
    load.stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().expect("client thread");
    }
    let after = load.done[1].load(Ordering::SeqCst);
    let clients_done = before + after;
    recorder.wait_records(
        Duration::from_secs(30),
        "a record per completion",
        |records| {
            records
                .iter()
                .filter(|r| r["ended_by"] == "complete" && r["path"] == "/v1/chat/completions")
                .count() as u64
                >= clients_done
        },
    );
    let records = recorder.stop();
    drop(second);
    let counters = agent::Counters::beside(&log);
    let log = std::fs::read_to_string(log).unwrap_or_default();

    let complete = |pid: u32| {
        records
            .iter()
            .filter(|r| r["pid"] == pid && r["ended_by"] == "complete")
            // Not the launcher's own /health probes.
            .filter(|r| r["path"] == "/v1/chat/completions")
            .count() as u64
    };
    let (first_records, second_records) = (complete(first_pid), complete(second_pid));
    let lost = counters.get("requests_lost");
    let adopted = counters.get("kernel_processes_adopted");
    let failed = load.failed.lock().map(|f| f.clone()).unwrap_or_default();
    let cut: Vec<_> = records
        .iter()
        .filter(|r| r["ended_by"] != "complete" && r["path"] == "/v1/chat/completions")
        .map(|r| {
            (
                r["pid"].clone(),
                r["ended_by"].clone(),
                r["incomplete"].clone(),
            )
        })
        .collect();
    eprintln!(
        "re-attached {reattach:?} after the new engine was ready ({before_attach} requests completed by then); {adopted} processes adopted by the kernel; clients completed {before} + {after}; complete records {first_records} + {second_records}; {lost} lost; cut: {cut:?}; not completed at the clients (generation, after the kill, why): {failed:?}"
    );
    assert!(
        before > 0 && after > 0,
        "both engines served: {before}, {after}"
    );
    assert_eq!(lost, 0, "no loss to count here:\n{log}");
    // The new engine binds the port the agent keeps watched after the first one's exit: the
    // kernel traces it from there, before the rescan could see it listening.
    assert!(
        adopted >= 1,
        "the restarted engine adopted at its bind:\n{log}"
    );
    assert_eq!(first_records, before, "the first engine's requests");
    assert_eq!(second_records, after, "the restarted engine's requests");
    assert!(
        records
            .iter()
            .filter(|r| r["ended_by"] == "complete" && r["path"] == "/v1/chat/completions")
            .all(|r| r["incomplete"].is_null() && r["ttft_ms"].is_number()),
        "completed requests are whole"
    );
    // Every request the agent saw cut short is one a client did not complete (the clients'
    // own count is the truth: a run on a loaded machine once had clients fail requests before
    // the kill), and none is the restarted engine's.
    let failed_first = failed.iter().filter(|(epoch, _, _)| *epoch == 0).count();
    let failed_at_kill = failed
        .iter()
        .filter(|(epoch, killed, _)| *epoch == 0 && *killed)
        .count();
    assert!(
        cut.iter().all(|(pid, _, _)| *pid == first_pid),
        "only the killed engine's requests were cut: {cut:?}"
    );
    assert!(
        cut.len() <= failed_first,
        "a cut record for each request the clients did not complete, no more: {} cut, {failed_first} not completed",
        cut.len()
    );
    // Requests in flight at the kill: at most one per client, recorded as cut short by the
    // engine's exit (not as aborted by a client that was still waiting).
    let server_exited = cut
        .iter()
        .filter(|(_, _, why)| why == "server_exited")
        .count();
    assert!(
        server_exited <= failed_at_kill.min(3)
            && cut
                .iter()
                .filter(|(_, _, why)| why != "server_exited")
                .count()
                <= failed_first - failed_at_kill,
        "only requests in flight died with the engine ({failed_at_kill} failed at the kill): {cut:?}"
    );
}

/// The verifier walks every path of a program with all that came before it on that path, and
/// one program holding the whole record path (`exit_syscall` before it was split in two with
/// `exit_record`) reached 98 % of its budget of one million instructions on 6.18 with no change
/// of ours: a change that grows a program past the budget fails to load everywhere, and one
/// that takes most of the remaining room loads here and fails on a kernel whose verifier
/// prunes less. The agent logs the largest program's share at load; this keeps room on the CI
/// kernel, and checks that the tail-called programs (the record's second half, and the chunks
/// of a large capture) loaded.
#[test]
fn the_kernel_programs_load_with_room_under_the_verifier_budget() {
    // A second agent's programs would load the machine under another test's timing.
    let _machine = inferscope_integration_tests::exclusive();
    let dir = inferscope_integration_tests::test_dir("verifier-budget");
    let recorder = Recorder::start(&dir, &["--port", &free_port().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let log = std::fs::read_to_string(&recorder.log).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("eBPF program")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no verifier figure in\n{log}");
        thread::sleep(Duration::from_millis(200));
    };
    let log = std::fs::read_to_string(&recorder.log).unwrap_or_default();
    let _ = recorder.stop();
    assert!(
        !log.contains("the chunk program did not load"),
        "exit_chunks did not load:\n{log}"
    );
    assert!(
        !log.contains("the record program"),
        "exit_record did not load:\n{log}"
    );
    // "largest eBPF program NAME: N instructions verified (P% of the verifier's budget)".
    let verified: u64 = line
        .split_once("eBPF program ")
        .and_then(|(_, rest)| rest.split_once(": "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no instruction count in {line:?}"));
    eprintln!("{line}");
    assert!(
        verified <= 920_000,
        "the largest program took {verified} of the verifier's 1,000,000 instructions: move work out of it (a tail call, as exit_record and exit_chunks) before it grows further ({line})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream paused when the agent stops: its last token events are still in the kernel's batch
/// (less than the batch span old), and the agent's last drain takes them, so the record of the
/// unfinished response counts every token the server wrote before the pause.
#[test]
fn token_events_still_batched_in_the_kernel_are_counted_when_the_agent_stops() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let port_arg = port.to_string();
    // Every response pauses 2 s after its 8th token.
    let hold = ["--hold-ms", "2000", "--hold-after", "8"].map(std::ffi::OsStr::new);
    let server = sse_server_with(port, 16, &hold);
    let mut recorder = Recorder::start(dir.path(), &["--port", &port_arg]);
    recorder.wait_attached(server.0.id(), Duration::from_secs(30));
    let log = recorder.log.clone();
    // Two whole responses per connection teach the process's token template.
    assert_eq!(completed(start_load_n(port, 2, 30, 2)), 4);
    let streaming = start_load_n(port, 1, 30, 1);
    // Its first 8 tokens are out, the server is in its pause.
    thread::sleep(Duration::from_millis(800));
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log);
    let _ = completed(streaming);
    let unfinished: Vec<&Value> = records
        .iter()
        .filter(|r| r["ended_by"] != "complete")
        .collect();
    assert_eq!(
        unfinished.len(),
        1,
        "the paused stream is recorded unfinished: {records:#?}"
    );
    assert_eq!(
        unfinished[0]["output_chunks"], 8,
        "every token written before the pause: {:#}",
        unfinished[0]
    );
    assert_eq!(
        counters.get("token_events_taken_at_exit"),
        7,
        "the first token went out whole, the next 7 waited in the kernel's batch"
    );
}
