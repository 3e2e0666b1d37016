use std::path::{Path, PathBuf};

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

#[path = "build/prebuilt.rs"]
mod prebuilt;

/// Puts the eBPF programs (ebpf/probes) where the agent embeds them: OUT_DIR/inferscope (for
/// kernels with bpf_loop) and OUT_DIR/legacy/inferscope (for kernels before 5.17).
///
/// `INFERSCOPE_EBPF` says where they come from:
/// - `build`: compiled here (bpf-linker, and a toolchain with the core library's source).
/// - `prebuilt`: the objects shipped in ebpf/prebuilt, checked against their manifest first: a
///   source changed since they were built fails the build, naming the file.
/// - unset or `auto`: `build` where bpf-linker is on PATH, else `prebuilt`.
///
/// Toolchain for `build`: `INFERSCOPE_BPF_TOOLCHAIN` names the rustup toolchain that has the core
/// library source (default `bpf`, which scripts/setup.sh links to Debian's rustc + rust-src).
/// Building core for the bpf target needs `-Z build-std`, hence RUSTC_BOOTSTRAP for that child
/// build.
fn main() -> anyhow::Result<()> {
    // The engine uprobes read x86-64 registers (the stack pointer `rsp`, the System V argument
    // registers): on another architecture they would read the wrong values, so refuse to build.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" {
        anyhow::bail!(
            "inferscope supports x86_64 only (target architecture here: {arch}): its engine \
             uprobes read x86-64 registers (rsp and the System V argument registers)"
        );
    }
    println!("cargo:rerun-if-env-changed=INFERSCOPE_EBPF");
    println!("cargo:rerun-if-env-changed=INFERSCOPE_BPF_TOOLCHAIN");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the agent's manifest directory has no parent")?
        .to_path_buf();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").context("OUT_DIR unset")?);
    let mode = std::env::var("INFERSCOPE_EBPF").unwrap_or_default();
    let build = match mode.as_str() {
        "build" => true,
        "prebuilt" => false,
        "" | "auto" => which::which("bpf-linker").is_ok(),
        other => anyhow::bail!(
            "INFERSCOPE_EBPF={other} is not a mode: use build (compile the eBPF programs here), \
             prebuilt (use ebpf/prebuilt) or auto (build where bpf-linker is on PATH)"
        ),
    };
    if build {
        build_ebpf(&repo, &out_dir)
    } else {
        prebuilt::install(&repo, &out_dir, mode == "prebuilt")
    }
}

/// Compiles both builds of the programs with aya-build.
fn build_ebpf(repo: &Path, out_dir: &Path) -> anyhow::Result<()> {
    let toolchain = std::env::var("INFERSCOPE_BPF_TOOLCHAIN").unwrap_or_else(|_| "bpf".into());
    let root = repo.join("ebpf/probes");
    let root = root
        .to_str()
        .context("the repository's path is not UTF-8")?;
    // What the child cargo that aya-build starts inherits:
    // - RUSTC_BOOTSTRAP: `-Z build-std=core` (and trim-paths) on a stable toolchain.
    // - trim-paths: the same object from any checkout, user and target directory (ebpf/prebuilt
    //   is compared byte for byte with a fresh build), as paths in the debug info and the BTF
    //   become relative to the workspace or the crate.
    // - CARGO_TERM_QUIET: aya-build turns every line the child cargo prints into a
    //   `cargo:warning`, which cargo shows as `warning: inferscope@0.1.0: Compiling …`; quiet,
    //   only the compiler's own diagnostics and errors remain.
    let mut child_env = vec![
        ("CARGO_UNSTABLE_TRIM_PATHS", "true"),
        ("CARGO_PROFILE_RELEASE_TRIM_PATHS", "all"),
        ("CARGO_TERM_QUIET", "true"),
    ];
    if std::env::var_os("RUSTC_BOOTSTRAP").is_none() {
        child_env.push(("RUSTC_BOOTSTRAP", "1"));
    }
    for (key, value) in child_env {
        // SAFETY: build scripts are single-threaded: no other thread reads the environment.
        unsafe { std::env::set_var(key, value) };
    }
    // The programs for kernels without bpf_loop (before 5.17) into OUT_DIR/legacy, then those for
    // every newer kernel into OUT_DIR; aya-build keeps its cargo target directory under the
    // OUT_DIR it is given, so each build stays cached. The agent loads the one the kernel takes.
    for variant in prebuilt::VARIANTS {
        let dir = out_dir.join(variant.out_subdir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // SAFETY: build scripts are single-threaded; aya-build reads OUT_DIR for where to build.
        unsafe { std::env::set_var("OUT_DIR", &dir) };
        aya_build::build_ebpf(
            [Package {
                name: "inferscope-ebpf",
                root_dir: root,
                features: variant.features,
                ..Default::default()
            }],
            Toolchain::Custom(&toolchain),
        )
        .with_context(|| {
            format!(
                "building the eBPF programs {}failed; run scripts/setup.sh ebpf (bpf-linker, the \
                 core library's source), or build with INFERSCOPE_EBPF=prebuilt to use the \
                 objects in ebpf/prebuilt",
                variant.which
            )
        })?;
    }
    Ok(())
}
