//! The shim's one process-wide state, set once at injection. CUPTI's callbacks carry no
//! context pointer, so the callback modules (activity, callbacks) and the sender thread reach
//! it here; init only fills it.
use std::sync::{Mutex, OnceLock};

use crate::{clock::Clock, config::Config, launches::LaunchTable, names::NameCache, sink::Sink};

pub(crate) struct Shim {
    /// The process that was injected; a forked child inherits this state but not CUDA.
    pub pid: u32,
    pub config: Config,
    pub launches: LaunchTable,
    pub clock: Clock,
    pub sink: Sink,
    pub cupti_version: u32,
    pub driver_version: i32,
    pub names: Mutex<NameCache>,
}

impl Shim {
    pub(crate) fn names(&self, raw: &str) -> (std::sync::Arc<str>, bool) {
        match self.names.lock() {
            Ok(mut cache) => cache.get(raw),
            Err(_) => {
                let n = crate::names::demangle(raw);
                let tc = crate::names::uses_tensor_cores(&n);
                (n.into(), tc)
            }
        }
    }
}

static STATE: OnceLock<Shim> = OnceLock::new();

/// The state, once [`install`] has run.
pub(crate) fn state() -> Option<&'static Shim> {
    STATE.get()
}

/// Sets the state; None if it was already set (a second injection: the first one stays).
pub(crate) fn install(shim: Shim) -> Option<&'static Shim> {
    STATE.set(shim).ok()?;
    STATE.get()
}
