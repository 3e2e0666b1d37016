//! Throttles a process's CPU with a cgroup CPU limit: cgroup v2 `cpu.max` where the unified
//! hierarchy has the cpu controller, else cgroup v1 `cpu.cfs_quota_us`. Both are the kernel's
//! own bandwidth control (a slower device for the engine, prompts unchanged).
use std::{
    fs,
    path::{Path, PathBuf},
};

pub(crate) struct CpuLimit {
    dir: PathBuf,
    /// Where the process came from (to move it back before removing the group).
    home: PathBuf,
    pid: u32,
    v2: bool,
}

/// (mount point, fstype, super options) for each cgroup mount.
fn cgroup_mounts() -> Vec<(PathBuf, String, String)> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mount = pre.split(' ').nth(4)?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let opts = post.nth(1).unwrap_or("");
            fstype
                .starts_with("cgroup")
                .then(|| (PathBuf::from(mount), fstype.to_owned(), opts.to_owned()))
        })
        .collect()
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

/// The process's current group under a hierarchy (`0::/x` for v2, `N:cpu,cpuacct:/x` for v1).
fn home_of(pid: u32, mount: &Path, v2: bool) -> PathBuf {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let rel = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if v2 {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == "cpu")
        };
        hit.then(|| path.trim_start_matches('/').to_owned())
    });
    mount.join(rel.unwrap_or_default())
}

impl CpuLimit {
    /// Limits `pid` (all its threads) to `quota_us` of CPU time per `period_us`.
    pub(crate) fn apply(pid: u32, quota_us: u64, period_us: u64) -> Result<CpuLimit, String> {
        let mounts = cgroup_mounts();
        let name = format!("inferscope-incident-{}-{pid}", std::process::id());
        let mut tried = Vec::new();
        // cgroup v2, with the cpu controller available in the unified hierarchy.
        for (mount, _, _) in mounts.iter().filter(|m| m.1 == "cgroup2") {
            let controllers =
                fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "cpu") {
                tried.push(format!(
                    "{}: no cpu controller in cgroup v2",
                    mount.display()
                ));
                continue;
            }
            let attempt = (|| {
                // A child of the root: the root is exempt from the no-internal-process rule.
                write(&mount.join("cgroup.subtree_control"), "+cpu")?;
                let dir = mount.join(&name);
                fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
                let home = home_of(pid, mount, true);
                write(&dir.join("cpu.max"), &format!("{quota_us} {period_us}"))?;
                write(&dir.join("cgroup.procs"), &pid.to_string())?;
                Ok::<_, String>(CpuLimit {
                    dir,
                    home,
                    pid,
                    v2: true,
                })
            })();
            match attempt {
                Ok(limit) => return Ok(limit),
                Err(e) => tried.push(e),
            }
        }
        // cgroup v1, the cpu controller's own hierarchy.
        for (mount, _, opts) in mounts
            .iter()
            .filter(|m| m.1 == "cgroup" && m.2.split(',').any(|o| o == "cpu"))
        {
            let attempt = (|| {
                let dir = mount.join(&name);
                fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
                let home = home_of(pid, mount, false);
                write(&dir.join("cpu.cfs_period_us"), &period_us.to_string())?;
                write(&dir.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
                // cgroup.procs moves every thread of the process.
                write(&dir.join("cgroup.procs"), &pid.to_string())?;
                Ok::<_, String>(CpuLimit {
                    dir,
                    home,
                    pid,
                    v2: false,
                })
            })();
            match attempt {
                Ok(limit) => return Ok(limit),
                Err(e) => tried.push(format!("{} ({opts}): {e}", mount.display())),
            }
        }
        Err(format!(
            "cannot limit the engine's CPU: neither a cgroup v2 hierarchy with the cpu controller nor a cgroup v1 cpu hierarchy worked (run as root on Linux with cgroups): {}",
            if tried.is_empty() {
                "no cgroup mounts found".to_owned()
            } else {
                tried.join("; ")
            }
        ))
    }
}

/// Dropping removes the limit: the process goes back to its own group, the group is removed.
impl Drop for CpuLimit {
    fn drop(&mut self) {
        let unlimited = if self.v2 { "max" } else { "-1" };
        let file = if self.v2 {
            "cpu.max"
        } else {
            "cpu.cfs_quota_us"
        };
        let _ = fs::write(self.dir.join(file), unlimited);
        let _ = fs::write(self.home.join("cgroup.procs"), self.pid.to_string());
        let _ = fs::remove_dir(&self.dir);
    }
}
