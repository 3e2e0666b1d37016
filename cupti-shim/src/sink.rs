//! The queue between CUPTI's threads and the sender thread, and the loss counts that travel
//! with it. Producers (CUPTI's buffer-completion thread, flushing threads) only `try_send` into
//! a bounded queue; when it is full or no agent listens, records are dropped and counted, and
//! the count travels in the next batch that does get through.
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{SyncSender, TrySendError},
    },
    time::{Duration, Instant},
};

use inferscope_proto::v1::shim::{Kernel, Memcpy};

pub(crate) struct Batch {
    pub kernels: Vec<Kernel>,
    pub memcpys: Vec<Memcpy>,
}

#[derive(Default)]
pub(crate) struct Totals {
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
    pub cupti_dropped: AtomicU64,
    pub unjoined: AtomicU64,
}

pub(crate) struct Sink {
    tx: SyncSender<Batch>,
    connected: AtomicBool,
    stopping: AtomicBool,
    stopped: AtomicBool,
    /// Losses not yet reported to the agent.
    pending_dropped: AtomicU64,
    pending_cupti_dropped: AtomicU64,
    pub totals: Totals,
}

impl Sink {
    pub(crate) fn new(tx: SyncSender<Batch>) -> Self {
        Sink {
            tx,
            connected: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            pending_dropped: AtomicU64::new(0),
            pending_cupti_dropped: AtomicU64::new(0),
            totals: Totals::default(),
        }
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// [`Self::stop`] was called: write what is queued, then stop.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// The sender thread has ended.
    pub(crate) fn set_stopped(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Losses not yet reported to the agent (dropped, dropped by CUPTI), which the caller now
    /// reports.
    pub(crate) fn take_pending(&self) -> (u64, u64) {
        (
            self.pending_dropped.swap(0, Ordering::Relaxed),
            self.pending_cupti_dropped.swap(0, Ordering::Relaxed),
        )
    }

    /// Puts back losses taken with [`Self::take_pending`] whose report did not get through.
    pub(crate) fn restore_pending(&self, dropped: u64, cupti_dropped: u64) {
        self.pending_dropped.fetch_add(dropped, Ordering::Relaxed);
        self.pending_cupti_dropped
            .fetch_add(cupti_dropped, Ordering::Relaxed);
    }

    pub(crate) fn push(&self, kernels: Vec<Kernel>, memcpys: Vec<Memcpy>) {
        let n = (kernels.len() + memcpys.len()) as u64;
        match self.tx.try_send(Batch { kernels, memcpys }) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.add_dropped(n),
        }
    }

    pub(crate) fn add_dropped(&self, n: u64) {
        self.pending_dropped.fetch_add(n, Ordering::Relaxed);
        self.totals.dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_cupti_dropped(&self, n: u64) {
        self.pending_cupti_dropped.fetch_add(n, Ordering::Relaxed);
        self.totals.cupti_dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_unjoined(&self, n: u64) {
        self.totals.unjoined.fetch_add(n, Ordering::Relaxed);
    }

    /// Asks the sender to write what is queued and stop; waits at most `wait`.
    pub(crate) fn stop(&self, wait: Duration) {
        self.stopping.store(true, Ordering::Release);
        let deadline = Instant::now() + wait;
        while !self.stopped.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
