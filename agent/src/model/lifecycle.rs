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
