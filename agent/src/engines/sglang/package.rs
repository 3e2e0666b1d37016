//! The SGLang version a process runs, from its installed package: the `site-packages` its
//! mapped Python extensions come from (/proc/PID/maps), read through /proc/PID/root
//! (containers), and the `sglang-<version>.dist-info/METADATA` there.
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

fn version_in(root: &Path, site_packages: &str) -> Option<String> {
    let dir = root.join(site_packages.trim_start_matches('/'));
    let entry = fs::read_dir(&dir).ok()?.flatten().find(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with("sglang-") && name.ends_with(".dist-info")
    })?;
    let mut text = String::new();
    fs::File::open(entry.path().join("METADATA"))
        .ok()?
        .take(MAX_METADATA)
        .read_to_string(&mut text)
        .ok()?;
    metadata_version(&text).map(str::to_owned)
}

/// The sglang version process `tgid` runs, if its package metadata can be found.
pub fn process_version(tgid: u32) -> Option<String> {
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
        if let Some(v) = version_in(&proc.join("root"), site) {
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
    fn reads_the_version_from_an_installed_package() {
        let root =
            std::env::temp_dir().join(format!("inferscope-sglang-pkg-{}", std::process::id()));
        let site = "venv/lib/python3.11/site-packages";
        let dist = root.join(site).join("sglang-0.5.23.dist-info");
        fs::create_dir_all(&dist).unwrap();
        fs::write(
            dist.join("METADATA"),
            "Name: sglang\nVersion: 0.5.23\n\nVersion: 9\n",
        )
        .unwrap();
        assert_eq!(
            version_in(&root, &format!("/{site}")).as_deref(),
            Some("0.5.23")
        );
        assert_eq!(version_in(&root, "/elsewhere"), None);
        assert_eq!(
            site_packages_of("/v/lib/python3.11/site-packages/zmq/backend.so"),
            Some("/v/lib/python3.11/site-packages")
        );
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn finds_this_process_has_no_sglang() {
        assert_eq!(process_version(std::process::id()), None);
    }
}
