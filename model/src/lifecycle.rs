//! Per-process state: every component that keeps something per traced process implements
//! [`PerProcess`], and the pipeline lists them in one place, so detaching a process forgets it
//! everywhere (a component left out of that list would leak one entry per engine restart).

/// A component with state per traced process.
pub trait PerProcess {
    /// Discovery detached the process `tgid` (it exited, or stopped serving): drop its state.
    fn process_gone(&mut self, tgid: u32);
}

impl<T: PerProcess> PerProcess for Option<T> {
    fn process_gone(&mut self, tgid: u32) {
        if let Some(inner) = self {
            inner.process_gone(tgid);
        }
    }
}

/// A map keyed by process id (e.g. listening ports per process) forgets the process's entry.
impl<V, S: std::hash::BuildHasher> PerProcess for std::collections::HashMap<u32, V, S> {
    fn process_gone(&mut self, tgid: u32) {
        self.remove(&tgid);
    }
}
