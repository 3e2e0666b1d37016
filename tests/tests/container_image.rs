//! The image scripts/build-image.sh builds, run the way a DaemonSet runs it (host PID
//! namespace, read-only root, the host's tracefs, a shared host directory for the sockets),
//! under podman: the privileged form and the minimal capability form each record the real
//! llama.cpp engine running on the host with queue wait and prefill; `inferscope top` on the
//! host reads the containerised agent over the shared gRPC socket; the CUPTI shim the image
//! installs on a host path reaches the agent over the shared shim socket; without
//! CAP_SYS_ADMIN the agent says at start that the scheduler hooks will be missing.
//!
//! INFERSCOPE_IMAGE names the image (scripts/test.sh builds `inferscope:test`).

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use inferscope_integration_tests::{
    agent, client::Client, daemon::Daemon, engine::Engine, free_port, http_get, mock_cuda,
    otlp::Rotel, split::assert_llamacpp_split,
};
use serde_json::Value;

fn image() -> String {
    std::env::var("INFERSCOPE_IMAGE").unwrap_or_else(|_| {
        panic!(
            "INFERSCOPE_IMAGE is not set: build the image with scripts/build-image.sh inferscope:test \
             and export INFERSCOPE_IMAGE=inferscope:test"
        )
    })
}

/// podman as this host needs it: runc (hybrid cgroups refuse crun) and cgroupfs.
fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
        .args(args)
        .output()
        .expect("running podman (scripts/setup.sh installs it)")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The privileged form (deploy/overlays/privileged).
const PRIVILEGED: &[&str] = &["--privileged"];
/// The minimal form (deploy/base/daemonset.yaml's capabilities on this kernel; SYS_RESOURCE is
/// only for kernels before 5.11).
const MINIMAL: &[&str] = &[
    "--cap-drop",
    "ALL",
    "--cap-add",
    "BPF,PERFMON,SYS_ADMIN,SYS_PTRACE,DAC_READ_SEARCH",
    "--security-opt",
    "seccomp=unconfined",
];
/// What the issue found missing: the minimal set less SYS_ADMIN.
const NO_SYS_ADMIN: &[&str] = &[
    "--cap-drop",
    "ALL",
    "--cap-add",
    "BPF,PERFMON,SYS_PTRACE,DAC_READ_SEARCH,SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
];

struct Container {
    name: String,
}

impl Container {
    fn start(name: &str, form: &[&str], run_dir: &Path, agent_args: &[&str]) -> Container {
        let _ = podman(&["rm", "-f", name]);
        let run_mount = format!("{}:/run/inferscope", run_dir.display());
        let mut args = vec![
            "run",
            "-d",
            "--name",
            name,
            "--pid=host",
            // The Prometheus endpoint and the engine's /metrics on the host's loopback.
            "--network=host",
            "--read-only",
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=4096:4096",
            "-v",
            "/sys/kernel/tracing:/sys/kernel/tracing",
            "-v",
            &run_mount,
        ];
        args.extend_from_slice(form);
        let image = image();
        args.push(&image);
        args.extend_from_slice(agent_args);
        ok(&podman(&args), "podman run");
        Container {
            name: name.to_string(),
        }
    }

    fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn wait_log(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let logs = self.logs();
            if logs.contains(needle) {
                return logs;
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the agent's log after {timeout:?}:\n{logs}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM as the kubelet sends it; the agent flushes and exits 0.
    fn stop(&self) -> String {
        ok(&podman(&["stop", "-t", "20", &self.name]), "podman stop");
        let code = ok(
            &podman(&["inspect", "--format", "{{.State.ExitCode}}", &self.name]),
            "podman inspect",
        );
        let logs = self.logs();
        assert_eq!(code, "0", "the agent's exit status:\n{logs}");
        logs
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", &self.name]);
    }
}

fn run_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("inferscope-it-image-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("creating the shared run directory");
    dir
}

/// The agent in the image records the host's engine: 4 streams on 2 slots, each split into
/// queue wait + prefill; `inferscope top` on the host reads it through the shared socket.
fn records_the_host_engine(form_name: &str, form: &[&str]) -> (Container, PathBuf, u16) {
    let dir = run_dir(form_name);
    let port = free_port();
    let prometheus = free_port();
    let engine = Engine::start(port, 2);
    let container = Container::start(
        &format!("inferscope-it-{form_name}-{}", std::process::id()),
        form,
        &dir,
        &[
            "run",
            "--port",
            &port.to_string(),
            "--records",
            "/run/inferscope/records.jsonl",
            "--prometheus",
            &format!("127.0.0.1:{prometheus}"),
            "--shim-socket",
            "/run/inferscope/shim.sock",
        ],
    );
    let logs = container.wait_log(
        &format!(": attached pid={} ", engine.pid()),
        Duration::from_secs(60),
    );
    assert!(
        logs.contains("privileges: every feature available"),
        "{logs}"
    );
    assert!(logs.contains("scheduler hook attached"), "{logs}");

    // The host's client, the containerised agent, one socket on a shared host path. `top`
    // shows live requests: it subscribes before they are sent.
    let mut top = Command::new(agent::binary())
        .args([
            "top",
            "--interval",
            "500ms",
            "--iterations",
            "120",
            "--connect",
        ])
        .arg(format!("unix://{}/agent.sock", dir.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("running inferscope top");
    let (frames_tx, frames) = std::sync::mpsc::channel::<String>();
    let top_out = top.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(top_out)).map_while(Result::ok)
        {
            if frames_tx.send(line).is_err() {
                break;
            }
        }
    });
    // Its first frame says it is connected.
    let first = frames
        .recv_timeout(Duration::from_secs(10))
        .expect("inferscope top printed nothing");
    assert!(first.contains("inferscope top"), "{first}");

    let topics = ["lighthouses", "beetles", "volcanoes", "violins"];
    let clients: Vec<_> = topics
        .iter()
        .enumerate()
        .map(|(i, topic)| {
            let prompt = format!("({form_name} {i}) Two sentences about {topic}.");
            std::thread::spawn(move || Client::connect(port).chat(&prompt, 12, None))
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let line = frames
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| {
                panic!(
                    "inferscope top never showed 4 requests:\n{}",
                    seen.join("\n")
                )
            });
        if line.contains("4 requests in the last") {
            break;
        }
        seen.push(line);
    }
    let _ = top.kill();
    let _ = top.wait();
    drop(engine);
    (container, dir, prometheus)
}

fn chat_records(dir: &Path) -> Vec<Value> {
    agent::read_records(&dir.join("records.jsonl"))
        .into_iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect()
}

fn assert_split(records: &[Value]) {
    assert_eq!(records.len(), 4, "{records:#?}");
    for r in records {
        assert_llamacpp_split(r, false);
    }
    // Two slots, four streams at once: someone waited.
    assert!(
        records
            .iter()
            .any(|r| r["queue_wait_ms"].as_f64().is_some_and(|q| q > 5.0)),
        "{records:#?}"
    );
}

#[test]
fn privileged_form_records_queue_wait_and_prefill() {
    let (container, dir, _) = records_the_host_engine("privileged", PRIVILEGED);
    container.stop();
    assert_split(&chat_records(&dir));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn minimal_form_records_queue_wait_and_prefill_and_takes_the_shim_from_a_host_path() {
    let (container, dir, prometheus) = records_the_host_engine("minimal", MINIMAL);

    // The GPU overlay's init container: the image copies its shim onto a host path.
    let shim_dir = dir.join("shim");
    fs::create_dir_all(&shim_dir).unwrap();
    let mount = format!("{}:/opt/inferscope", shim_dir.display());
    ok(
        &podman(&[
            "run",
            "--rm",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--network=none",
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=4096:4096",
            "-v",
            &mount,
            &image(),
            "install-shim",
            "/opt/inferscope",
        ]),
        "install-shim",
    );
    let shim = shim_dir.join("libinferscope_cupti.so");
    assert!(shim.exists());
    // A (mock) CUDA engine on the host loads that shim and sends its kernels to the agent in
    // the container through the shared socket.
    let out =
        mock_cuda::run_engine_with_shim(&shim, &["run", "20", "5"], &dir.join("shim.sock"), &[]);
    assert!(out.status.success(), "{out:?}");
    let needle = "inferscope_agent_events_total{counter=\"shim_kernels_received\"} 95";
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let metrics = http_get(prometheus, "/metrics");
        if metrics.contains(needle) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the containerised agent did not count 95 shim kernels:\n{}",
            metrics
                .lines()
                .filter(|l| l.contains("shim"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    container.stop();
    assert_split(&chat_records(&dir));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn without_sys_admin_the_agent_says_the_scheduler_hooks_will_be_missing() {
    let dir = run_dir("no-sys-admin");
    let container = Container::start(
        &format!("inferscope-it-nosysadmin-{}", std::process::id()),
        NO_SYS_ADMIN,
        &dir,
        &[
            "run",
            "--port",
            "14999",
            "--prometheus",
            "off",
            "--shim-socket",
            "off",
        ],
    );
    let logs = container.wait_log("privileges: missing:", Duration::from_secs(30));
    let line = logs
        .lines()
        .find(|l| l.contains("privileges: missing:"))
        .unwrap_or_default();
    assert!(
        line.contains("engine scheduler uprobes") && line.contains("add CAP_SYS_ADMIN"),
        "{line}"
    );
    // Only that: the rest of the set is there.
    assert!(!line.contains("add CAP_BPF"), "{line}");
    assert!(!line.contains("add CAP_SYS_PTRACE"), "{line}");
    // The line comes before the eBPF programs load (seconds, more on a busy machine), and the
    // agent acts on SIGTERM once they have: stop it when it says it runs.
    container.wait_log("running; stop with", Duration::from_secs(120));
    container.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// The engine in a container (the host's /usr and the repository's venv mounted read-only into
/// an image of nothing but mount points), the agent on the host: its records name the
/// container podman reports, read from the engine's real /proc/PID/cgroup.
#[test]
fn records_name_the_engines_container() {
    let dir = run_dir("engine-in-container");
    let rootfs = dir.join("rootfs");
    for d in ["usr", "etc", "proc", "sys", "dev", "tmp", "run"] {
        fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        std::os::unix::fs::symlink(to, rootfs.join(link)).unwrap();
    }
    let image = "localhost/inferscope-it-mounts:latest";
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["-cf", "-", "."])
        .output()
        .expect("tar");
    assert!(tar.status.success());
    let mut import = Command::new("podman")
        .args(["import", "-", image])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("podman import");
    std::io::Write::write_all(&mut import.stdin.take().unwrap(), &tar.stdout).unwrap();
    assert!(import.wait().unwrap().success());

    let repo = fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).unwrap();
    let python = inferscope_integration_tests::engine::python();
    // The venv may be a link to a directory elsewhere: mount where it really is.
    let venv = fs::canonicalize(python.parent().unwrap().parent().unwrap()).unwrap();
    let port = free_port();
    let name = format!("inferscope-it-engine-{}", std::process::id());
    let _ = podman(&["rm", "-f", &name]);
    // The venv's interpreter may live outside /usr (pyenv): mount its installation too.
    let interpreter = fs::canonicalize(&python).unwrap();
    let prefix = interpreter
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let mut mounts = vec![
        "/usr:/usr:ro".to_string(),
        format!("{}:{}:ro", repo.display(), repo.display()),
        format!("{}:{}:ro", venv.display(), venv.display()),
    ];
    if !prefix.starts_with("/usr") {
        mounts.push(format!("{}:{}:ro", prefix.display(), prefix.display()));
    }
    let launcher = repo.join("tests/engine/llamacpp_server.py");
    let python_in_venv = venv.join("bin/python3");
    let mut args = vec![
        "run",
        "-d",
        "--name",
        &name,
        "--network=host",
        "--read-only",
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=4096:4096",
    ];
    for m in &mounts {
        args.extend(["-v", m.as_str()]);
    }
    let port_text = port.to_string();
    args.extend([
        image,
        python_in_venv.to_str().unwrap(),
        launcher.to_str().unwrap(),
        "--port",
        &port_text,
        "--slots",
        "1",
    ]);
    let engine = Container { name: name.clone() };
    let id = ok(&podman(&args), "podman run (engine)");
    assert_eq!(id.len(), 64, "{id}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !http_get(port, "/health").contains("ok") {
        assert!(
            Instant::now() < deadline,
            "the containerised engine never got ready:\n{}",
            engine.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let pid: u32 = ok(
        &podman(&["inspect", "--format", "{{.State.Pid}}", &name]),
        "podman inspect",
    )
    .parse()
    .expect("the engine's host pid");

    // Without Kubernetes (podman on a bare host): the container id, and no errors.
    let mut recorder = agent::Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(60));
    Client::connect(port).chat("Name three rivers.", 8, None);
    recorder.wait_records(Duration::from_secs(30), "the request's record", |records| {
        records.iter().any(|r| r["path"] == "/v1/chat/completions")
    });
    let log = recorder.log_text();
    let records = recorder.stop();
    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 1, "{records:#?}");
    let r = chats[0];
    assert_eq!(r["pid"], pid, "{r:#?}");
    assert_eq!(r["container_id"], id.as_str(), "{r:#?}");
    assert_eq!(r["container_runtime"], "podman", "{r:#?}");
    assert!(r.get("k8s_pod_name").is_none(), "{r:#?}");
    assert!(!log.contains("ERROR"), "{log}");

    // With the Kubernetes API (a local server answering list and watch the way the API does,
    // its pod's status naming this container): records, spans and metrics name the pod.
    let api = serve_pod_list(&id);
    let rotel = Rotel::start(&dir, free_port());
    let records_path = dir.join("run-records.jsonl");
    let mut daemon = Daemon::start_with_env(
        &dir,
        &[
            "--pid",
            &pid.to_string(),
            "--records",
            records_path.to_str().unwrap(),
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{}", rotel.port),
            "--shim-socket",
            "off",
        ],
        &[
            ("NODE_NAME", "gpu-node-1"),
            ("INFERSCOPE_KUBE_API", &format!("http://127.0.0.1:{api}")),
        ],
    );
    daemon.wait_attached(pid, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemon.log_text().contains("watching this node's pods") {
        assert!(Instant::now() < deadline, "{}", daemon.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The watch's first answer (the pod list) follows its start unannounced: a short settle.
    std::thread::sleep(Duration::from_millis(500));
    Client::connect(port).chat("Name three lakes.", 8, None);
    let spans = rotel.wait_for(Duration::from_secs(15), |spans| {
        spans.iter().any(|s| s.kind == "SPAN_KIND_SERVER")
    });
    let metrics = daemon.scrape();
    let log = daemon.stop();
    drop(engine);
    let records = agent::read_records(&records_path);
    let r = records
        .iter()
        .find(|r| r["path"] == "/v1/chat/completions")
        .unwrap_or_else(|| panic!("no record: {records:#?}\n{log}"));
    assert_eq!(r["container_id"], id.as_str(), "{r:#?}");
    assert_eq!(r["k8s_pod_name"], "vllm-7d9f8c6b5-x2k4p", "{r:#?}");
    assert_eq!(r["k8s_namespace_name"], "inference", "{r:#?}");
    assert_eq!(r["k8s_container_name"], "engine", "{r:#?}");
    assert_eq!(r["k8s_deployment_name"], "vllm", "{r:#?}");
    assert_eq!(r["k8s_node_name"], "gpu-node-1", "{r:#?}");
    assert_eq!(
        r["k8s_pod_uid"], "8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f",
        "{r:#?}"
    );
    let server = spans
        .iter()
        .find(|s| s.kind == "SPAN_KIND_SERVER")
        .unwrap_or_else(|| panic!("no request span: {spans:#?}"));
    for (key, value) in [
        ("container.id", id.as_str()),
        ("k8s.pod.name", "vllm-7d9f8c6b5-x2k4p"),
        ("k8s.namespace.name", "inference"),
        ("k8s.container.name", "engine"),
        ("k8s.deployment.name", "vllm"),
        ("k8s.node.name", "gpu-node-1"),
        ("k8s.pod.uid", "8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f"),
    ] {
        assert_eq!(
            server.resource.get(key).map(String::as_str),
            Some(value),
            "{key}: {:#?}",
            server.resource
        );
    }
    assert!(
        metrics.lines().any(
            |l| l.starts_with("gen_ai_server_time_to_first_token_seconds_count")
                && l.contains("namespace=\"inference\"")
                && l.contains("pod=\"vllm-7d9f8c6b5-x2k4p\"")
                && l.contains("container=\"engine\"")
        ),
        "{metrics}"
    );
    let _ = podman(&["rmi", "-f", image]);
    let _ = fs::remove_dir_all(&dir);
}

/// Answers the agent's list of this node's pods with tests/fixtures/kube/pods-list.json, its
/// vLLM pod's container id replaced by `container_id`, then holds its watch open.
fn serve_pod_list(container_id: &str) -> u16 {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/kube/pods-list.json");
    let list = fs::read_to_string(fixture)
        .expect("the pod list fixture")
        .replace(
            "3e8b0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddccbba",
            container_id,
        );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the API server");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let list = list.clone();
            std::thread::spawn(move || {
                use std::io::{BufRead, Write};
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                }
                if first.contains("watch=1") {
                    let _ = stream.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
                    );
                    std::thread::sleep(Duration::from_secs(120));
                } else {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{list}",
                        list.len()
                    );
                }
            });
        }
    });
    port
}

/// `inferscope check` in the image, the way the DaemonSet's container runs (host PID namespace,
/// the host's tracefs, read-only root): (stdout, exit code).
fn check_in_container(form: &[&str], port: u16) -> (String, i32) {
    let mut args = vec![
        "run",
        "--rm",
        "--pid=host",
        "--network=host",
        "--read-only",
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=4096:4096",
        "-v",
        "/sys/kernel/tracing:/sys/kernel/tracing",
    ];
    args.extend_from_slice(form);
    let image = image();
    let port = port.to_string();
    args.extend_from_slice(&[&image, "check", "--port", &port]);
    let out = podman(&args);
    (
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        out.status.code().unwrap_or(-1),
    )
}

/// The report's line about `topic` (after the 4-character status and two spaces).
fn report_line<'a>(report: &'a str, topic: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(topic)))
        .unwrap_or_else(|| panic!("no {topic} line in\n{report}"))
}

/// `inferscope check` tells the truth in each privilege setting: privileged and minimal trace
/// everything (hooks resolve and attach); the minimal set without CAP_SYS_ADMIN says that
/// capability is missing and uprobes are unavailable, still finds the engine, and exits 0
/// (its sockets can be traced).
#[test]
fn check_tells_the_truth_in_each_container_form() {
    let engine = Engine::start(free_port(), 2);
    let pid = engine.pid();
    for (name, form) in [("privileged", PRIVILEGED), ("minimal", MINIMAL)] {
        let (report, code) = check_in_container(form, engine.port);
        eprintln!("{name}:\n{report}");
        assert_eq!(code, 0, "{name}: {report}");
        assert!(
            report_line(&report, "ebpf").starts_with("  ok"),
            "{name}: {report}"
        );
        assert!(
            report_line(&report, "uprobes").starts_with("  ok"),
            "{name}: {report}"
        );
        assert!(!report.contains("missing: without it"), "{name}: {report}");
        let engine_line = report_line(&report, "engine");
        assert!(
            engine_line.contains(&format!("llamacpp pid {pid} port {}", engine.port)),
            "{name}: {engine_line}"
        );
        // The engine's files through /proc/PID/root: its package version and its hooks.
        assert!(
            !engine_line.contains("version unknown"),
            "{name}: {engine_line}"
        );
        let attach = engine_line
            .split("resolve in")
            .nth(1)
            .and_then(|rest| rest.split(", ").nth(1))
            .unwrap_or_default();
        let resolved = engine_line
            .split("scheduler hooks: ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_default();
        assert!(
            attach.starts_with(&format!("{resolved} of {resolved} attach")) && resolved != "0",
            "{name}: {engine_line}"
        );
    }

    let (report, code) = check_in_container(NO_SYS_ADMIN, engine.port);
    eprintln!("no SYS_ADMIN:\n{report}");
    assert_eq!(
        code, 0,
        "the engine's sockets can still be traced: {report}"
    );
    let missing: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("missing: without it"))
        .collect();
    assert_eq!(missing.len(), 1, "{report}");
    assert!(
        missing[0].starts_with("warn") && missing[0].contains("CAP_SYS_ADMIN missing"),
        "{report}"
    );
    let uprobes = report_line(&report, "uprobes");
    assert!(
        uprobes.starts_with("FAIL")
            && uprobes.contains("unavailable")
            && uprobes.contains("add CAP_SYS_ADMIN"),
        "{uprobes}"
    );
    assert!(report_line(&report, "ebpf").starts_with("  ok"), "{report}");
    assert!(
        report_line(&report, "engine").contains(&format!("llamacpp pid {pid}")),
        "{report}"
    );
    let verdict = report_line(&report, "verdict");
    assert!(
        verdict.starts_with("warn") && verdict.contains("without uprobes"),
        "{verdict}"
    );
    drop(engine);
}
