//! `inferscope run` as a child process, and its CLI clients (`top`, `inspect`, `export`).
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::agent::binary;

pub struct Daemon {
    child: Child,
    pub log: PathBuf,
    pub socket: PathBuf,
    pub prometheus_port: u16,
}

impl Daemon {
    /// `inferscope run <args> --grpc unix://DIR/agent.sock --shim-socket DIR/shim.sock
    /// --prometheus 127.0.0.1:PORT` (args may give their own --grpc and --shim-socket).
    pub fn start(dir: &Path, args: &[&str]) -> Daemon {
        Self::start_with_env(dir, args, &[])
    }

    /// [`Daemon::start`] with extra environment variables (e.g. NODE_NAME).
    pub fn start_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Self::start_logging_to(dir, "agent.log", args, env)
    }

    /// [`Daemon::start_with_env`] logging to `dir/log_name`: two agents sharing one socket
    /// directory (a rolling update) each keep their own log.
    pub fn start_logging_to(
        dir: &Path,
        log_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let log = dir.join(log_name);
        let socket = dir.join("agent.sock");
        let prometheus_port = crate::free_port();
        let mut command = Command::new(binary());
        command.arg("run").args(args);
        if !args.contains(&"--grpc") {
            command
                .arg("--grpc")
                .arg(format!("unix://{}", socket.display()));
        }
        // The default shim socket (/run/inferscope/shim.sock) is one per host: a second daemon
        // beside a live one waits to take over from it (a rolling update), so each test's
        // daemon gets its own.
        if !args.contains(&"--shim-socket") {
            command.arg("--shim-socket").arg(dir.join("shim.sock"));
        }
        let child = command
            .arg("--prometheus")
            .arg(format!("127.0.0.1:{prometheus_port}"))
            .env("INFERSCOPE_LOG", "info")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("creating the agent log"))
            .spawn()
            .expect("starting inferscope run");
        Daemon {
            child,
            log,
            socket,
            prometheus_port,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_attached(&mut self, pid: u32, timeout: Duration) {
        crate::agent::wait_attached(&mut self.child, &self.log, pid, timeout);
    }

    /// Resident memory of the agent, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Runs an `inferscope` client subcommand against this agent.
    pub fn client(&self, args: &[&str]) -> Output {
        let connect = format!("unix://{}", self.socket.display());
        Command::new(binary())
            .args(args)
            .arg("--connect")
            .arg(&connect)
            .output()
            .expect("running an inferscope client command")
    }

    /// The /metrics text, in the classic Prometheus format.
    pub fn scrape(&self) -> String {
        crate::http_get(self.prometheus_port, "/metrics")
    }

    pub fn stop(mut self) -> String {
        crate::agent::unsafe_sigint(self.child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return self.log_text();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        panic!(
            "inferscope run did not stop on SIGINT:\n{}",
            self.log_text()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
