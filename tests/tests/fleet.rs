//! The fleet case of `inferscope diagnose --prometheus`: three real llama.cpp engines, each the
//! only engine of its own agent (`inferscope run`), one real Prometheus (Debian's) scraping the
//! three agents. Every engine gets the same closed-loop load in both windows; in the incident
//! window one engine's process is throttled by a cgroup (a slow card's stand-in). The fleet
//! diagnosis must say TTFT regressed and name that engine's agent as where; the control (no
//! throttle) must come out with no regression.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../incidents/cgroup.rs"]
#[allow(dead_code)]
mod cgroup;

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, SystemTime},
};

use inferscope_integration_tests::{
    agent::binary, client::Client, daemon::Daemon, engine::Engine, free_port,
    prometheus::Prometheus, test_dir,
};
use serde_json::Value;

/// One client per engine, asking again as soon as it is answered, until `stop`.
fn load(ports: &[u16], stop: &Arc<AtomicBool>) -> Vec<thread::JoinHandle<usize>> {
    ports
        .iter()
        .enumerate()
        .map(|(k, &port)| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let prompt = format!("({k}-{n}) Name one colour and one animal, briefly.");
                    let s = Client::connect(port).chat(&prompt, 8, None);
                    assert!(s.completed, "{s:?}");
                    n += 1;
                    thread::sleep(Duration::from_millis(100));
                }
                n
            })
        })
        .collect()
}

fn phase(ports: &[u16], length: Duration) -> (SystemTime, SystemTime) {
    let start = SystemTime::now();
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(ports, &stop);
    thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    let end = SystemTime::now();
    for c in clients {
        assert!(c.join().expect("client thread") > 3);
    }
    (start, end)
}

fn range((start, end): (SystemTime, SystemTime)) -> String {
    format!(
        "{}..{}",
        humantime::format_rfc3339_nanos(start),
        humantime::format_rfc3339_nanos(end)
    )
}

fn fleet(throttle: bool, name: &str) -> (Value, String, Vec<u16>) {
    let _machine = inferscope_integration_tests::exclusive();
    let dir = test_dir(name);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let engines: Vec<Engine> = ports.iter().map(|&p| Engine::start(p, 1)).collect();
    let mut agents = Vec::new();
    for (i, e) in engines.iter().enumerate() {
        let sub = dir.join(format!("agent{i}"));
        std::fs::create_dir_all(&sub).unwrap();
        let mut d = Daemon::start(
            &sub,
            &["--pid", &e.pid().to_string(), "--diagnose-interval", "off"],
        );
        d.wait_attached(e.pid(), Duration::from_secs(60));
        agents.push(d);
    }
    let metrics: Vec<u16> = agents.iter().map(|a| a.prometheus_port).collect();
    let prometheus = Prometheus::start_targets(&dir, &metrics);
    inferscope_integration_tests::wait_until(
        Duration::from_secs(30),
        "Prometheus scraping the three agents",
        || {
            prometheus
                .query_value("count(up == 1)", Duration::from_secs(1))
                .is_some_and(|n| n >= 3.0)
        },
    );
    // Warm-up outside both windows.
    phase(&ports, Duration::from_secs(3));
    thread::sleep(Duration::from_secs(2));
    let baseline = phase(&ports, Duration::from_secs(20));
    thread::sleep(Duration::from_secs(2));
    let limit = throttle.then(|| {
        cgroup::CpuLimit::apply(engines[1].pid(), 2_000, 10_000).unwrap_or_else(|e| panic!("{e}"))
    });
    let window = phase(&ports, Duration::from_secs(20));
    drop(limit);
    // Two scrapes after the window, so its last samples are in.
    thread::sleep(Duration::from_secs(3));
    let run = |json: bool| {
        let mut cmd = Command::new(binary());
        cmd.args(["diagnose", "--prometheus"])
            .arg(format!("http://127.0.0.1:{}", prometheus.port))
            .arg("--baseline")
            .arg(range(baseline))
            .arg("--window")
            .arg(range(window));
        if json {
            cmd.arg("--json");
        }
        cmd.output()
            .expect("running inferscope diagnose --prometheus")
    };
    let out = run(true);
    let report = String::from_utf8_lossy(&run(false).stdout).into_owned();
    eprintln!("== {name} ==\n{report}");
    let d: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    drop(agents);
    (d, report, metrics)
}

#[test]
fn one_throttled_engine_among_three_is_named_from_prometheus() {
    let (d, report, metrics) = fleet(true, "fleet-degraded");
    let ttft = d["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["profile"] == "ttft")
        .unwrap();
    assert_eq!(ttft["regressed"], true, "{report}");
    let slowed = format!("127.0.0.1:{}", metrics[1]);
    assert_eq!(ttft["concentrated_on"], slowed.as_str(), "{report}");
    assert_eq!(d["place"], slowed.as_str(), "{report}");
    assert_eq!(d["cause"], "degraded_device", "{report}");
    assert!(d["missing"].as_array().unwrap().is_empty(), "{report}");
}

#[test]
fn the_same_fleet_twice_is_no_regression_from_prometheus() {
    let (d, report, _) = fleet(false, "fleet-control");
    for p in d["profiles"].as_array().unwrap() {
        assert_eq!(p["regressed"], false, "{report}");
    }
    assert_eq!(d["cause"], "none", "{report}");
}
