//! Hooks whose function a process did not have mapped when it was discovered: a Python engine
//! that imports its extension module after start-up, a library opened with dlopen, or a
//! process caught between exec and its dynamic loader. Each such process is looked at again
//! periodically; when the set of mapped files that could hold a missing hook changes, the
//! missing hooks are tried again.
use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};

use crate::capture::process::procfs;

/// Processes with missing hooks watched at once (bounded like every map; one more is counted).
pub(crate) const MAX_WATCHED: usize = 1024;

/// What one process still lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Missing {
    pub engine: &'static str,
    /// Indices into the engine's scheduler hooks.
    pub engine_hooks: Vec<usize>,
    /// Indices into the user probe spec.
    pub user_probes: Vec<usize>,
    /// Indices into the GPU launch hooks (`gpu::launches::HOOKS`).
    pub gpu_hooks: Vec<usize>,
    /// Indices into the TLS library hooks (`TlsApi::ALL`): all of them until a mapped object
    /// defines OpenSSL's functions.
    pub tls_hooks: Vec<usize>,
}

impl Missing {
    pub(crate) fn is_empty(&self) -> bool {
        self.engine_hooks.is_empty()
            && self.user_probes.is_empty()
            && self.gpu_hooks.is_empty()
            && self.tls_hooks.is_empty()
    }
}

#[derive(Default)]
pub(crate) struct LateAttach {
    watched: FxHashMap<u32, (Missing, u64)>,
    /// Processes not watched because the table was full.
    pub over_limit: u64,
}

impl LateAttach {
    /// Starts (or stops, when nothing is missing) watching `tgid`; `relevant` says which mapped
    /// files could hold a missing hook.
    pub(crate) fn watch(&mut self, tgid: u32, missing: Missing, relevant: impl Fn(&str) -> bool) {
        if missing.is_empty() {
            self.watched.remove(&tgid);
            return;
        }
        if self.watched.len() >= MAX_WATCHED && !self.watched.contains_key(&tgid) {
            self.over_limit += 1;
            return;
        }
        let fingerprint = fingerprint(&procfs::mapped_files(tgid), &relevant);
        self.watched.insert(tgid, (missing, fingerprint));
    }

    pub(crate) fn forget(&mut self, tgid: u32) {
        self.watched.remove(&tgid);
    }

    /// Whether `tgid` waits for a missing hook's object to be mapped.
    #[cfg(test)]
    pub(crate) fn watches(&self, tgid: u32) -> bool {
        self.watched.contains_key(&tgid)
    }

    #[cfg(test)]
    fn watched(&self) -> usize {
        self.watched.len()
    }

    /// Processes whose relevant mappings changed since they were last looked at, with what they
    /// miss; they stay watched until [`LateAttach::watch`] says otherwise.
    pub(crate) fn changed(
        &mut self,
        relevant: impl Fn(&'static str, &str) -> bool,
    ) -> Vec<(u32, Missing)> {
        let mut due = Vec::new();
        for (tgid, (missing, seen)) in self.watched.iter_mut() {
            let engine = missing.engine;
            let now = fingerprint(&procfs::mapped_files(*tgid), &|path: &str| {
                relevant(engine, path)
            });
            if now != *seen {
                *seen = now;
                due.push((*tgid, missing.clone()));
            }
        }
        due
    }
}

/// A hash of the relevant mapped files (the list comes sorted and deduplicated from procfs).
fn fingerprint(mapped: &[String], relevant: &dyn Fn(&str) -> bool) -> u64 {
    let mut hasher = FxHasher::default();
    for path in mapped.iter().filter(|p| relevant(p)) {
        path.hash(&mut hasher);
    }
    hasher.finish()
}

impl inferscope_model::PerProcess for LateAttach {
    fn process_gone(&mut self, tgid: u32) {
        self.forget(tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_relevant_files_move_the_fingerprint() {
        let engine_lib = |p: &str| p.contains("libengine");
        let before = vec!["/usr/lib/libc.so.6".to_owned()];
        let unrelated = vec![
            "/usr/lib/libc.so.6".to_owned(),
            "/usr/lib/libm.so".to_owned(),
        ];
        let loaded = vec![
            "/opt/libengine.so".to_owned(),
            "/usr/lib/libc.so.6".to_owned(),
        ];
        assert_eq!(
            fingerprint(&before, &engine_lib),
            fingerprint(&unrelated, &engine_lib)
        );
        assert_ne!(
            fingerprint(&before, &engine_lib),
            fingerprint(&loaded, &engine_lib)
        );
    }

    #[test]
    fn nothing_missing_means_not_watched() {
        let mut late = LateAttach::default();
        let missing = Missing {
            engine: "custom",
            engine_hooks: vec![],
            user_probes: vec![0],
            gpu_hooks: vec![],
            tls_hooks: vec![],
        };
        late.watch(std::process::id(), missing, |_| true);
        assert_eq!(late.watched(), 1);
        // Nothing changed in this process's mappings.
        assert!(late.changed(|_, _| true).is_empty());
        late.watch(std::process::id(), Missing::default(), |_| true);
        assert_eq!(late.watched(), 0);
    }
}
