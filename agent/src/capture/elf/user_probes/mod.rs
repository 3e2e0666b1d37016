//! User-defined probes: a spec file names functions of a native engine inferscope has no
//! profile for, what each means (arrival, admit, step, ...) and how to read the request id. This
//! module attaches them to each traced process and watches their health: a probe that cannot be
//! attached, or whose reads keep failing (a wrong offset), is disabled with a warning while the
//! rest keep working. Reads go through bpf_probe_read_user, so a wrong offset costs the engine
//! nothing; all probes go when the agent exits (closing the eBPF object detaches them).
use inferscope_model::Counter;
pub(crate) mod spec;

use std::path::PathBuf;

use inferscope_model::Stats;
use rustc_hash::FxHashMap;
pub(crate) use spec::ProbeSpec;
use spec::{At, Join};
use tracing::{info, warn};

use crate::capture::{
    SocketProbes,
    elf::{sched_hooks::HookOutcome, symbols::ElfSymbols},
    kernel::records::{SchedEvent, UserJoin, UserProbeHit},
    process::procfs,
};

/// Processes whose probe health is tracked at once (bounded like every map).
const MAX_PROCESSES: usize = 1024;

pub(crate) struct UserProbes {
    spec: ProbeSpec,
    /// (tgid, probe) → consecutive failed reads.
    failures: FxHashMap<(u32, u32), u32>,
    /// Probes to detach once the ring buffer is no longer borrowed (see [`UserProbes::detach_failed`]).
    to_detach: Vec<(u32, u32)>,
    stats: Stats,
}

impl UserProbes {
    /// Hands the kernel program every probe's read configuration.
    pub(crate) fn new(spec: ProbeSpec, probes: &mut SocketProbes) -> Result<Self, String> {
        for (index, probe) in spec.probes.iter().enumerate() {
            probes.set_user_probe(index as u32, probe.config)?;
        }
        Ok(Self {
            spec,
            failures: FxHashMap::default(),
            to_detach: Vec::new(),
            stats: Stats::default(),
        })
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Attaches every probe whose object `tgid` maps (`only` None), or the probes listed, which
    /// a retry does quietly. A probe that cannot be attached is reported and skipped; those
    /// whose object or function was not found come back in `not_found`, to be tried again when
    /// the process maps more objects.
    pub(crate) fn attach(
        &mut self,
        probes: &mut SocketProbes,
        tgid: u32,
        only: Option<&[usize]>,
    ) -> HookOutcome {
        let retry = only.is_some();
        let mapped = procfs::mapped_files(tgid);
        let mut tables: FxHashMap<String, Option<ElfSymbols>> = FxHashMap::default();
        let mut outcome = HookOutcome::default();
        for (index, probe) in self.spec.probes.iter().enumerate() {
            if only.is_some_and(|only| !only.contains(&index)) {
                continue;
            }
            let candidates: Vec<&String> = mapped
                .iter()
                .filter(|path| object_matches(&probe.object, path))
                .collect();
            if candidates.is_empty() {
                outcome.not_found.push(index);
                if !retry {
                    warn!(
                        pid = tgid,
                        probe = %probe.name,
                        object = %probe.object,
                        "user probe waiting: the process maps no file matching its object (yet); it is attached if one is loaded later"
                    );
                    self.stats.bump(Counter::UserProbesNotAttached);
                }
                continue;
            }
            let mut found: Option<(PathBuf, u64)> = None;
            let mut why = String::new();
            for path in candidates {
                // Paths from /proc/PID/maps are in the process's mount namespace.
                let readable = PathBuf::from(format!("/proc/{tgid}/root{path}"));
                let table = tables.entry(path.clone()).or_insert_with(|| {
                    ElfSymbols::load(&readable)
                        .map_err(|e| warn!(pid = tgid, object = %path, "cannot read symbols: {e}"))
                        .ok()
                });
                let Some(table) = table else { continue };
                let symbols = table.resolve(&probe.symbol);
                match symbols.len() {
                    0 => {}
                    1 => {
                        found = Some((readable, symbols[0].file_offset));
                        break;
                    }
                    n => {
                        why = format!(
                            "{n} functions in {path} match it; write its full signature, e.g. {:?}",
                            symbols.first().map(|s| s.name.as_str()).unwrap_or_default()
                        );
                    }
                }
            }
            let Some((object, offset)) = found else {
                if why.is_empty() {
                    outcome.not_found.push(index);
                    why = format!(
                        "no function matches it in the mapped objects matching {:?} (misspelt, or a stripped build)",
                        probe.object
                    );
                }
                if !retry {
                    warn!(pid = tgid, probe = %probe.name, symbol = %probe.symbol, "user probe not attached: {why}");
                    self.stats.bump(Counter::UserProbesNotAttached);
                }
                continue;
            };
            match probes.attach_user_probe(
                index as u32,
                probe.at == At::Return,
                &object,
                offset,
                tgid,
            ) {
                Ok(()) => {
                    outcome.live += 1;
                    if retry {
                        self.stats.bump(Counter::UserProbesAttachedLate);
                    }
                    info!(pid = tgid, probe = %probe.name, event = ?probe.event, late = retry, "user probe attached");
                }
                Err(e) => {
                    warn!(pid = tgid, probe = %probe.name, "user probe disabled: attaching failed: {e}");
                    self.stats.bump(Counter::UserProbesNotAttached);
                }
            }
        }
        outcome
    }

    /// Whether a mapped file could hold one of the spec's probes.
    pub(crate) fn wants_object(&self, mapped: &str) -> bool {
        self.spec
            .probes
            .iter()
            .any(|probe| object_matches(&probe.object, mapped))
    }

    /// A probe fired: the scheduler event it stands for, or None when its read failed (after
    /// `max_failures` failures in a row the probe is queued for [`UserProbes::detach_failed`]).
    pub(crate) fn on_hit(&mut self, hit: &UserProbeHit) -> Option<SchedEvent> {
        let Some(probe) = self.spec.probes.get(hit.probe as usize) else {
            self.stats.bump(Counter::UserProbeUnknownIndex);
            return None;
        };
        let key = (hit.tgid, hit.probe);
        if hit.read_failed {
            self.stats.bump(Counter::UserProbeReadFailed);
            if self.failures.len() >= MAX_PROCESSES * 4 && !self.failures.contains_key(&key) {
                self.failures.clear();
            }
            let count = self.failures.entry(key).or_insert(0);
            *count += 1;
            if *count == self.spec.max_failures {
                warn!(
                    pid = hit.tgid,
                    probe = %probe.name,
                    symbol = %probe.symbol,
                    "user probe disabled: {count} reads in a row failed (bad offset or dereference chain?); the other probes keep running",
                );
                if self.to_detach.len() < MAX_PROCESSES {
                    self.to_detach.push(key);
                }
                self.stats.bump(Counter::UserProbesDisabled);
            }
            return None;
        }
        self.failures.remove(&key);
        Some(SchedEvent {
            kind: hit.kind,
            tgid: hit.tgid,
            tid: hit.tid,
            ts_ns: hit.ts_ns,
            task_id: if probe.has_value() { hit.value } else { -1 },
            slot: None,
            user: Some(UserJoin {
                by_thread: probe.join == Join::Thread,
                has_id: probe.has_value(),
            }),
        })
    }

    /// Detaches the probes whose reads kept failing.
    pub(crate) fn detach_failed(&mut self, probes: &mut SocketProbes) {
        for (tgid, index) in self.to_detach.drain(..) {
            probes.detach_user_probe(tgid, index);
        }
    }

    pub(crate) fn forget_process(&mut self, tgid: u32) {
        self.failures.retain(|(t, _), _| *t != tgid);
    }
}

/// A full path matches exactly; anything else matches as a substring of the file name.
fn object_matches(object: &str, mapped: &str) -> bool {
    if object.starts_with('/') {
        return mapped == object;
    }
    let name = mapped.rsplit('/').next().unwrap_or(mapped);
    name.contains(object)
}

impl inferscope_model::PerProcess for UserProbes {
    fn process_gone(&mut self, tgid: u32) {
        self.forget_process(tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::object_matches;

    #[test]
    fn objects_match_by_path_or_file_name() {
        assert!(object_matches("/usr/bin/engine", "/usr/bin/engine"));
        assert!(!object_matches("/usr/bin/engine", "/opt/usr/bin/engine"));
        assert!(object_matches(
            "libtensorrt_llm",
            "/x/lib/libtensorrt_llm.so.1"
        ));
        // A directory name is not a file name.
        assert!(!object_matches("lib", "/usr/lib/x86_64/engine"));
    }
}
