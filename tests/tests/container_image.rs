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
    sync::{Arc, Mutex},
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
    // assert_split holds prefill to the engine's own prefill time: not beside the played pods'
    // engine under load (on two cores its first token reached the socket two steps late).
    let _machine = inferscope_integration_tests::exclusive();
    let (container, dir, _) = records_the_host_engine("privileged", PRIVILEGED);
    container.stop();
    assert_split(&chat_records(&dir));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn minimal_form_records_queue_wait_and_prefill_and_takes_the_shim_from_a_host_path() {
    // As above: the split is held to the engine's own times.
    let _machine = inferscope_integration_tests::exclusive();
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
    let image = "localhost/inferscope-it-mounts:latest";
    import_mounts_image(&dir, image);

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
    let (api, refused) = serve_pod_list(&id, "gpu-node-1", "127.0.0.1");
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
    let refused = refused.lock().unwrap();
    assert!(
        refused.is_empty(),
        "the agent asked the API for more than its RBAC rules and its node allow: {refused:?}"
    );
    let _ = podman(&["rmi", "-f", image]);
    let _ = fs::remove_dir_all(&dir);
}

/// An image of nothing but mount points (and the usual /bin → /usr/bin links), from scratch
/// layers: the engine runs from the host's /usr and the repository's venv, mounted read-only.
fn import_mounts_image(dir: &Path, image: &str) {
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
}

/// The RBAC rules deploy/overlays/minimal binds to the agent's service account, as rendered
/// (scripts/daemonset-pod.py --rbac): `(apiGroups, resources, verbs)` per rule.
fn rendered_rbac_rules() -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    let repo = fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).unwrap();
    let out = Command::new(inferscope_integration_tests::engine::python())
        .arg(repo.join("scripts/daemonset-pod.py"))
        .args(["--rbac", "deploy/overlays/minimal"])
        .current_dir(&repo)
        .output()
        .expect("running scripts/daemonset-pod.py --rbac");
    let rbac: Value = serde_json::from_str(&ok(&out, "scripts/daemonset-pod.py --rbac")).unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    rbac["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| {
            (
                strings(&r["apiGroups"]),
                strings(&r["resources"]),
                strings(&r["verbs"]),
            )
        })
        .collect()
}

/// What a request line asks of the API, in RBAC's terms: (apiGroup, resource, verb), and its
/// field selector. None: not an API path this stand-in knows.
fn rbac_request(line: &str) -> Option<(String, String, String, Option<String>)> {
    let mut words = line.split_whitespace();
    let method = words.next()?;
    let target = words.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let param = |name: &str| {
        query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == name).then(|| v.replace("%3D", "=").replace("%3d", "="))
        })
    };
    let (group, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
        (String::new(), rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(3, '/');
        let group = parts.next()?.to_owned();
        let _version = parts.next()?;
        (group, parts.next()?)
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let segments = match segments.as_slice() {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail.to_vec(),
        other => other.to_vec(),
    };
    let resource = (*segments.first()?).to_owned();
    let named = segments.len() > 1;
    let watching = matches!(param("watch").as_deref(), Some("1" | "true"));
    let verb = match (method, named, watching) {
        ("GET", _, true) => "watch",
        ("GET", true, false) => "get",
        ("GET", false, false) => "list",
        ("POST", ..) => "create",
        ("PUT", ..) => "update",
        ("PATCH", ..) => "patch",
        ("DELETE", ..) => "delete",
        _ => return None,
    };
    Some((group, resource, verb.to_owned(), param("fieldSelector")))
}

/// A stand-in for the API server: answers the agent's list of this node's pods with
/// tests/fixtures/kube/pods-list.json (its vLLM pod's container id replaced by `container_id`),
/// then holds its watch open. It enforces what a real API server would for the agent's service
/// account: the verbs and resources of the rendered RBAC rules (403 otherwise), and the
/// agent's own promise to ask only for the pods of its node (`fieldSelector=spec.nodeName=`
/// `node`). Every refused request is kept in the returned list: the test fails on any.
fn serve_pod_list(container_id: &str, node: &str, bind: &str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/kube/pods-list.json");
    let list = fs::read_to_string(fixture)
        .expect("the pod list fixture")
        .replace(
            "3e8b0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddccbba",
            container_id,
        );
    let rules = Arc::new(rendered_rbac_rules());
    let refused: Arc<Mutex<Vec<String>>> = Arc::default();
    let own_node = format!("spec.nodeName={node}");
    let listener = std::net::TcpListener::bind((bind, 0)).expect("binding the API server");
    let port = listener.local_addr().unwrap().port();
    let refusals = refused.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let (list, rules, refused, own_node) = (
                list.clone(),
                rules.clone(),
                refusals.clone(),
                own_node.clone(),
            );
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
                let why = match rbac_request(&first) {
                    None => Some("not an API request"),
                    Some((group, resource, verb, selector)) => {
                        let allowed = rules.iter().any(|(groups, resources, verbs)| {
                            let has =
                                |set: &Vec<String>, x: &str| set.iter().any(|s| s == "*" || s == x);
                            has(groups, &group) && has(resources, &resource) && has(verbs, &verb)
                        });
                        if !allowed {
                            Some("outside the rendered RBAC rules")
                        } else if verb != "get" && selector.as_deref() != Some(own_node.as_str()) {
                            Some("not limited to this node's pods")
                        } else {
                            None
                        }
                    }
                };
                if let Some(why) = why {
                    refused
                        .lock()
                        .unwrap()
                        .push(format!("{}: {why}", first.trim()));
                    let _ = stream.write_all(
                        b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
                    );
                } else if first.contains("watch=1") {
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
    // The stand-in refuses what the rules do not allow: a request outside them fails a test.
    for (request, expect) in [
        (
            "GET /api/v1/secrets HTTP/1.1",
            "outside the rendered RBAC rules",
        ),
        (
            "DELETE /api/v1/namespaces/inference/pods/x HTTP/1.1",
            "outside",
        ),
        (
            "GET /api/v1/pods HTTP/1.1",
            "not limited to this node's pods",
        ),
    ] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        std::io::Write::write_all(&mut s, format!("{request}\r\n\r\n").as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut answer);
        assert!(answer.starts_with("HTTP/1.1 403"), "{request}: {answer}");
        let mut seen = refused.lock().unwrap();
        assert!(
            seen.last().is_some_and(|r| r.contains(expect)),
            "{request}: {seen:?}"
        );
        seen.clear();
    }
    (port, refused)
}

/// deploy/overlays/minimal as kustomize renders it, played by podman: the DaemonSet's pod
/// template taken mechanically by scripts/daemonset-pod.py (the image retargeted with
/// kustomize's own `images:`; NODE_NAME's fieldRef, which podman refuses, resolved the way the
/// kubelet does), next to its ConfigMap, run with `podman kube play`. What the rendered spec
/// says is what runs: the capability set, the read-only root, the memory limit, the config file
/// from the ConfigMap (its Prometheus address, its gRPC socket on the /run/inferscope host
/// path, where a host client reads it), the host paths; /metrics answers on the pod's address
/// the way the kubelet's readiness probe asks; SIGTERM (pod stop) ends it with status 0 and
/// removes its sockets.
///
/// Fields podman 4.3 accepts without honouring them, and where their effect is tested:
/// `hostPID` (the pod keeps its own PID namespace here; the next test gives the played agent
/// the host's, as podman's default, and records an engine pod), `seccompProfile: Unconfined` (podman applies its
/// default filter; the agent loads and attaches under it all the same, which this test shows),
/// `readinessProbe` (podman runs liveness probes only) and `livenessProbe` (podman 4.3 makes
/// it `curl -f http://localhost:0/healthz` in a shell: the named port unresolved, and the image
/// has neither sh nor curl): both are probed here from the host, on the pod's address, as a
/// kubelet does,
/// `SYS_RESOURCE` in `capabilities.add` (dropped; needed only on kernels before 5.11),
/// `serviceAccountName` (no API server; the pod-identity path is tested against the stand-in
/// API in `records_name_the_engines_container`), scheduling fields (no scheduler).
///
/// The privileged overlay is played the same way, after it (one pod name, one /run/inferscope):
/// it holds every capability and no seccomp filter. The gpu overlay is not played: podman 4.3
/// runs its init container (the shim lands on the host path, exit 0) but then fails the play
/// ("failed to remove once init container ... as it is running") and leaves the agent
/// container created, not started; `install-shim` runs under `podman run` in
/// `minimal_form_records_queue_wait_and_prefill_and_takes_the_shim_from_a_host_path`.
#[test]
fn the_rendered_daemonset_pods_run_as_written_under_podman_kube_play() {
    // One pod name and one /run/inferscope with the test below.
    let _machine = inferscope_integration_tests::exclusive();
    for overlay in ["minimal", "privileged"] {
        play_overlay(overlay);
    }
}

fn play_overlay(overlay: &str) {
    eprintln!("== deploy/overlays/{overlay}");
    let repo = fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).unwrap();
    let dir = run_dir(&format!("kube-play-{overlay}"));

    let image = image();
    let image = if image.contains('/') {
        image
    } else {
        format!("localhost/{image}")
    };
    let node = "node-1";
    let out = Command::new(inferscope_integration_tests::engine::python())
        .arg(repo.join("scripts/daemonset-pod.py"))
        .args([&format!("deploy/overlays/{overlay}"), &image, node])
        .current_dir(&repo)
        .output()
        .expect("running scripts/daemonset-pod.py");
    let pod_yaml = ok(&out, "scripts/daemonset-pod.py");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(pod_yaml.contains("kind: Pod") && pod_yaml.contains("kind: ConfigMap"));
    let pod_file = dir.join("pod.yaml");
    fs::write(&pod_file, &pod_yaml).unwrap();
    // This host's open-files limit is below podman's default (TOOLCHAIN.md): the runtime's own
    // setting, not the manifest's.
    let conf = dir.join("containers.conf");
    fs::write(
        &conf,
        "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=4096:4096\"]\n",
    )
    .unwrap();
    let kube = |args: &[&str]| {
        Command::new("podman")
            .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
            .args(args)
            .env("CONTAINERS_CONF", &conf)
            .output()
            .expect("running podman")
    };
    let _ = kube(&["pod", "rm", "-f", "inferscope"]);
    ok(
        &kube(&["kube", "play", pod_file.to_str().unwrap()]),
        "podman kube play",
    );
    let _played = PlayedPod("inferscope".into());
    let agent = Container {
        name: "inferscope-agent".into(),
    };
    let logs = agent.wait_log("running; stop with", Duration::from_secs(120));
    assert!(
        logs.contains("privileges: every feature available"),
        "{logs}"
    );
    // The ConfigMap's settings, not the agent's defaults for a host.
    assert!(logs.contains("addr=0.0.0.0:9464"), "{logs}");
    assert!(
        logs.contains("serving the gRPC API path=/run/inferscope/agent.sock"),
        "{logs}"
    );
    assert!(!logs.contains("ERROR"), "{logs}");

    let inspect = |format: &str| {
        ok(
            &podman(&["inspect", "--format", format, "inferscope-agent"]),
            "podman inspect",
        )
    };
    assert_eq!(inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");
    assert_eq!(
        inspect("{{.HostConfig.Memory}}"),
        (384u64 * 1024 * 1024).to_string(),
        "resources.limits.memory"
    );
    let pid = inspect("{{.State.Pid}}");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .expect("CapEff");
    // capabilities.add as rendered: DAC_READ_SEARCH 2, SYS_PTRACE 19, SYS_ADMIN 21,
    // SYS_RESOURCE 24 (podman 4.3 drops it), PERFMON 38, BPF 39; drop ALL: nothing else.
    let needed: u64 = [2, 19, 21, 38, 39].iter().map(|b| 1u64 << b).sum();
    assert_eq!(cap_eff & needed, needed, "CapEff {cap_eff:#x}");
    let seccomp = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(str::trim)
        .unwrap_or_default()
        .to_owned();
    if overlay == "privileged" {
        // Every capability (NET_ADMIN 12 among them), no seccomp filter.
        assert!(cap_eff & (1 << 12) != 0, "CapEff {cap_eff:#x}");
        assert_eq!(seccomp, "0");
    } else {
        assert_eq!(cap_eff & !(needed | 1 << 24), 0, "CapEff {cap_eff:#x}");
    }

    let env = fs::read(format!("/proc/{pid}/environ")).unwrap();
    let env = String::from_utf8_lossy(&env);
    assert!(env.contains("NODE_NAME=node-1"), "{env}");
    assert!(
        env.contains("OTEL_RESOURCE_ATTRIBUTES=k8s.node.name=node-1"),
        "{env}"
    );

    // The probes as the kubelet sends them: GET /readyz and /healthz on the pod's address.
    let infra = ok(
        &podman(&[
            "pod",
            "inspect",
            "--format",
            "{{.InfraContainerID}}",
            "inferscope",
        ]),
        "podman pod inspect",
    );
    let ip = ok(
        &podman(&[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &infra,
        ]),
        "podman inspect (infra)",
    );
    let probe = |path: &str| {
        let mut stream = std::net::TcpStream::connect((ip.as_str(), 9464))
            .unwrap_or_else(|e| panic!("the pod's metrics port {ip}:9464: {e}"));
        std::io::Write::write_all(
            &mut stream,
            format!("GET {path} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
        answer
    };
    // A kubelet's httpGet probe passes on any 2xx or 3xx. Ready once the capture loop has
    // made its first pass (just after "running").
    let deadline = Instant::now() + Duration::from_secs(10);
    while !probe("/readyz").starts_with("HTTP/1.1 200") {
        assert!(Instant::now() < deadline, "{}", probe("/readyz"));
        std::thread::sleep(Duration::from_millis(100));
    }
    for path in ["/readyz", "/healthz", "/metrics"] {
        let answer = probe(path);
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }

    // The hostPath /run/inferscope: a host client reads the played agent's API there.
    let top = Command::new(agent::binary())
        .args(["top", "--iterations", "1", "--interval", "300ms"])
        .args(["--connect", "unix:///run/inferscope/agent.sock"])
        .output()
        .expect("running inferscope top");
    assert!(
        top.status.success(),
        "{}",
        String::from_utf8_lossy(&top.stderr)
    );

    // SIGTERM the way the kubelet stops a pod.
    ok(
        &kube(&["pod", "stop", "-t", "30", "inferscope"]),
        "podman pod stop",
    );
    assert_eq!(inspect("{{.State.ExitCode}}"), "0", "{}", agent.logs());
    assert!(!Path::new("/run/inferscope/agent.sock").exists());
    let _ = fs::remove_dir_all(&dir);
}

/// podman as this host needs it, with a containers.conf of the test's (`conf`).
fn podman_with(conf: &Path, args: &[&str]) -> Output {
    Command::new("podman")
        .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
        .args(args)
        .env("CONTAINERS_CONF", conf)
        .output()
        .expect("running podman")
}

/// A played pod, removed when the test ends.
struct PlayedPod(String);

impl Drop for PlayedPod {
    fn drop(&mut self) {
        // podman 4.3 under runc sometimes still sees a stopped container as running for a
        // moment: try again rather than leave the pod behind.
        for _ in 0..5 {
            let _ = podman(&["pod", "rm", "-f", "-t", "5", &self.0]);
            if !podman(&["pod", "exists", &self.0]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// Issue 23's bar, played from the rendered manifests: the engine runs as a pod of its own (the
/// user's `vllm-7d9f8c6b5-x2k4p` in namespace `inference`, container `engine`: the real
/// llama.cpp engine from an image of mount points built here), the agent as the pod
/// deploy/overlays/minimal renders (scripts/daemonset-pod.py, as in the test above). The
/// stand-in API server answers with the played engine pod's real container id and names, and
/// refuses anything outside the rendered RBAC rules and this node. 24 streamed requests, 4 at
/// a time on 2 slots: every one is a record, read back through the agent's API on the host
/// path, with queue wait, the engine's container id, and its pod name, namespace, container
/// and node.
///
/// Two things a kubelet does are done for it: the host PID namespace the rendered
/// `hostPID: true` asks for (podman 4.3 ignores the field) is podman's default for the agent's
/// pod (its own containers.conf, `pidns = "host"`); the API server's address, which a kubelet
/// adds to every container's env (KUBERNETES_SERVICE_HOST/PORT, https), is added by
/// scripts/daemonset-pod.py as INFERSCOPE_KUBE_API for the plain-HTTP stand-in.
#[test]
fn the_played_daemonset_pod_records_the_played_engine_pod_by_name() {
    let _machine = inferscope_integration_tests::exclusive();
    let repo = fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).unwrap();
    let dir = run_dir("kube-play-engine");
    let ulimits = "default_ulimits = [\"nofile=20000:20000\", \"nproc=4096:4096\"]\n";
    let engine_conf = dir.join("engine-containers.conf");
    fs::write(&engine_conf, format!("[containers]\n{ulimits}")).unwrap();

    // The engine's pod.
    let engine_image = "localhost/inferscope-it-engine-pod:latest";
    import_mounts_image(&dir, engine_image);
    let python = inferscope_integration_tests::engine::python();
    let venv = fs::canonicalize(python.parent().unwrap().parent().unwrap()).unwrap();
    let prefix = fs::canonicalize(&python)
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let mut mounts = vec![
        ("host-usr", PathBuf::from("/usr")),
        ("repo", repo.clone()),
        ("venv", venv.clone()),
    ];
    if !prefix.starts_with("/usr") {
        mounts.push(("python", prefix));
    }
    let port = free_port();
    let (pod_name, namespace) = ("vllm-7d9f8c6b5-x2k4p", "inference");
    let engine_pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": {"app": "vllm"}},
        "spec": {
            "hostNetwork": true,
            "containers": [{
                "name": "engine",
                "image": engine_image,
                "command": [
                    venv.join("bin/python3"),
                    repo.join("tests/engine/llamacpp_server.py"),
                    "--port", port.to_string(), "--slots", "2",
                ],
                "securityContext": {"readOnlyRootFilesystem": true},
                "volumeMounts": mounts.iter().map(|(name, path)| serde_json::json!(
                    {"name": name, "mountPath": path, "readOnly": true})).collect::<Vec<_>>(),
            }],
            "volumes": mounts.iter().map(|(name, path)| serde_json::json!(
                {"name": name, "hostPath": {"path": path, "type": "Directory"}})).collect::<Vec<_>>(),
        },
    });
    let engine_file = dir.join("engine-pod.yaml");
    fs::write(&engine_file, engine_pod.to_string()).unwrap();
    let _ = podman(&["pod", "rm", "-f", pod_name]);
    ok(
        &podman_with(
            &engine_conf,
            &["kube", "play", engine_file.to_str().unwrap()],
        ),
        "podman kube play (engine)",
    );
    let _engine_pod = PlayedPod(pod_name.into());
    let engine = Container {
        name: format!("{pod_name}-engine"),
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !http_get(port, "/health").contains("ok") {
        assert!(
            Instant::now() < deadline,
            "the played engine never got ready:\n{}",
            engine.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let inspect = |name: &str, format: &str| {
        ok(
            &podman(&["inspect", "--format", format, name]),
            "podman inspect",
        )
    };
    let engine_id = inspect(&engine.name, "{{.Id}}");
    let engine_pid = inspect(&engine.name, "{{.State.Pid}}");

    // The stand-in API, reached from the agent pod's network through its bridge's gateway.
    let network = "podman-default-kube-network";
    if !podman(&["network", "exists", network]).status.success() {
        ok(
            &podman(&["network", "create", network]),
            "podman network create",
        );
    }
    let gateway = ok(
        &podman(&[
            "network",
            "inspect",
            "--format",
            "{{range .Subnets}}{{.Gateway}}{{end}}",
            network,
        ]),
        "podman network inspect",
    );
    let node = "gpu-node-1";
    let (api, refused) = serve_pod_list(&engine_id, node, "0.0.0.0");

    // The agent's pod, as rendered.
    let image = image();
    let image = if image.contains('/') {
        image
    } else {
        format!("localhost/{image}")
    };
    let out = Command::new(&python)
        .arg(repo.join("scripts/daemonset-pod.py"))
        .args(["deploy/overlays/minimal", &image, node])
        .arg(format!("http://{gateway}:{api}"))
        .current_dir(&repo)
        .output()
        .expect("running scripts/daemonset-pod.py");
    let pod_yaml = ok(&out, "scripts/daemonset-pod.py");
    assert!(pod_yaml.contains("hostPID: true"), "{pod_yaml}");
    let agent_file = dir.join("agent-pod.yaml");
    fs::write(&agent_file, &pod_yaml).unwrap();
    let agent_conf = dir.join("agent-containers.conf");
    fs::write(
        &agent_conf,
        format!("[containers]\n{ulimits}pidns = \"host\"\n"),
    )
    .unwrap();
    let _ = podman(&["pod", "rm", "-f", "inferscope"]);
    ok(
        &podman_with(&agent_conf, &["kube", "play", agent_file.to_str().unwrap()]),
        "podman kube play (agent)",
    );
    let _agent_pod = PlayedPod("inferscope".into());
    let agent_container = Container {
        name: "inferscope-agent".into(),
    };
    agent_container.wait_log(
        &format!(": attached pid={engine_pid} "),
        Duration::from_secs(90),
    );
    let logs = agent_container.wait_log("watching this node's pods", Duration::from_secs(30));
    assert!(logs.contains("scheduler hook attached"), "{logs}");
    // The watch's first answer (the pod list) follows its start unannounced: a short settle.
    std::thread::sleep(Duration::from_millis(500));

    let topics = [
        "lighthouses",
        "beetles",
        "volcanoes",
        "violins",
        "glaciers",
        "comets",
    ];
    let mut n = 0;
    for round in 0..6 {
        let clients: Vec<_> = (0..4)
            .map(|i| {
                let id = format!("played-{}", round * 4 + i);
                let prompt = format!(
                    "({round}.{i}) Two sentences about {}.",
                    topics[(round + i) % topics.len()]
                );
                std::thread::spawn(move || {
                    let mut client = Client::connect(port);
                    client.set_header("x-request-id", &id);
                    client.chat(&prompt, 8, None).completed
                })
            })
            .collect();
        for c in clients {
            assert!(c.join().expect("client"), "a request did not complete");
            n += 1;
        }
    }
    assert_eq!(n, 24);

    let records: Vec<Value> = (0..n)
        .map(|i| {
            let id = format!("played-{i}");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let out = Command::new(agent::binary())
                    .args(["inspect", "--json", &id])
                    .args(["--connect", "unix:///run/inferscope/agent.sock"])
                    .output()
                    .expect("running inferscope inspect");
                if out.status.success() {
                    break serde_json::from_slice(&out.stdout).expect("inspect --json");
                }
                assert!(
                    Instant::now() < deadline,
                    "no record for {id}: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    agent_container.logs()
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        })
        .collect();
    for r in &records {
        assert!(r["queue_wait_ms"].is_number(), "{r:#}");
        assert_eq!(r["container_id"], engine_id.as_str(), "{r:#}");
        assert_eq!(r["k8s_pod_name"], pod_name, "{r:#}");
        assert_eq!(r["k8s_namespace_name"], namespace, "{r:#}");
        assert_eq!(r["k8s_container_name"], "engine", "{r:#}");
        assert_eq!(r["k8s_node_name"], node, "{r:#}");
    }
    // Two slots, four streams at once: requests waited for a slot.
    assert!(
        records
            .iter()
            .filter(|r| r["queue_wait_ms"].as_f64().is_some_and(|q| q > 5.0))
            .count()
            >= 6,
        "{records:#?}"
    );
    let refused = refused.lock().unwrap().clone();
    assert!(refused.is_empty(), "{refused:?}");

    ok(
        &podman(&["pod", "stop", "-t", "30", "inferscope"]),
        "podman pod stop",
    );
    assert_eq!(
        inspect("inferscope-agent", "{{.State.ExitCode}}"),
        "0",
        "{}",
        agent_container.logs()
    );
    drop(engine);
    let _ = podman(&["rmi", "-f", engine_image]);
    let _ = fs::remove_dir_all(&dir);
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
