//! The version of a Python engine a process runs, from its installed package: the
//! `site-packages` its mapped Python extensions come from (/proc/PID/maps), read through
//! /proc/PID/root (containers), and the `<package>-<version>.dist-info/METADATA` there. Known at
//! discovery, before any IPC, so an engine's IPC layout is pinned even when its start-up
//! handshake was missed.
use std::{
    fs,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
};

/// Lines of /proc/PID/maps read at most (a Python process with torch maps a few thousand).
const MAX_MAPS_LINES: usize = 100_000;
/// Bytes of METADATA read at most: the version is in its first lines.
const MAX_METADATA: u64 = 64 * 1024;
/// Distinct site-packages directories tried per process.
const MAX_SITES: usize = 8;

/// The `…/site-packages` (or Debian's `dist-packages`) directory a mapped file lives under.
fn site_packages_of(path: &str) -> Option<&str> {
    ["/site-packages/", "/dist-packages/"]
        .iter()
        .filter_map(|dir| path.find(dir).map(|i| &path[..i + dir.len() - 1]))
        .min_by_key(|p| p.len())
}

/// `Version:` of a dist-info METADATA file (its header ends at the first empty line).
fn metadata_version(metadata: &str) -> Option<&str> {
    metadata
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Version:"))
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 64)
}

/// The version of `package` installed in `site_packages` (a path as the process sees it, read
/// under `root`).
pub(crate) fn version_in(root: &Path, site_packages: &str, package: &str) -> Option<String> {
    let dir = root.join(site_packages.trim_start_matches('/'));
    let prefix = format!("{package}-");
    let entry = fs::read_dir(&dir).ok()?.flatten().find(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with(&prefix) && name.ends_with(".dist-info")
    })?;
    let mut text = String::new();
    fs::File::open(entry.path().join("METADATA"))
        .ok()?
        .take(MAX_METADATA)
        .read_to_string(&mut text)
        .ok()?;
    metadata_version(&text).map(str::to_owned)
}

/// The version of `package` (its dist-info name, e.g. `vllm`) process `tgid` runs, if its
/// package metadata can be found.
pub(super) fn process_version(tgid: u32, package: &str) -> Option<String> {
    let proc = PathBuf::from(format!("/proc/{tgid}"));
    let maps = fs::File::open(proc.join("maps")).ok()?;
    let mut tried: Vec<String> = Vec::new();
    for line in BufReader::new(maps).lines().take(MAX_MAPS_LINES) {
        let Ok(line) = line else { break };
        let Some(site) = line.split_whitespace().nth(5).and_then(site_packages_of) else {
            continue;
        };
        if tried.iter().any(|t| t == site) {
            continue;
        }
        if let Some(v) = version_in(&proc.join("root"), site, package) {
            return Some(v);
        }
        tried.push(site.to_owned());
        if tried.len() >= MAX_SITES {
            break;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_site_packages_of_a_mapped_extension() {
        assert_eq!(
            site_packages_of("/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"),
            Some("/venv/lib/python3.11/site-packages")
        );
        assert_eq!(
            site_packages_of("/usr/lib/python3/dist-packages/zmq/backend.so"),
            Some("/usr/lib/python3/dist-packages")
        );
        assert_eq!(site_packages_of("/usr/lib/libc.so.6"), None);
        let meta = "Metadata-Version: 2.4\nName: vllm\nVersion: 0.33.0\n\nVersion: 9\n";
        assert_eq!(metadata_version(meta), Some("0.33.0"));
        assert_eq!(metadata_version("Name: vllm\n"), None);
    }

    #[test]
    fn reads_each_packages_version_from_its_own_dist_info() {
        let root = std::env::temp_dir().join(format!("inferscope-pkg-{}", std::process::id()));
        let site = "venv/lib/python3.11/site-packages";
        for (package, version) in [("vllm", "0.33.0"), ("sglang", "0.5.23")] {
            let dist = root
                .join(site)
                .join(format!("{package}-{version}.dist-info"));
            fs::create_dir_all(&dist).unwrap();
            fs::write(
                dist.join("METADATA"),
                format!("Name: {package}\nVersion: {version}\n\nVersion: 9\n"),
            )
            .unwrap();
        }
        let seen_as = "/venv/lib/python3.11/site-packages";
        assert_eq!(
            version_in(&root, seen_as, "vllm").as_deref(),
            Some("0.33.0")
        );
        assert_eq!(
            version_in(&root, seen_as, "sglang").as_deref(),
            Some("0.5.23")
        );
        assert_eq!(version_in(&root, seen_as, "tensorrt_llm"), None);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn this_process_runs_no_engine_package() {
        assert_eq!(process_version(std::process::id(), "sglang"), None);
    }
}
