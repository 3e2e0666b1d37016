use which::which;

/// bpf-linker is a runtime dependency of the bpf target's link step; rebuild when it changes.
fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
