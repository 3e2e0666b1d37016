//! The mock CUDA stack (tests/mock-cuda: libcuda.so.1, libcudart.so.12, libcupti.so and mock
//! engines), compiled once per test process with the system C compiler, plus the shim library to
//! inject into it.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::OnceLock,
};

fn source_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mock-cuda")
}

fn cc(args: &[&str]) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cc} (the mock CUDA stack is C): {e}"));
    assert!(
        out.status.success(),
        "{cc} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dir/name` → `target` (a relative symbolic link, as library installs make them).
fn link(dir: &Path, target: &str, name: &str) {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    std::os::unix::fs::symlink(target, &path)
        .unwrap_or_else(|e| panic!("linking {} to {target}: {e}", path.display()));
}

/// Directory holding libcuda.so(.1), libcudart.so(.12), libcupti.so and the mock engines,
/// built on first use.
pub fn mock_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("inferscope-mock-cuda-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the mock CUDA directory");
        let src = source_dir();
        let s = |f: &str| src.join(f).to_string_lossy().into_owned();
        let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let inc = format!("-I{}", src.display());
        let lib = format!("-L{}", dir.display());
        let flags = ["-O2", "-Wall", "-Wextra", "-Werror"];
        // The driver as installed: libcuda.so.1 (soname), libcuda.so a link to it;
        // unversioned symbols, as the real one exports them.
        let mut a: Vec<&str> = flags.to_vec();
        let (cuda_c, cuda_so) = (s("cuda.c"), d("libcuda.so.1"));
        a.extend([
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            &inc,
            "-o",
            &cuda_so,
            &cuda_c,
            "-ldl",
            "-lpthread",
        ]);
        cc(&a);
        link(&dir, "libcuda.so.1", "libcuda.so");
        // The runtime: libcudart.so.12, every symbol under the version node libcudart.so.12
        // (as `nm -D` shows the real one's: cudaLaunchKernel@@libcudart.so.12).
        let mut a: Vec<&str> = flags.to_vec();
        let (cudart_c, cudart_so) = (s("cudart.c"), d("libcudart.so.12"));
        let version_script = format!("-Wl,--version-script={}", s("cudart.map"));
        a.extend([
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcudart.so.12",
            &version_script,
            "-o",
            &cudart_so,
            &cudart_c,
            &lib,
            "-lcuda",
            "-ldl",
        ]);
        cc(&a);
        link(&dir, "libcudart.so.12", "libcudart.so");
        let mut a: Vec<&str> = flags.to_vec();
        let (cupti_c, cupti_so) = (s("cupti.c"), d("libcupti.so"));
        a.extend([
            "-shared",
            "-fPIC",
            &inc,
            "-o",
            &cupti_so,
            &cupti_c,
            &lib,
            "-lcuda",
            "-lpthread",
        ]);
        cc(&a);
        let mut a: Vec<&str> = flags.to_vec();
        let (engine_c, engine) = (s("engine.c"), d("engine"));
        a.extend([
            &inc,
            "-o",
            &engine,
            &engine_c,
            &lib,
            "-lcudart",
            "-lcuda",
            "-lpthread",
            "-ldl",
        ]);
        cc(&a);
        let mut a: Vec<&str> = flags.to_vec();
        let (llama_c, llama_so) = (s("llama.c"), d("libllama.so"));
        a.extend(["-shared", "-fPIC", "-o", &llama_so, &llama_c]);
        cc(&a);
        let mut a: Vec<&str> = flags.to_vec();
        let (launcher_c, launcher) = (s("launcher.c"), d("launcher"));
        // -rdynamic: the runtime launch's host stub is an exported symbol, as nvcc's are.
        a.extend([
            "-rdynamic",
            "-o",
            &launcher,
            &launcher_c,
            &lib,
            "-lcudart",
            "-lcuda",
            "-lllama",
            "-lpthread",
            "-ldl",
        ]);
        cc(&a);
        let mut a: Vec<&str> = flags.to_vec();
        let (late_c, late) = (s("late.c"), d("late"));
        a.extend(["-o", &late, &late_c, "-ldl"]);
        cc(&a);
        dir
    })
}

/// Starts the mock process that dlopens libcuda only once `go_file` exists, then launches every
/// 10 ms until `stop_file` exists; returns it once it is running (without CUDA mapped).
pub fn start_late_loader(go_file: &Path, stop_file: &Path) -> std::process::Child {
    use std::io::BufRead;
    let dir = mock_dir();
    let mut child = Command::new(dir.join("late"))
        .arg(go_file)
        .arg(stop_file)
        .env("LD_LIBRARY_PATH", dir)
        .env_remove("CUDA_INJECTION64_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the mock late loader");
    let stdout = child.stdout.as_mut().expect("the late loader's stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reading the late loader's ready line");
    assert!(line.contains("\"ready\":true"), "late loader said {line:?}");
    child
}

/// Starts the launch-uprobe mock engine (`launcher GO_FILE STEPS PRE_US`) with no injection and
/// no CUDA environment variable; returns it once it printed that its early work is done.
pub fn start_launcher(go_file: &Path, steps: u32, pre_us: u32) -> std::process::Child {
    use std::io::BufRead;
    let dir = mock_dir();
    let mut child = Command::new(dir.join("launcher"))
        .arg(go_file)
        .arg(steps.to_string())
        .arg(pre_us.to_string())
        .env("LD_LIBRARY_PATH", dir)
        .env_remove("CUDA_INJECTION64_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the mock launcher");
    let stdout = child.stdout.as_mut().expect("the launcher's stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reading the launcher's ready line");
    assert!(line.contains("\"ready\":true"), "launcher said {line:?}");
    child
}

/// `libinferscope_cupti.so`: INFERSCOPE_SHIM_LIB, else next to the agent binary, else target/.
pub fn shim_library() -> PathBuf {
    if let Some(p) = std::env::var_os("INFERSCOPE_SHIM_LIB") {
        return PathBuf::from(p);
    }
    let name = "libinferscope_cupti.so";
    if let Some(p) = crate::agent::binary().parent().map(|d| d.join(name))
        && p.exists()
    {
        return p;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for profile in ["release", "debug"] {
        let p = root.join("target").join(profile).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} not built: run `cargo build -p inferscope-cupti` or set INFERSCOPE_SHIM_LIB");
}

/// Runs the mock engine with the shim injected the way the driver expects
/// (`CUDA_INJECTION64_PATH`), the mock libraries first on the search path, and `env` on top.
pub fn run_engine(args: &[&str], socket: &Path, env: &[(&str, &str)]) -> Output {
    run_engine_with_shim(&shim_library(), args, socket, env)
}

/// [`run_engine`] with another copy of the shim (e.g. the one an image installed).
pub fn run_engine_with_shim(
    shim: &Path,
    args: &[&str],
    socket: &Path,
    env: &[(&str, &str)],
) -> Output {
    let dir = mock_dir();
    let mut cmd = Command::new(dir.join("engine"));
    cmd.args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("CUDA_INJECTION64_PATH", shim)
        .env("INFERSCOPE_SHIM_SOCKET", socket)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running the mock engine")
}
