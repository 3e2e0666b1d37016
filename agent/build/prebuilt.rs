//! The eBPF objects shipped in ebpf/prebuilt, used where the eBPF toolchain is absent (a first
//! `scripts/demo.sh`), and only while their manifest matches the sources: a changed, added or
//! removed source file, or a crate of the eBPF build at another version in Cargo.lock, fails the
//! build with the file's name and the command that rebuilds them. scripts/ebpf-prebuilt.sh writes
//! the objects and the manifest; CI (`scripts/ebpf-prebuilt.sh --check`) builds them afresh and
//! compares byte for byte.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

/// One build of the programs: where the agent embeds it, and its file in ebpf/prebuilt.
pub(crate) struct Variant {
    /// Under OUT_DIR (the agent's `include_bytes_aligned!` reads `<this>/inferscope`).
    pub(crate) out_subdir: &'static str,
    pub(crate) features: &'static [&'static str],
    /// For messages: "for kernels before 5.17 " or "".
    pub(crate) which: &'static str,
    /// In ebpf/prebuilt.
    pub(crate) file: &'static str,
}

/// The legacy build first, as the build has always done (the order does not change the objects).
pub(crate) const VARIANTS: [Variant; 2] = [
    Variant {
        out_subdir: "legacy",
        features: &["legacy"],
        which: "for kernels before 5.17 ",
        file: "inferscope-legacy.bpf.o",
    },
    Variant {
        out_subdir: "",
        features: &[],
        which: "",
        file: "inferscope.bpf.o",
    },
];

/// The directories whose files the objects are built from (besides the crates in Cargo.lock).
const SOURCE_DIRS: [&str; 2] = ["ebpf/common", "ebpf/probes"];
const PREBUILT_DIR: &str = "ebpf/prebuilt";
const REBUILD: &str = "scripts/ebpf-prebuilt.sh";

/// Checks ebpf/prebuilt against the sources, then copies its objects where the agent embeds them.
pub(crate) fn install(repo: &Path, out_dir: &Path, asked: bool) -> anyhow::Result<()> {
    for dir in SOURCE_DIRS.iter().chain([&PREBUILT_DIR]) {
        println!("cargo:rerun-if-changed={}", repo.join(dir).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        repo.join("Cargo.lock").display()
    );
    let why = if asked {
        "INFERSCOPE_EBPF=prebuilt"
    } else {
        "bpf-linker is not on PATH, so the build takes the objects in ebpf/prebuilt"
    };
    let stale = check(repo).with_context(|| format!("checking {PREBUILT_DIR} ({why})"))?;
    if !stale.is_empty() {
        let shown: Vec<&str> = stale.iter().take(5).map(String::as_str).collect();
        let more = match stale.len() - shown.len() {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        bail!(
            "the eBPF objects in {PREBUILT_DIR} were built from other sources ({}{more}), and \
             {why}. Either install the eBPF toolchain (scripts/setup.sh ebpf: bpf-linker and the \
             core library's source) and build again, which compiles the programs here, or \
             rebuild the shipped objects with {REBUILD} on a machine that has it",
            shown.join("; ")
        );
    }
    for variant in VARIANTS {
        let from = repo.join(PREBUILT_DIR).join(variant.file);
        let dir = out_dir.join(variant.out_subdir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let to = dir.join("inferscope");
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// What differs between the manifest and the checkout, one phrase each; empty when they match.
fn check(repo: &Path) -> anyhow::Result<Vec<String>> {
    let manifest_path = repo.join(PREBUILT_DIR).join("MANIFEST");
    let text = std::fs::read_to_string(&manifest_path).with_context(|| {
        format!(
            "reading {} (written by {REBUILD}; a checkout without it needs the eBPF toolchain: \
             scripts/setup.sh ebpf)",
            manifest_path.display()
        )
    })?;
    let manifest = Manifest::parse(&text)
        .with_context(|| format!("{} is malformed", manifest_path.display()))?;
    let lock_path = repo.join("Cargo.lock");
    let lock = std::fs::read_to_string(&lock_path)
        .with_context(|| format!("reading {}", lock_path.display()))?;

    let mut stale = Vec::new();
    let mut current = BTreeMap::new();
    for dir in SOURCE_DIRS {
        source_files(repo, Path::new(dir), &mut current)?;
    }
    for (path, digest) in &current {
        match manifest.files.get(path) {
            None => stale.push(format!("{path} is new")),
            Some(shipped) if shipped != digest => stale.push(format!("{path} changed")),
            Some(_) => {}
        }
    }
    for path in manifest.files.keys() {
        if SOURCE_DIRS.iter().any(|d| in_dir(path, d)) && !current.contains_key(path) {
            stale.push(format!("{path} was removed"));
        }
    }
    for (name, version) in &manifest.crates {
        if !lock_has(&lock, name, version) {
            stale.push(format!("Cargo.lock no longer has {name} {version}"));
        }
    }
    for variant in VARIANTS {
        let path = format!("{PREBUILT_DIR}/{}", variant.file);
        let Some(shipped) = manifest.files.get(&path) else {
            bail!("it lists no {path}");
        };
        let digest = sha256_file(&repo.join(&path))?;
        if &digest != shipped {
            stale.push(format!("{path} is not the object the manifest names"));
        }
    }
    Ok(stale)
}

/// ebpf/prebuilt/MANIFEST: `# comment`, `<sha256>  <path from the repository root>` (sha256sum's
/// format, so `sha256sum -c` reads those lines too) and `crate <name> <version>` (the crates of
/// the eBPF build, as Cargo.lock resolved them).
struct Manifest {
    files: BTreeMap<String, String>,
    crates: Vec<(String, String)>,
}

impl Manifest {
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut files = BTreeMap::new();
        let mut crates = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some("crate"), Some(name), Some(version), None) => {
                    crates.push((name.to_owned(), version.to_owned()));
                }
                (Some(digest), Some(path), None, None)
                    if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) =>
                {
                    files.insert(path.to_owned(), digest.to_ascii_lowercase());
                }
                _ => bail!(
                    "line {} is not `<sha256>  <path>` or `crate <name> <version>`: {line}",
                    n + 1
                ),
            }
        }
        Ok(Self { files, crates })
    }
}

/// Every file under `dir` (relative to `repo`), skipping `target` directories and dot-files (as
/// scripts/ebpf-prebuilt.sh's `find` does), keyed by its path with `/` separators.
fn source_files(repo: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> anyhow::Result<()> {
    let full = repo.join(dir);
    let entries =
        std::fs::read_dir(&full).with_context(|| format!("listing {}", full.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", full.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            bail!("{} has a name that is not UTF-8", entry.path().display());
        };
        if name.starts_with('.') || name == "target" {
            continue;
        }
        let relative: PathBuf = dir.join(name);
        let kind = entry
            .file_type()
            .with_context(|| format!("reading {}", entry.path().display()))?;
        if kind.is_dir() {
            source_files(repo, &relative, out)?;
        } else if kind.is_file() {
            let key = relative
                .to_str()
                .context("a source path is not UTF-8")?
                .to_owned();
            out.insert(key, sha256_file(&entry.path())?);
        }
    }
    Ok(())
}

fn in_dir(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether Cargo.lock has the package at that version (`name = "…"` then `version = "…"`).
fn lock_has(lock: &str, name: &str, version: &str) -> bool {
    let name_line = format!("name = \"{name}\"");
    let version_line = format!("version = \"{version}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == name_line && lines.next() == Some(version_line.as_str()) {
            return true;
        }
    }
    false
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hex = String::with_capacity(64);
    for byte in Sha256::digest(&bytes) {
        let _ = write!(hex, "{byte:02x}");
    }
    Ok(hex)
}
