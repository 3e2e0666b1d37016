//! The real engine: llama.cpp's server from PyPI xllamacpp, through the project's launcher.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
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
        let child = Command::new(python())
            .arg(repo_root().join("tests/engine/llamacpp_server.py"))
            .args(["--port", &port.to_string(), "--slots", &slots.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the engine launcher (run scripts/setup.sh for .venv)");
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

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
