//! A real Prometheus server (Debian's `prometheus`) scraping the agent, queried over its HTTP API.
use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub struct Prometheus {
    child: Child,
    pub port: u16,
}

impl Prometheus {
    pub fn start(dir: &Path, target_port: u16) -> Prometheus {
        Self::start_with_labels(dir, target_port, &[])
    }

    /// [`Prometheus::start`] with target labels added the way a Kubernetes scrape config's
    /// relabelling adds them (e.g. `node` from `__meta_kubernetes_pod_node_name`).
    pub fn start_with_labels(dir: &Path, target_port: u16, labels: &[(&str, &str)]) -> Prometheus {
        let labels: String = if labels.is_empty() {
            String::new()
        } else {
            let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: '{v}'")).collect();
            format!("        labels: {{{}}}\n", pairs.join(", "))
        };
        Self::scraping(dir, &[target_port], &labels)
    }

    /// Scraping several agents (one job, one target each: Prometheus labels each series with
    /// its target's `instance`), every second.
    pub fn start_targets(dir: &Path, target_ports: &[u16]) -> Prometheus {
        Self::scraping(dir, target_ports, "")
    }

    /// Prometheus scraping `target_ports` every second (one job; `labels`: the static config's
    /// labels line, or empty), its data and log in `dir`.
    fn scraping(dir: &Path, target_ports: &[u16], labels: &str) -> Prometheus {
        let port = crate::free_port();
        let config = dir.join("prometheus.yml");
        let targets: Vec<String> = target_ports
            .iter()
            .map(|p| format!("'127.0.0.1:{p}'"))
            .collect();
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: inferscope\n    static_configs:\n      - targets: [{}]\n{labels}",
                targets.join(", ")
            ),
        )
        .expect("writing prometheus.yml");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("prometheus.log")).expect("prometheus log"))
            .spawn()
            .expect("starting prometheus (apt-get install prometheus; scripts/setup.sh does)");
        Prometheus { child, port }
    }

    /// The value of an instant query returning one series, once it exists.
    pub fn query_value(&self, query: &str, timeout: Duration) -> Option<f64> {
        let deadline = Instant::now() + timeout;
        let path = format!("/api/v1/query?query={}", encode(query));
        while Instant::now() < deadline {
            let body = crate::http_get(self.port, &path);
            if let Ok(v) = serde_json::from_str::<Value>(&body)
                && let Some(value) = v["data"]["result"][0]["value"][1].as_str()
                && let Ok(value) = value.parse()
            {
                return Some(value);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        None
    }

    /// An instant query's answer: `Ok(result)` (the `data.result` array), or the error
    /// Prometheus gave (a query that does not parse, an unknown function).
    pub fn query(&self, query: &str) -> Result<Vec<Value>, String> {
        let body = crate::http_get(self.port, &format!("/api/v1/query?query={}", encode(query)));
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Health of the scrape target as Prometheus sees it ("up", "down", "unknown").
    pub fn target_health(&self) -> String {
        let body = crate::http_get(self.port, "/api/v1/targets");
        serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| {
                v["data"]["activeTargets"][0]["health"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_default()
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
