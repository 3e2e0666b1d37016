//! Public-API snapshots, as aya keeps them: `xtask/public-api/CRATE.txt` lists every public item
//! of a library crate, one per line, as the `public-api` crate renders it from rustdoc's JSON.
//! The agent, the fuzz targets and the integration tests build on `inferscope-model` and
//! `inferscope-decode`; a change to what those export is a change to every stage's contract, so
//! CI fails until the snapshot is updated with the change and a reviewer sees both together.

use std::{
    collections::HashMap,
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

/// The crates whose API is kept: the two that every stage builds on (issue #48). Not the agent,
/// whose library serves its own binary and tests, nor inferscope-proto, code generated from the
/// .proto files that are its contract.
const CRATES: &[&str] = &["inferscope-model", "inferscope-decode"];

/// A nightly whose rustdoc writes the JSON format public-api 0.52.1 reads (format 57): the one
/// this project's machines carry as their `nightly` (rustc 1.97.0-nightly e50aa6fba).
/// scripts/setup.sh installs it under this name where `nightly` is another and rustup can
/// download; the xtask then prefers it.
const PINNED_NIGHTLY: &str = "nightly-2026-05-20";

const UPDATE: &str = "cargo xtask public-api --bless";

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Rewrite the snapshots from the current API instead of checking against them.
    #[arg(long)]
    bless: bool,
    /// The toolchain whose rustdoc writes the JSON [default: the pinned nightly when rustup
    /// has it, else `nightly`]
    #[arg(long, env = "PUBLIC_API_TOOLCHAIN")]
    toolchain: Option<String>,
}

pub(crate) fn run(options: &Options) -> Result<()> {
    // The xtask always lives one level below the workspace root.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask's manifest directory has no parent")?;
    let toolchain = match &options.toolchain {
        Some(toolchain) => toolchain.clone(),
        None => default_toolchain()?,
    };
    let mut changed = Vec::new();
    for &krate in CRATES {
        let api = current_api(root, &toolchain, krate)?;
        let items = api.lines().count();
        let path = snapshot_path(root, krate);
        let shown = path.strip_prefix(root).unwrap_or(&path).display();
        if options.bless {
            fs::write(&path, &api).with_context(|| format!("cannot write {shown}"))?;
            println!("{krate}: {items} items written to {shown}");
            continue;
        }
        let snapshot = match fs::read_to_string(&path) {
            Ok(snapshot) => snapshot,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                bail!("{krate} has no snapshot ({shown}): run `{UPDATE}` to write it")
            }
            Err(err) => return Err(err).with_context(|| format!("cannot read {shown}")),
        };
        let diff = line_diff(&snapshot, &api);
        if diff.is_empty() {
            println!("{krate}: public API unchanged ({items} items, {shown})");
        } else {
            eprintln!(
                "the public API of {krate} changed (+ added, - removed, against {shown}):\n{diff}\
                 review the change and run `{UPDATE}` to update the snapshot\n"
            );
            changed.push(krate);
        }
    }
    if !changed.is_empty() {
        bail!(
            "the public API of {} changed; review the lines above and run `{UPDATE}` to update \
             the snapshot (commit xtask/public-api/ with the change)",
            changed.join(" and ")
        );
    }
    Ok(())
}

fn snapshot_path(root: &Path, krate: &str) -> PathBuf {
    root.join("xtask")
        .join("public-api")
        .join(krate)
        .with_extension("txt")
}

/// The pinned nightly when rustup has it, else whatever `nightly` is (its JSON format is checked).
fn default_toolchain() -> Result<String> {
    let output = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .context(
            "cannot run `rustup toolchain list`: the snapshots need rustup's nightly rustdoc",
        )?;
    let pinned = String::from_utf8_lossy(&output.stdout).lines().any(|line| {
        line.strip_prefix(PINNED_NIGHTLY)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ' ']))
    });
    Ok(if pinned { PINNED_NIGHTLY } else { "nightly" }.to_owned())
}

/// The crate's public API as public-api renders it, one item per line, sorted.
fn current_api(root: &Path, toolchain: &str, krate: &str) -> Result<String> {
    // A target directory of its own: the nightly's artifacts share nothing with the stable
    // build, and a `cargo doc` in target/ would overwrite the JSON's folder.
    let target_dir = root.join("target").join("public-api");
    // `rustup run` rather than `cargo +TOOLCHAIN`: under `cargo xtask`, PATH may lead to the
    // stable toolchain's own cargo, which takes no `+`; rustup also points the rustdoc that
    // cargo runs at the same toolchain.
    let output = Command::new("rustup")
        .args(["run", toolchain, "cargo", "rustdoc", "--quiet", "--lib"])
        // Everything any dependent can switch on (decode's test-support builders too).
        .args(["--all-features", "--package", krate])
        .arg("--target-dir")
        .arg(&target_dir)
        // Only rustdoc reads these artifacts: no debug info, no incremental cache (disk).
        .args(["--config", "profile.dev.debug=false"])
        .env("CARGO_INCREMENTAL", "0")
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        .current_dir(root)
        .output()
        .with_context(|| format!("cannot run `rustup run {toolchain} cargo rustdoc`"))?;
    if !output.status.success() {
        bail!(
            "`rustup run {toolchain} cargo rustdoc -p {krate}` failed ({}): fix the error below, \
             or name a nightly with --toolchain (PUBLIC_API_TOOLCHAIN)\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let json = target_dir
        .join("doc")
        .join(krate.replace('-', "_"))
        .with_extension("json");
    check_format(&json, toolchain)?;
    let api = public_api::Builder::from_rustdoc_json(&json)
        // `impl<T> From<T> for T`, `Any`, `Borrow`, ... for every type: implied by the other
        // lines, three times their number, and they change with the nightly's std, not with us.
        .omit_blanket_impls(true)
        .build()
        .with_context(|| format!("public-api cannot read {}", json.display()))?;
    Ok(api.to_string())
}

/// public-api reads one rustdoc JSON format, and a different one may still deserialize into
/// wrong items: refuse it with what to do instead.
fn check_format(json: &Path, toolchain: &str) -> Result<()> {
    #[derive(Deserialize)]
    struct Header {
        format_version: u32,
    }
    let bytes = fs::read(json).with_context(|| format!("cannot read {}", json.display()))?;
    let header: Header = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} has no rustdoc format_version", json.display()))?;
    if header.format_version != rustdoc_types::FORMAT_VERSION {
        bail!(
            "`{toolchain}`'s rustdoc writes JSON format {}, but xtask's public-api reads format \
             {} only: install {PINNED_NIGHTLY} (scripts/setup.sh test), or move public-api and \
             rustdoc-types in xtask/Cargo.toml to releases for format {} and run `{UPDATE}`",
            header.format_version,
            rustdoc_types::FORMAT_VERSION,
            header.format_version
        );
    }
    Ok(())
}

/// Lines removed from the snapshot ("-") and added to it ("+"). Each line names an item by its
/// full path, so which lines came and went is the whole change; no ordered diff is needed.
fn line_diff(snapshot: &str, current: &str) -> String {
    // Per line: how many more times the current API has it than the snapshot.
    let mut surplus: HashMap<&str, isize> = HashMap::new();
    for line in current.lines() {
        *surplus.entry(line).or_default() += 1;
    }
    for line in snapshot.lines() {
        *surplus.entry(line).or_default() -= 1;
    }
    let mut diff = String::new();
    for line in snapshot.lines() {
        let surplus = surplus.entry(line).or_default();
        if *surplus < 0 {
            *surplus += 1;
            diff.push_str(&format!("-{line}\n"));
        }
    }
    for line in current.lines() {
        let surplus = surplus.entry(line).or_default();
        if *surplus > 0 {
            *surplus -= 1;
            diff.push_str(&format!("+{line}\n"));
        }
    }
    diff
}

#[cfg(test)]
mod tests;
