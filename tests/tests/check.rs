//! `inferscope check` as root on this machine against the real llama.cpp engine: what it says
//! is checked against what is true here (the engine's pid, port, package version, the scheduler
//! hooks the agent attaches, the shim injected through the engine's environment), its exit code
//! follows the verdict, and `inferscope run` logs the same report at start. The privileged,
//! minimal and no-SYS_ADMIN containers are in container_image.rs.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Command, time::Duration};

use inferscope_integration_tests::{
    agent::binary, daemon::Daemon, engine::Engine, free_port, test_dir, wait_until,
};

/// The xllamacpp pin in scripts/setup.sh: the version check must find for the engine.
fn pinned_xllamacpp() -> String {
    let setup = include_str!("../../scripts/setup.sh");
    let at = setup.find("xllamacpp==").expect("xllamacpp pin") + "xllamacpp==".len();
    setup[at..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .expect("version")
        .to_owned()
}

fn check(args: &[&str]) -> (String, i32) {
    let out = Command::new(binary())
        .arg("check")
        .args(args)
        .output()
        .expect("running inferscope check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (text, out.status.code().unwrap_or(-1))
}

fn line<'a>(report: &'a str, topic: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(topic)))
        .unwrap_or_else(|| panic!("no {topic} line in\n{report}"))
}

#[test]
fn check_tells_the_truth_as_root_against_the_real_engine() {
    let dir = test_dir("check");
    let shim = "/opt/inferscope/libinferscope_cupti.so";
    let engine = Engine::start_with_env(
        free_port(),
        &["--slots", "2"],
        &[("CUDA_INJECTION64_PATH", shim)],
    );
    let pid = engine.pid();
    let shim_socket = dir.join("shim.sock");
    let (report, code) = check(&[
        "--port",
        &engine.port.to_string(),
        "--shim-socket",
        shim_socket.to_str().unwrap(),
    ]);
    eprintln!("{report}");
    assert_eq!(code, 0, "{report}");
    // Root on this kernel: every capability, the capture, uprobes.
    assert!(!report.contains("FAIL"), "{report}");
    assert!(
        !report.contains("missing: without it"),
        "root lacks nothing: {report}"
    );
    assert!(line(&report, "ebpf").starts_with("  ok"), "{report}");
    assert!(line(&report, "uprobes").starts_with("  ok"), "{report}");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(line(&report, "kernel").contains(release.trim()), "{report}");
    // fexit: what the kernel does here, whichever it is, with the reason when refused.
    let fexit = line(&report, "fexit");
    assert!(
        fexit.starts_with("  ok") || (fexit.starts_with("warn") && fexit.contains("refused (")),
        "{fexit}"
    );

    // This kernel has BTF, bpf_task_pt_regs and bpf_rdonly_cast: no entry program for reads or
    // writes, and their registers and stamps loaded through typed pointers.
    let typed = "loaded through typed pointers (bpf_rdonly_cast)";
    let reads = line(&report, "reads");
    assert!(
        reads.starts_with("  ok") && reads.contains("at their exit") && reads.contains(typed),
        "{reads}"
    );
    let writes = line(&report, "writes");
    assert!(
        writes.starts_with("  ok") && writes.contains("transmit stamp") && writes.contains(typed),
        "{writes}"
    );

    let engine_line = line(&report, "engine");
    for needle in [
        format!("llamacpp pid {pid} port {}", engine.port),
        format!("version {}", pinned_xllamacpp()),
        format!("CUPTI shim injected ({shim})"),
        "resolve in xllamacpp.abi3.so".to_string(),
    ] {
        assert!(engine_line.contains(&needle), "{needle}: {engine_line}");
    }
    // Every hook that resolves attaches (as root), and the count matches what `run` attaches.
    let hooks = engine_line
        .split("scheduler hooks: ")
        .nth(1)
        .expect("hooks part");
    let numbers: Vec<usize> = hooks
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(2)
        .map(|s| s.parse().unwrap())
        .collect();
    let (resolved, total) = (numbers[0], numbers[1]);
    assert!(resolved >= 1 && resolved <= total, "{engine_line}");
    assert!(
        engine_line.contains(&format!(", {resolved} of {resolved} attach")),
        "{engine_line}"
    );
    // The engine wants the shim, and no agent listens yet.
    let shim_line = line(&report, "shim");
    assert!(
        shim_line.starts_with("warn")
            && shim_line.contains("1 engine(s) have CUDA_INJECTION64_PATH"),
        "{shim_line}"
    );
    assert!(
        line(&report, "verdict").contains("1 engine process(es) traceable"),
        "{report}"
    );

    // Nothing on that port: nothing can be traced, exit 1.
    let (empty, code) = check(&["--port", &free_port().to_string()]);
    assert_eq!(code, 1, "{empty}");
    let verdict = line(&empty, "verdict");
    assert!(
        verdict.starts_with("FAIL") && verdict.contains("no engine serves"),
        "{verdict}"
    );

    // `run` logs the same report once at start, then a progress line when it traces the engine.
    let mut daemon = Daemon::start(&dir, &["--port", &engine.port.to_string()]);
    daemon.wait_attached(pid, Duration::from_secs(60));
    wait_until(Duration::from_secs(10), "the progress line", || {
        daemon.log_text().contains("progress: engine llamacpp pid")
    });
    let log = daemon.stop();
    let check_lines: Vec<&str> = log.lines().filter(|l| l.contains("check: ")).collect();
    assert!(
        check_lines
            .iter()
            .any(|l| l.contains("verdict") && l.contains("1 engine process(es) traceable")),
        "{log}"
    );
    assert!(
        check_lines
            .iter()
            .any(|l| l.contains(&format!("llamacpp pid {pid}"))),
        "{log}"
    );
    assert_eq!(
        check_lines.iter().filter(|l| l.contains("verdict")).count(),
        1,
        "logged once: {log}"
    );
    let progress = log
        .lines()
        .find(|l| l.contains("progress: engine llamacpp"))
        .unwrap();
    assert!(
        progress.contains(&format!("{resolved} of {total} scheduler hooks attached")),
        "{progress}"
    );
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `check --programs` against what this kernel is known to do: every program of the build for
/// kernels with `bpf_loop` (this one has it) loaded with the instructions its verifier walked,
/// well under the budget; the entry programs unused (reads and writes take their arguments at
/// their exit here); fexit's program refused (this VM refuses BPF trampolines) and named so.
#[test]
fn check_programs_lists_every_program_with_its_verifier_count() {
    let (report, _) = check(&["--programs"]);
    eprintln!("{report}");
    let programs: Vec<(&str, &str, Option<u64>)> = report
        .lines()
        .filter_map(|l| l.strip_prefix("  program "))
        .map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next().unwrap();
            let state = words.next().unwrap();
            (name, state, words.next().and_then(|n| n.parse().ok()))
        })
        .collect();
    assert!(programs.len() >= 40, "{report}");
    let state = |name: &str| {
        programs
            .iter()
            .find(|p| p.0 == name)
            .unwrap_or_else(|| panic!("no program {name} in\n{report}"))
            .1
    };
    for name in [
        "exit_syscall",
        "exit_record",
        "exit_chunks",
        "tls_call",
        "tls_record",
    ] {
        assert_eq!(state(name), "loaded", "{report}");
    }
    for name in ["enter_read", "enter_write"] {
        assert_eq!(state(name), "unused", "{report}");
    }
    assert!(
        !programs.iter().any(|p| p.0.starts_with("tls_call_c")),
        "the per-function TLS programs belong to the build for kernels before 5.17: {report}"
    );
    let fexit_refused = line(&report, "fexit").contains("refused (");
    assert_eq!(
        state("accepted_sock") == "refused",
        fexit_refused,
        "{report}"
    );
    for (name, state, verified) in &programs {
        if *state == "loaded" {
            let verified = verified.unwrap_or_else(|| panic!("{name}: no count in\n{report}"));
            assert!(
                verified > 0 && verified < 750_000,
                "{name}: {verified} instructions verified (the matrix's bar is 75 %)"
            );
        }
    }
    let verifier = line(&report, "verifier");
    assert!(
        verifier.starts_with("  ok") && verifier.contains("largest program exit_"),
        "{verifier}"
    );
}
