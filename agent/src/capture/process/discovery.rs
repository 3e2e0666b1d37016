//! Finds the engine processes to trace and notices when they start, restart or exit.
use std::collections::{HashMap, HashSet};

use crate::capture::process::{procfs, sockets};

/// What discovery knows about a process when it asks the engines to claim it.
#[derive(Debug, Clone, Default)]
pub struct ProcessInfo {
    pub tgid: u32,
    pub cmdline: String,
    /// Executable and shared libraries mapped into the process.
    pub mapped_files: Vec<String>,
}

impl ProcessInfo {
    pub fn cmdline_has(&self, needle: &str) -> bool {
        self.cmdline.contains(needle)
    }

    /// A mapped file whose name (not directory) contains `needle`.
    pub fn maps_file(&self, needle: &str) -> bool {
        self.mapped_files.iter().any(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|name| name.contains(needle))
        })
    }
}

/// Names the engine of a process, or None when no engine plugin (nor user pattern) claims it:
/// the engines stage supplies it, so capture knows no engine.
pub(crate) type ClaimFn = fn(&ProcessInfo, &[String]) -> Option<&'static str>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetSelector {
    /// Exactly this process, whatever it runs.
    Pid(u32),
    /// Whichever process listens on this TCP port.
    Port(u16),
    /// Every process that listens on TCP and that an engine plugin (or a user pattern) claims.
    Auto { patterns: Vec<String> },
}

/// A process being traced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TracedProcess {
    pub tgid: u32,
    pub start_time: u64,
    pub engine: &'static str,
    pub ports: Vec<u16>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct DiscoveryChange {
    pub added: Vec<TracedProcess>,
    pub removed: Vec<TracedProcess>,
    /// Processes whose listening ports changed: (process as it is now, ports before).
    pub ports_changed: Vec<(TracedProcess, Vec<u16>)>,
}

/// How often unclaimed processes are looked at again (in scans): a Python process may load an
/// engine library well after it started.
const RECHECK_UNCLAIMED_EVERY: u64 = 5;

pub(crate) struct Discovery {
    selector: TargetSelector,
    claim: ClaimFn,
    own_tgid: u32,
    traced: HashMap<u32, TracedProcess>,
    /// (tgid, start time) → scan number when the process was found unclaimed.
    unclaimed: HashMap<(u32, u64), u64>,
    scans: u64,
}

impl Discovery {
    pub(crate) fn new(selector: TargetSelector, claim: ClaimFn) -> Self {
        Self {
            selector,
            claim,
            own_tgid: std::process::id(),
            traced: HashMap::new(),
            unclaimed: HashMap::new(),
            scans: 0,
        }
    }

    pub(crate) fn traced(&self) -> impl Iterator<Item = &TracedProcess> {
        self.traced.values()
    }

    pub(crate) fn engine_of(&self, tgid: u32) -> Option<&'static str> {
        self.traced.get(&tgid).map(|p| p.engine)
    }

    /// One pass over /proc; returns what changed since the last pass.
    pub(crate) fn scan(&mut self) -> DiscoveryChange {
        self.scans += 1;
        let mut seen: HashSet<u32> = HashSet::new();
        let mut change = DiscoveryChange::default();
        for (tgid, engine) in self.candidates() {
            let Some(start_time) = procfs::start_time(tgid) else {
                continue;
            };
            let ports = sockets::listening_ports(tgid);
            if ports.is_empty() && !matches!(self.selector, TargetSelector::Pid(_)) {
                continue;
            }
            seen.insert(tgid);
            let now = TracedProcess {
                tgid,
                start_time,
                engine,
                ports,
            };
            match self.traced.get(&tgid) {
                None => change.added.push(now.clone()),
                // Same pid, new process: the engine restarted and the pid was reused.
                Some(old) if old.start_time != start_time => {
                    change.removed.push(old.clone());
                    change.added.push(now.clone());
                }
                Some(old) if old.ports != now.ports => {
                    change.ports_changed.push((now.clone(), old.ports.clone()))
                }
                Some(_) => {}
            }
            self.traced.insert(tgid, now);
        }
        let gone: Vec<u32> = self
            .traced
            .keys()
            .filter(|t| !seen.contains(t))
            .copied()
            .collect();
        for tgid in gone {
            if let Some(old) = self.traced.remove(&tgid) {
                change.removed.push(old);
            }
        }
        let live: HashSet<u32> = procfs::all_pids().into_iter().collect();
        self.unclaimed.retain(|(tgid, _), _| live.contains(tgid));
        change
    }

    /// Processes that match the selector, with their engine name.
    fn candidates(&mut self) -> Vec<(u32, &'static str)> {
        match &self.selector {
            TargetSelector::Pid(pid) => {
                if !procfs::process_exists(*pid) {
                    return Vec::new();
                }
                let engine = engine_name(self.claim, *pid, &[]).unwrap_or("unknown");
                vec![(*pid, engine)]
            }
            TargetSelector::Port(port) => {
                let port = *port;
                let claim = self.claim;
                self.scan_processes(|tgid| {
                    sockets::listening_ports(tgid)
                        .contains(&port)
                        .then(|| engine_name(claim, tgid, &[]).unwrap_or("unknown"))
                })
            }
            TargetSelector::Auto { patterns } => {
                let patterns = patterns.clone();
                let claim = self.claim;
                self.scan_processes(move |tgid| engine_name(claim, tgid, &patterns))
            }
        }
    }

    fn scan_processes(
        &mut self,
        claim: impl Fn(u32) -> Option<&'static str>,
    ) -> Vec<(u32, &'static str)> {
        let mut found = Vec::new();
        for tgid in procfs::all_pids() {
            if tgid == self.own_tgid {
                continue;
            }
            if let Some(p) = self.traced.get(&tgid) {
                found.push((tgid, p.engine));
                continue;
            }
            let Some(start) = procfs::start_time(tgid) else {
                continue;
            };
            if let Some(&when) = self.unclaimed.get(&(tgid, start))
                && self.scans - when < RECHECK_UNCLAIMED_EVERY
            {
                continue;
            }
            match claim(tgid) {
                Some(engine) => {
                    self.unclaimed.remove(&(tgid, start));
                    found.push((tgid, engine));
                }
                None => {
                    self.unclaimed.insert((tgid, start), self.scans);
                }
            }
        }
        found
    }
}

fn engine_name(claim: ClaimFn, tgid: u32, patterns: &[String]) -> Option<&'static str> {
    let info = ProcessInfo {
        tgid,
        cmdline: procfs::cmdline(tgid)?,
        mapped_files: procfs::mapped_files(tgid),
    };
    claim(&info, patterns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_selector_traces_the_process_and_notices_its_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut discovery = Discovery::new(TargetSelector::Pid(pid), |_, _| None);
        let change = discovery.scan();
        assert_eq!(change.added.len(), 1);
        assert_eq!(change.added[0].engine, "unknown");
        assert!(discovery.scan().added.is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        let change = discovery.scan();
        assert_eq!(change.removed.len(), 1);
    }

    #[test]
    fn port_selector_finds_the_listener() {
        use std::io::BufRead;
        // Our own process is excluded on purpose (the agent must never trace itself), so a
        // child holds the port: it binds an ephemeral one and tells us which.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,time;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();print(s.getsockname()[1],flush=True);time.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().unwrap();
        let mut discovery = Discovery::new(TargetSelector::Port(port), |_, _| None);
        let added = discovery.scan().added;
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].tgid, child.id());
        assert_eq!(added[0].ports, vec![port]);
    }
}
