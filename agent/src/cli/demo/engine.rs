//! Starts the bundled engine: llama.cpp's server from PyPI xllamacpp, through the project's
//! launcher script (embedded here so the binary works from any directory).
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

const LAUNCHER: &str = include_str!("../../../../tests/engine/llamacpp_server.py");

/// What the demo polls until the model is loaded (llama.cpp answers 503 until then): the agent
/// records these requests too, and the demo keeps them out of its table.
pub(super) const HEALTH_PATH: &str = "/health";

pub(super) struct Engine {
    child: Child,
    pub port: u16,
    _launcher: tempfile::TempPath,
}

/// The Python that has xllamacpp: --python, $INFERSCOPE_PYTHON, ./.venv, or the repo's .venv.
pub(super) fn find_python(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("INFERSCOPE_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    let candidates = [
        PathBuf::from(".venv/bin/python3"),
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python3")),
    ];
    candidates
        .into_iter()
        .find(|p| p.exists())
        .context("no Python with xllamacpp found: run scripts/setup.sh, or pass --python")
}

impl Engine {
    pub(super) fn start(python: &Path, port: u16, slots: u32) -> anyhow::Result<Self> {
        let mut launcher = tempfile::Builder::new()
            .prefix("inferscope-llamacpp-")
            .suffix(".py")
            .tempfile()
            .context("cannot write the engine launcher")?;
        launcher.write_all(LAUNCHER.as_bytes())?;
        let launcher = launcher.into_temp_path();
        let child = Command::new(python)
            .arg(&launcher)
            .args(["--port", &port.to_string(), "--slots", &slots.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", python.display()))?;
        Ok(Self {
            child,
            port,
            _launcher: launcher,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until /health answers 200 (the model is loaded).
    pub(super) fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the engine exited during start-up ({status}); run its launcher by hand to see why"
                );
            }
            if health_ok(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("the engine did not become ready within {timeout:?}")
    }
}

fn health_ok(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request =
        format!("GET {HEALTH_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SIGTERM first so the launcher exits cleanly, then make sure.
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
