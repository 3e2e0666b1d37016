//! The Grafana dashboard (deploy/grafana/inferscope.json) against a real Prometheus scraping a
//! real `inferscope run` that follows vLLM's real scheduler under load (preemptions included):
//! every panel's PromQL, with its template variables substituted, returns data through
//! Prometheus' HTTP API, so no panel can silently show "No data" after a metric or label was
//! renamed. Panels that need a GPU are named below and skipped, with the reason. The same vLLM
//! server also serves `inferscope check`'s vLLM case (package version, IPC sockets).

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use inferscope_integration_tests::{
    daemon::Daemon,
    exclusive, free_port,
    prometheus::Prometheus,
    test_dir,
    vllm::{VllmOptions, VllmServer},
    vllm_load, wait_until,
};
use serde_json::Value;

/// Panels that cannot return data on a machine without a GPU, and why.
const GPU_ONLY: &[(&str, &str)] = &[
    (
        "GPU utilisation",
        "inferscope_gpu is sampled from NVML, which needs an NVIDIA GPU and its driver",
    ),
    (
        "GPU memory",
        "inferscope_gpu is sampled from NVML, which needs an NVIDIA GPU and its driver",
    ),
];

/// The Prometheus scrape config adds this `node` label, as a Kubernetes scrape config's
/// relabelling of `__meta_kubernetes_pod_node_name` does (docs/src/grafana.md).
const NODE: &str = "node-a";

fn dashboard() -> Value {
    serde_json::from_str(include_str!("../../deploy/grafana/inferscope.json"))
        .expect("deploy/grafana/inferscope.json is JSON")
}

/// Every panel (rows hold none) with its queries.
fn panels(dashboard: &Value) -> Vec<(String, Vec<String>)> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .map(|p| {
            let exprs = p["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(|t| t["expr"].as_str().expect("expr").to_owned())
                .collect();
            (p["title"].as_str().expect("title").to_owned(), exprs)
        })
        .collect()
}

/// Grafana's substitution: `$name` by the variable's value (a regex; "All" is the variable's
/// allValue, `.*`), `$__rate_interval` by a window over the load.
fn substitute(expr: &str, values: &[(String, String)]) -> String {
    let mut out = expr.replace("$__rate_interval", "1m");
    // Longest names first: $namespace before $name-prefixes of it.
    let mut values = values.to_vec();
    values.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    for (name, value) in &values {
        out = out.replace(&format!("${name}"), value);
    }
    out
}

/// `label_values(METRIC{…}, LABEL)` → (PromQL giving one series per value, LABEL).
fn variable_query(query: &str) -> (String, String) {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (metric, label) = inner.rsplit_once(',').expect("label_values(metric, label)");
    let label = label.trim().to_owned();
    (format!("count by ({label}) ({})", metric.trim()), label)
}

/// Series with a finite value (NaN from a quantile of nothing is "No data" in Grafana too).
fn finite_series(result: &[Value]) -> usize {
    result
        .iter()
        .filter(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        })
        .count()
}

#[test]
fn gpu_only_panels_are_the_gpu_ones() {
    let panels = panels(&dashboard());
    for (title, why) in GPU_ONLY {
        let (_, exprs) = panels
            .iter()
            .find(|(t, _)| t == title)
            .unwrap_or_else(|| panic!("GPU-only panel {title} is not in the dashboard"));
        assert!(
            exprs.iter().all(|e| e.contains("inferscope_gpu{")),
            "{title} is exempt ({why}) but queries more than inferscope_gpu: {exprs:?}"
        );
    }
    assert!(panels.len() >= 15, "{panels:?}");
}

#[test]
fn every_panel_returns_data_from_a_real_prometheus() {
    // A real vLLM server (API server and EngineCore) beside the agent: alone on the machine.
    let _machine = exclusive();
    let dir = test_dir("dashboard");
    let port = free_port();
    // 200 blocks of 16 tokens: one 3,000-token prompt takes 188 of them, so vLLM preempts.
    let server = VllmServer::start(
        &dir.join("vllm"),
        port,
        &VllmOptions {
            kv_blocks: 200,
            max_num_seqs: 8,
            max_model_len: 3100,
            ..Default::default()
        },
    );
    // While vLLM runs: `inferscope check` names its version from its package and sees its
    // ZeroMQ IPC sockets (the IPC decoder's input); its engine has no scheduler uprobes.
    let out = std::process::Command::new(inferscope_integration_tests::agent::binary())
        .args(["check", "--port", &port.to_string()])
        .output()
        .expect("running inferscope check");
    let report = String::from_utf8_lossy(&out.stdout);
    let engine_line = report
        .lines()
        .find(|l| l.contains(&format!("vllm pid {} ", server.pid())))
        .unwrap_or_else(|| panic!("no vLLM engine line in\n{report}"));
    assert!(engine_line.contains("version 0.33.0"), "{engine_line}");
    assert!(
        engine_line.contains("no scheduler uprobes"),
        "{engine_line}"
    );
    let ipc = engine_line
        .split("IPC decoded: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no IPC sockets counted: {engine_line}"));
    assert!(ipc >= 1, "{engine_line}");
    assert_eq!(out.status.code(), Some(0), "{report}");

    let mut daemon = Daemon::start(
        &dir,
        &[
            "--port",
            &port.to_string(),
            "--engine-metrics-interval",
            "1s",
        ],
    );
    daemon.wait_attached(server.pid(), Duration::from_secs(60));
    let prometheus = Prometheus::start_with_labels(&dir, daemon.prometheus_port, &[("node", NODE)]);
    wait_until(
        Duration::from_secs(30),
        "Prometheus scraping the agent",
        || prometheus.target_health() == "up",
    );

    let jobs = vllm_load::mix(32, "dash");
    let _ = vllm_load::run_all(port, &jobs, 16);
    // Scrapes after the last request: every series of the load is in Prometheus.
    wait_until(
        Duration::from_secs(30),
        "the load's requests in Prometheus",
        || {
            prometheus
                .query("sum(inferscope_requests_total)")
                .ok()
                .and_then(|r| r.first()?["value"][1].as_str()?.parse::<f64>().ok())
                .is_some_and(|n| n >= 24.0)
        },
    );
    std::thread::sleep(Duration::from_secs(3));

    let dashboard = dashboard();
    let variables: Vec<&Value> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter(|v| v["type"] == "query")
        .collect();
    // Each variable's own query, with the variables before it at "All" (or the job): the node,
    // job, engine and model lists are not empty; namespace and pod have values only where
    // engines run in Kubernetes pods (not here), and their queries must still run.
    let mut all: Vec<(String, String)> = Vec::new();
    let mut first: Vec<(String, String)> = Vec::new();
    for v in &variables {
        let name = v["name"].as_str().expect("name").to_owned();
        let (query, label) = variable_query(v["query"]["query"].as_str().expect("query"));
        let result = prometheus
            .query(&substitute(&query, &all))
            .unwrap_or_else(|e| panic!("variable {name}: {query}: {e}"));
        let values: Vec<String> = result
            .iter()
            .filter_map(|s| s["metric"][&label].as_str().map(str::to_owned))
            .collect();
        eprintln!("variable {name}: {values:?}");
        match name.as_str() {
            "job" => assert_eq!(values, ["inferscope"], "{name}"),
            "node" => assert_eq!(values, [NODE], "{name}"),
            "engine" => assert!(values.iter().any(|e| e == "vllm"), "{name}: {values:?}"),
            "model" => assert!(!values.is_empty(), "{name}"),
            "namespace" | "pod" => {
                assert!(values.is_empty(), "{name} outside Kubernetes: {values:?}")
            }
            other => panic!("variable {other} is not covered by this test"),
        }
        let all_value = if v["includeAll"] == true {
            v["allValue"].as_str().expect("allValue").to_owned()
        } else {
            values[0].clone()
        };
        all.push((name.clone(), all_value.clone()));
        first.push((name, values.first().cloned().unwrap_or(all_value)));
    }

    let mut no_data = Vec::new();
    let mut checked = 0;
    for (title, exprs) in panels(&dashboard) {
        let gpu_only = GPU_ONLY.iter().find(|(t, _)| *t == title);
        for expr in &exprs {
            for values in [&all, &first] {
                let query = substitute(expr, values);
                assert!(
                    !query.contains('$'),
                    "{title}: unsubstituted variable in {query}"
                );
                let result = prometheus
                    .query(&query)
                    .unwrap_or_else(|e| panic!("{title}: Prometheus refused {query}: {e}"));
                if let Some((_, why)) = gpu_only {
                    eprintln!("skipped (GPU only: {why}): {title}: {query}");
                    continue;
                }
                checked += 1;
                if finite_series(&result) == 0 {
                    no_data.push(format!("{title}: {query} → {result:?}"));
                }
            }
        }
    }
    let log = daemon.stop();
    drop(server);
    assert!(
        no_data.is_empty(),
        "panels without data:\n{}\n\nagent log:\n{log}",
        no_data.join("\n")
    );
    eprintln!("{checked} panel queries returned data");
    let _ = std::fs::remove_dir_all(&dir);
}
