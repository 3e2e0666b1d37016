//! The tiny native engine of tests/native-engine (C, compiled once per test process with the
//! system C compiler): a stand-in for an engine inferscope ships no profile for, hooked through a
//! user-written probe spec.
use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

fn compile(args: &[&str], out: &Path, src: &str) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(src);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let done = Command::new(&cc)
        .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"])
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {cc} (the native test engine is C): {e}"));
    assert!(
        done.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&done.stderr)
    );
}

fn build_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("inferscope-native-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the native engine directory");
    dir
}

/// The engine's late-loaded library (`plugin_first_token`).
pub fn plugin() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = build_dir().join("libengine_plugin.so");
        compile(&["-shared", "-fPIC"], &lib, "native-engine/plugin.c");
        lib
    })
}

/// The compiled engine binary.
pub fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = build_dir().join("native-engine");
        compile(&["-pthread"], &bin, "native-engine/engine.c");
        bin
    })
}

pub struct NativeEngine {
    child: Child,
}

impl NativeEngine {
    /// Starts the engine on `port` and waits until it accepts connections.
    pub fn start(port: u16) -> NativeEngine {
        Self::start_with(port, None)
    }

    /// The same, loading `plugin` once the first request is done.
    pub fn start_with(port: u16, plugin: Option<&Path>) -> NativeEngine {
        let child = Command::new(binary())
            .arg(port.to_string())
            .args(plugin)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the native engine");
        let mut engine = NativeEngine { child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(engine.is_running(), "the native engine exited at start");
            assert!(
                Instant::now() < deadline,
                "the native engine did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        engine
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for NativeEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
