//! vLLM V1's API server ↔ EngineCore traffic, as captured on the sockets of either process:
//! ZMTP streams → messages → [`IpcState`]. The engine's version comes from the process's
//! installed package (read at discovery, [`crate::engines::package`]) and from its start-up message
//! (`EngineCoreReadyResponse.vllm_version`), and picks the pinned layout; an unsupported version
//! is refused (logged once, counted per message) and decoded no further. Only when neither is
//! known is the newest layout used, with every field's type checked.
//!
//! Several vLLM servers (and data-parallel engine cores) may run on one node: each server is
//! named by its API server's pid (an EngineCore process by its parent's), so steps are chained
//! per (server, engine index).
use inferscope_decode::zmtp::Message;
use inferscope_model::{Counter, RequestRecord, Stats, StepRecord};
use rustc_hash::FxHashMap;
use tracing::warn;

use super::{
    layout::{self, Layout},
    messages::{self, IpcMessage},
    state::IpcState,
};
use crate::engines::{EngineIpc, IpcBytes, IpcVerdict, package, zmq_reader::ZmqSockets};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    Supported(&'static Layout),
    Unsupported,
}

#[derive(Default)]
pub(crate) struct VllmIpc {
    sockets: ZmqSockets,
    /// Per process: the version its package or its engine reported.
    versions: FxHashMap<u32, Version>,
    /// Per process: its parent, when that is a vLLM process too (EngineCore → API server).
    parents: FxHashMap<u32, u32>,
    /// Processes discovery reported.
    known: rustc_hash::FxHashSet<u32>,
    state: IpcState,
    stats: Stats,
    messages: Vec<Message>,
    /// Per server: when its EngineCore processes were last looked for in /proc.
    engine_lookups: FxHashMap<u32, std::time::Instant>,
}

/// Servers whose EngineCore lookups are remembered; beyond this the table starts over.
const MAX_SERVERS: usize = 1024;
/// How often a server whose EngineCore was not found is looked at again.
const ENGINE_LOOKUP_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// The data-parallel rank in an EngineCore's process title (`VLLM::EngineCore`: 0,
/// `VLLM::EngineCore_DP<rank>`), None for other processes. The prefix is
/// `VLLM_PROCESS_NAME_PREFIX` (default `VLLM`).
fn engine_core_rank(cmdline: &str) -> Option<i64> {
    let title = cmdline.split(['\0', ' ']).next()?;
    let (_, name) = title.split_once("::")?;
    let rest = name.strip_prefix("EngineCore")?;
    match rest.strip_prefix("_DP") {
        Some(rank) => rank.parse().ok(),
        None => rest.is_empty().then_some(0),
    }
}

impl VllmIpc {
    #[cfg(test)]
    pub(super) fn state(&self) -> &IpcState {
        &self.state
    }

    /// As if /proc had shown `pid` as the EngineCore (data-parallel rank `rank`) of `server`.
    #[cfg(test)]
    pub(crate) fn set_engine_core(&mut self, server: u32, rank: i64, pid: u32) {
        self.engine_lookups
            .insert(server, std::time::Instant::now());
        self.state.engine_pids.insert((server, rank), pid);
    }

    /// The pinned layout for a reported version, or Unsupported (logged).
    fn version(tgid: u32, version: &str, source: &str) -> Version {
        match layout::for_version(version) {
            Some(l) => Version::Supported(l),
            None => {
                warn!(
                    pid = tgid,
                    version,
                    source,
                    supported = layout::SUPPORTED,
                    "vLLM version without a pinned IPC layout: its IPC is not decoded \
                     (admission, preemptions and KV use need a supported version; HTTP records \
                     go on)"
                );
                Version::Unsupported
            }
        }
    }

    /// What discovery found of `tgid`'s installed vLLM package (`None`: no metadata found):
    /// pins its layout, or refuses an unpinned version (logged once, then every message of it
    /// is counted and left undecoded).
    pub(super) fn learn_package_version(&mut self, tgid: u32, version: Option<&str>) {
        match version {
            Some(v) => {
                let version = Self::version(tgid, v, "installed package");
                self.stats.bump(match version {
                    Version::Supported(_) => Counter::VllmVersionFromPackage,
                    Version::Unsupported => Counter::VllmVersionUnsupported,
                });
                self.versions.insert(tgid, version);
            }
            None => self.stats.bump(Counter::VllmVersionPackageNotFound),
        }
    }

    /// The server a process belongs to: its API server's pid.
    fn server(&self, tgid: u32) -> u32 {
        let mut server = tgid;
        // EngineCore → API server; bounded for a cycle that a pid reuse could make.
        for _ in 0..4 {
            match self.parents.get(&server) {
                Some(&p) if p != server => server = p,
                _ => break,
            }
        }
        server
    }

    /// Finds the EngineCore processes of `server` (its children named `…::EngineCore[_DP<n>]`),
    /// whose kernels its steps launched: once, and again every [`ENGINE_LOOKUP_RETRY`] until
    /// found.
    fn find_engine_cores(&mut self, server: u32) {
        let now = std::time::Instant::now();
        if let Some(&at) = self.engine_lookups.get(&server)
            && (self.state.engine_pids.keys().any(|&(s, _)| s == server)
                || now.duration_since(at) < ENGINE_LOOKUP_RETRY)
        {
            return;
        }
        if self.engine_lookups.len() >= MAX_SERVERS {
            self.engine_lookups.clear();
            self.state.engine_pids.clear();
        }
        self.engine_lookups.insert(server, now);
        for pid in crate::capture::process::procfs::all_pids() {
            if crate::capture::process::procfs::parent_pid(pid) != Some(server) {
                continue;
            }
            if let Some(rank) =
                crate::capture::process::procfs::cmdline(pid).and_then(|c| engine_core_rank(&c))
            {
                self.state.engine_pids.insert((server, rank), pid);
                self.stats.bump(Counter::VllmEngineCoreFound);
            }
        }
    }

    /// Decodes one message seen in process `tgid` and applies it.
    fn on_message(&mut self, message: &Message, tgid: u32, tid: u32, steps: &mut Vec<StepRecord>) {
        let frames: Vec<&[u8]> = message.frames.iter().map(|f| f.data.as_slice()).collect();
        let known = self.versions.get(&tgid).copied();
        let layout = match known {
            Some(Version::Supported(l)) => l,
            Some(Version::Unsupported) | None => &layout::NEWEST,
        };
        let decoded = messages::decode(&frames, layout);
        if let Ok(IpcMessage::Ready { version }) = &decoded {
            let v = match known {
                // Already refused (from its package): said once.
                Some(Version::Unsupported) if layout::for_version(version).is_none() => {
                    Version::Unsupported
                }
                _ => Self::version(tgid, version, "handshake"),
            };
            self.versions.insert(tgid, v);
            self.stats.bump(Counter::VllmIpcReady);
            return;
        }
        match (known, decoded) {
            (Some(Version::Unsupported), _) => self.stats.bump(Counter::VllmIpcUnsupportedVersion),
            (_, Err(e)) => self.stats.bump(e.counter()),
            (known, Ok(m)) => {
                if known.is_none() {
                    self.stats.bump(Counter::VllmIpcLayoutAssumed);
                }
                self.stats.bump(Counter::VllmIpcMessages);
                let server = self.server(tgid);
                if matches!(m, IpcMessage::Outputs(_)) {
                    self.find_engine_cores(server);
                }
                self.state.apply(m, (tgid, tid, server), steps);
            }
        }
    }
}

impl EngineIpc for VllmIpc {
    fn add_process(&mut self, tgid: u32) {
        if let Some(parent) = crate::capture::process::procfs::parent_pid(tgid)
            && self.known.contains(&parent)
        {
            self.parents.insert(tgid, parent);
        }
        self.known.insert(tgid);
        let version = package::process_version(tgid, "vllm");
        self.learn_package_version(tgid, version.as_deref());
    }

    fn on_bytes(&mut self, b: &IpcBytes<'_>, steps: &mut Vec<StepRecord>) -> IpcVerdict {
        let mut messages = std::mem::take(&mut self.messages);
        let verdict = self.sockets.feed(
            b,
            &mut self.stats,
            Counter::VllmIpcSocketTableFull,
            &mut messages,
        );
        for message in messages.drain(..) {
            self.on_message(&message, b.tgid, b.tid, steps);
        }
        self.messages = messages;
        verdict
    }

    fn on_close(&mut self, tgid: u32, fd: i32) {
        self.sockets.close(tgid, fd);
    }

    fn forget_process(&mut self, tgid: u32) {
        self.sockets.forget_process(tgid);
        self.versions.remove(&tgid);
        self.parents.remove(&tgid);
        self.engine_lookups.remove(&tgid);
        self.state
            .engine_pids
            .retain(|&(server, _), pid| server != tgid && *pid != tgid);
        self.known.remove(&tgid);
    }

    fn enrich(&mut self, record: &mut RequestRecord) {
        self.state.enrich(record);
    }

    fn awaits_engine(&self, record: &RequestRecord) -> bool {
        self.state.awaits_engine(record)
    }

    fn counters(&self) -> Vec<(Counter, u64)> {
        self.stats.iter().chain(self.state.stats.iter()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::engine_core_rank;

    #[test]
    fn engine_core_titles_name_their_rank() {
        assert_eq!(engine_core_rank("VLLM::EngineCore"), Some(0));
        assert_eq!(engine_core_rank("VLLM::EngineCore    "), Some(0));
        assert_eq!(engine_core_rank("VLLM::EngineCore_DP3"), Some(3));
        assert_eq!(engine_core_rank("myprefix::EngineCore_DP1"), Some(1));
        for other in [
            "VLLM::Worker_TP0",
            "VLLM::EngineCore_DPx",
            "VLLM::EngineCoreX",
            "python3 -m vllm.entrypoints.openai.api_server",
            "",
        ] {
            assert_eq!(engine_core_rank(other), None, "{other}");
        }
    }
}
