use anyhow::Context as _;
use aya_build::{Package, Toolchain};

/// Compiles the eBPF programs (ebpf/probes) for the bpf target and embeds them in the agent.
///
/// Toolchain: `INFERSCOPE_BPF_TOOLCHAIN` names the rustup toolchain that has the core library
/// source (default `bpf`, which scripts/setup.sh links to Debian's rustc + rust-src). Building
/// core for the bpf target needs `-Z build-std`, hence RUSTC_BOOTSTRAP for that child build.
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
    println!("cargo:rerun-if-env-changed=INFERSCOPE_BPF_TOOLCHAIN");
    let toolchain = std::env::var("INFERSCOPE_BPF_TOOLCHAIN").unwrap_or_else(|_| "bpf".into());
    if std::env::var_os("RUSTC_BOOTSTRAP").is_none() {
        // SAFETY: build scripts are single-threaded.
        unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf/probes");
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").context("OUT_DIR unset")?);
    // The programs for kernels without bpf_loop (before 5.17) into OUT_DIR/legacy, then those for
    // every newer kernel into OUT_DIR; aya-build keeps its cargo target directory under the
    // OUT_DIR it is given, so each build stays cached. The agent loads the one the kernel takes.
    for (dir, features, which) in [
        (
            out_dir.join("legacy"),
            &["legacy"][..],
            "for kernels before 5.17 ",
        ),
        (out_dir.clone(), &[][..], ""),
    ] {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // SAFETY: build scripts are single-threaded; aya-build reads OUT_DIR for where to build.
        unsafe { std::env::set_var("OUT_DIR", &dir) };
        aya_build::build_ebpf(
            [Package {
                name: "inferscope-ebpf",
                root_dir: root,
                features,
                ..Default::default()
            }],
            Toolchain::Custom(&toolchain),
        )
        .with_context(|| {
            format!(
                "building the eBPF programs {which}failed; run scripts/setup.sh (bpf-linker, rust-src)"
            )
        })?;
    }
    Ok(())
}
