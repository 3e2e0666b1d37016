//! The vLLM version a process runs, from its installed package: the `site-packages` its
//! mapped Python extensions come from (/proc/PID/maps), through /proc/PID/root (containers),
//! and the `vllm-<version>.dist-info/METADATA` there. Known at discovery, before any IPC, so the
//! layout is pinned even when the engine's start-up handshake was missed.
use std::{
    fs,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
};

/// Lines of /proc/PID/maps read at most (a Python process with torch maps a few thousand).
const MAX_MAPS_LINES: usize = 100_000;
/// Bytes of METADATA read at most: the version is in its first lines.
const MAX_METADATA: u64 = 64 * 1024;

/// The `…/site-packages` (or Debian's `dist-packages`) directory a mapped file lives under.
pub fn site_packages_of(path: &str) -> Option<&str> {
    ["/site-packages/", "/dist-packages/"]
        .iter()
        .filter_map(|dir| path.find(dir).map(|i| &path[..i + dir.len() - 1]))
        .min_by_key(|p| p.len())
}

/// `Version:` of a dist-info METADATA file.
pub fn metadata_version(metadata: &str) -> Option<&str> {
    metadata
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Version:"))
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 64)
}

/// The vllm version installed in `site_packages` (a path as the process sees it, read under
/// `root`).
fn version_in(root: &Path, site_packages: &str) -> Option<String> {
    let dir = root.join(site_packages.trim_start_matches('/'));
    let entry = fs::read_dir(&dir).ok()?.flatten().find(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with("vllm-") && name.ends_with(".dist-info")
    })?;
    let mut text = String::new();
    fs::File::open(entry.path().join("METADATA"))
        .ok()?
        .take(MAX_METADATA)
        .read_to_string(&mut text)
        .ok()?;
    metadata_version(&text).map(str::to_owned)
}

/// The vllm version process `tgid` runs, if its package metadata can be found.
pub fn process_version(tgid: u32) -> Option<String> {
    let proc = PathBuf::from(format!("/proc/{tgid}"));
    let maps = fs::File::open(proc.join("maps")).ok()?;
    let mut tried: Vec<String> = Vec::new();
    for line in BufReader::new(maps).lines().take(MAX_MAPS_LINES) {
        let Ok(line) = line else { break };
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let Some(site) = site_packages_of(path) else {
            continue;
        };
        if tried.iter().any(|t| t == site) {
            continue;
        }
        if let Some(v) = version_in(&proc.join("root"), site) {
            return Some(v);
        }
        tried.push(site.to_owned());
        if tried.len() > 8 {
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
    fn reads_the_version_from_an_installed_package() {
        let root = std::env::temp_dir().join(format!("inferscope-vllm-pkg-{}", std::process::id()));
        let site = "venv/lib/python3.11/site-packages";
        let dist = root.join(site).join("vllm-0.33.0.dist-info");
        fs::create_dir_all(&dist).unwrap();
        fs::write(dist.join("METADATA"), "Name: vllm\nVersion: 0.33.0\n").unwrap();
        assert_eq!(
            version_in(&root, &format!("/{site}")).as_deref(),
            Some("0.33.0")
        );
        assert_eq!(version_in(&root, "/elsewhere"), None);
        let _ = fs::remove_dir_all(&root);
    }
}
