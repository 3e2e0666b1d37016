//! The shim listener as the pipeline and the daemon share it: the pipeline drains its kernel
//! records on every pass, and the daemon may start listening late (a successor agent, once the
//! previous one has let go of the socket).
use std::sync::{Arc, Mutex};

use inferscope_model::Counter;

use super::{KernelRecord, ShimListener};

#[derive(Clone, Default)]
pub(crate) struct KernelFeed(Arc<Mutex<Option<ShimListener>>>);

impl KernelFeed {
    /// Kernel records come from `listener` from now on.
    pub(crate) fn set(&self, listener: ShimListener) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(listener);
        }
    }

    /// Moves every queued kernel record into `out`; none while nothing listens.
    pub(crate) fn drain(&self, out: &mut Vec<KernelRecord>) {
        if let Ok(slot) = self.0.lock()
            && let Some(listener) = slot.as_ref()
        {
            listener.drain(out);
        }
    }

    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        self.0
            .lock()
            .ok()
            .and_then(|slot| slot.as_ref().map(ShimListener::counters))
            .unwrap_or_default()
    }
}
