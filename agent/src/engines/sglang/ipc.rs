//! SGLang's TokenizerManager ↔ Scheduler ↔ Detokenizer traffic, as captured on the sockets of
//! any of its processes: ZMTP streams → pickled objects → [`IpcState`]. The version comes from
//! each process's installed package (read at discovery) and picks the pinned layout; an
//! unsupported version is refused (logged once, counted per message) and decoded no further.
//! When the version is unknown the newest layout is used, every class and field checked.
use inferscope_decode::zmtp::Message;
use inferscope_model::{Counter, RequestRecord, Stats, StepRecord};
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::warn;

use super::{
    layout::{self, Layout},
    messages,
    scheduler::Schedulers,
    state::{IpcState, Sighting},
};
use crate::engines::{EngineIpc, IpcBytes, IpcVerdict, package, zmq_reader::ZmqSockets};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    Supported(&'static Layout),
    Unsupported,
}

#[derive(Default)]
pub(crate) struct SglangIpc {
    sockets: ZmqSockets,
    versions: FxHashMap<u32, Version>,
    /// Versions already warned about.
    warned: FxHashSet<String>,
    state: IpcState,
    schedulers: Schedulers,
    stats: Stats,
    messages: Vec<Message>,
}

impl SglangIpc {
    #[cfg(test)]
    pub(super) fn state(&self) -> &IpcState {
        &self.state
    }

    /// As if /proc had shown `scheduler` as the scheduler of the server `seen_in` belongs to.
    #[cfg(test)]
    pub(crate) fn set_scheduler(&mut self, seen_in: u32, scheduler: u32) {
        self.schedulers.set(seen_in, scheduler);
    }

    #[cfg(test)]
    pub(crate) fn set_version(&mut self, tgid: u32, version: &str) {
        let v = self.version(tgid, version);
        self.versions.insert(tgid, v);
    }

    fn version(&mut self, tgid: u32, version: &str) -> Version {
        match layout::for_version(version) {
            Some(l) => Version::Supported(l),
            None => {
                if self.warned.len() < 64 && self.warned.insert(version.to_owned()) {
                    warn!(
                        pid = tgid,
                        version,
                        supported = layout::SUPPORTED,
                        "SGLang version without a pinned IPC layout: its IPC is not decoded \
                         (admission, retractions and prompt tokens need a supported version; \
                         HTTP records go on)"
                    );
                }
                Version::Unsupported
            }
        }
    }

    /// One ZMQ message, complete in a syscall of `b` that entered the kernel at `at_ns`.
    fn on_message(
        &mut self,
        message: &Message,
        b: &IpcBytes<'_>,
        at_ns: Option<u64>,
        steps: &mut Vec<StepRecord>,
    ) {
        let (tgid, tid) = (b.tgid, b.tid);
        let layout = match self.versions.get(&tgid) {
            Some(Version::Supported(l)) => *l,
            Some(Version::Unsupported) => {
                self.stats.bump(Counter::SglangIpcUnsupportedVersion);
                return;
            }
            None => {
                self.stats.bump(Counter::SglangIpcLayoutAssumed);
                &layout::NEWEST
            }
        };
        // SGLang sends one object per message, in one frame.
        let Some(frame) = message.frames.first() else {
            return;
        };
        if !frame.complete {
            self.stats.bump(Counter::SglangIpcFrameCut);
            return;
        }
        match messages::decode(&frame.data, layout) {
            Ok(m) => {
                self.stats.bump(Counter::SglangIpcMessages);
                let seen = match m {
                    messages::IpcMessage::Outputs { scheduler, .. } => Sighting {
                        tgid,
                        tid,
                        kernel_pid: self.schedulers.of(tgid, &mut self.stats),
                        at: at_ns,
                        scheduler_class: scheduler,
                    },
                    _ => Sighting {
                        tgid,
                        tid,
                        kernel_pid: None,
                        at: None,
                        scheduler_class: false,
                    },
                };
                self.state.apply(m, seen, steps);
            }
            Err(e) => self.stats.bump(e.counter()),
        }
    }
}

impl SglangIpc {
    fn feed(
        &mut self,
        b: &IpcBytes<'_>,
        at_ns: Option<u64>,
        steps: &mut Vec<StepRecord>,
    ) -> IpcVerdict {
        let mut messages = std::mem::take(&mut self.messages);
        let verdict = self.sockets.feed(
            b,
            &mut self.stats,
            Counter::SglangIpcSocketTableFull,
            &mut messages,
        );
        for message in messages.drain(..) {
            self.on_message(&message, b, at_ns, steps);
        }
        self.messages = messages;
        verdict
    }
}

impl EngineIpc for SglangIpc {
    fn add_process(&mut self, tgid: u32) {
        match package::process_version(tgid, "sglang") {
            Some(v) => {
                let version = self.version(tgid, &v);
                self.stats.bump(match version {
                    Version::Supported(_) => Counter::SglangVersionFromPackage,
                    Version::Unsupported => Counter::SglangVersionUnsupported,
                });
                self.versions.insert(tgid, version);
            }
            None => self.stats.bump(Counter::SglangVersionPackageNotFound),
        }
    }

    /// Bytes without their capture time: steps that only the capture would time are left to
    /// a later sighting of the batch.
    fn on_bytes(&mut self, b: &IpcBytes<'_>, steps: &mut Vec<StepRecord>) -> IpcVerdict {
        self.feed(b, None, steps)
    }

    fn on_bytes_at(
        &mut self,
        b: &IpcBytes<'_>,
        at_ns: u64,
        steps: &mut Vec<StepRecord>,
    ) -> IpcVerdict {
        self.feed(b, Some(at_ns), steps)
    }

    fn on_close(&mut self, tgid: u32, fd: i32) {
        self.sockets.close(tgid, fd);
    }

    fn forget_process(&mut self, tgid: u32) {
        self.sockets.forget_process(tgid);
        self.versions.remove(&tgid);
        self.schedulers.forget(tgid);
    }

    fn enrich(&mut self, record: &mut RequestRecord) {
        self.state.enrich(record);
    }

    fn counters(&self) -> Vec<(Counter, u64)> {
        self.stats.iter().chain(self.state.stats.iter()).collect()
    }
}
