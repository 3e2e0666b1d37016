//! Transport to the agent: length-delimited `KernelBatch` messages over a Unix stream socket.
//!
//! Producers (CUPTI's buffer-completion thread, flushing threads) only `try_send` into a bounded
//! queue; one background thread owns the socket. When the queue is full or no agent listens, the
//! records are dropped and counted, and the count travels in the next batch that does get through.
//! Reconnection backs off from 100 ms to 5 s. While disconnected the sender neither flushes CUPTI
//! nor encodes anything, and completed buffers are only counted (see activity.rs).
use std::{
    io::Write,
    os::unix::net::UnixStream,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    time::{Duration, Instant},
};

use inferscope_proto::v1::shim::{Hello, Kernel, KernelBatch, Memcpy};
use prost::Message;

use crate::init::state;

pub struct Batch {
    kernels: Vec<Kernel>,
    memcpys: Vec<Memcpy>,
}

#[derive(Default)]
pub struct Totals {
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
    pub cupti_dropped: AtomicU64,
    pub unjoined: AtomicU64,
}

pub struct Sink {
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
    pub fn new(tx: SyncSender<Batch>) -> Self {
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

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    pub fn set_connected(&self) {
        self.connected.store(true, Ordering::Relaxed);
    }

    pub fn push(&self, kernels: Vec<Kernel>, memcpys: Vec<Memcpy>) {
        let n = (kernels.len() + memcpys.len()) as u64;
        match self.tx.try_send(Batch { kernels, memcpys }) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.add_dropped(n),
        }
    }

    pub fn add_dropped(&self, n: u64) {
        self.pending_dropped.fetch_add(n, Ordering::Relaxed);
        self.totals.dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_cupti_dropped(&self, n: u64) {
        self.pending_cupti_dropped.fetch_add(n, Ordering::Relaxed);
        self.totals.cupti_dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_unjoined(&self, n: u64) {
        self.totals.unjoined.fetch_add(n, Ordering::Relaxed);
    }

    /// Asks the sender to write what is queued and stop; waits at most `wait`.
    pub fn stop(&self, wait: Duration) {
        self.stopping.store(true, Ordering::Release);
        let deadline = Instant::now() + wait;
        while !self.stopped.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
const CALIBRATE_EVERY: Duration = Duration::from_secs(1);

/// The sender thread's loop.
pub fn run(rx: Receiver<Batch>, first: Option<UnixStream>) {
    let Some(st) = state() else { return };
    let sink = &st.sink;
    let mut stream = first;
    let mut backoff = BACKOFF_MIN;
    let mut next_attempt = Instant::now();
    let mut last_flush = Instant::now();
    let mut last_calibration = Instant::now();
    let tick = st.config.flush_interval.min(BACKOFF_MIN);
    loop {
        let stopping = sink.stopping.load(Ordering::Acquire);
        if stream.is_none() && Instant::now() >= next_attempt {
            stream = connect(st);
            if stream.is_some() {
                backoff = BACKOFF_MIN;
                sink.connected.store(true, Ordering::Relaxed);
            } else {
                next_attempt = Instant::now() + backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
        let batch = if stopping {
            match rx.try_recv() {
                Ok(b) => Some(b),
                Err(_) => break,
            }
        } else {
            match rx.recv_timeout(tick) {
                Ok(b) => Some(b),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        if let Some(batch) = batch {
            let n = (batch.kernels.len() + batch.memcpys.len()) as u64;
            match stream.as_mut() {
                Some(s) => {
                    let msg = KernelBatch {
                        hello: None,
                        kernels: batch.kernels,
                        memcpys: batch.memcpys,
                        dropped_records: sink.pending_dropped.swap(0, Ordering::Relaxed),
                        cupti_dropped_records: sink
                            .pending_cupti_dropped
                            .swap(0, Ordering::Relaxed),
                    };
                    if write(s, &msg) {
                        sink.totals.sent.fetch_add(n, Ordering::Relaxed);
                    } else {
                        // Put the loss counts back and count this batch; reconnect later.
                        sink.pending_dropped
                            .fetch_add(msg.dropped_records, Ordering::Relaxed);
                        sink.pending_cupti_dropped
                            .fetch_add(msg.cupti_dropped_records, Ordering::Relaxed);
                        sink.add_dropped(n);
                        stream = None;
                        sink.connected.store(false, Ordering::Relaxed);
                        next_attempt = Instant::now() + backoff;
                    }
                }
                None => sink.add_dropped(n),
            }
        }
        if stream.is_some() && !stopping && last_flush.elapsed() >= st.config.flush_interval {
            last_flush = Instant::now();
            // Hands partly filled buffers to buffer_completed on this thread.
            // SAFETY: plain FFI call.
            unsafe { cudarc::cupti::sys::cuptiActivityFlushAll(0) };
        }
        if last_calibration.elapsed() >= CALIBRATE_EVERY {
            last_calibration = Instant::now();
            st.clock.calibrate();
        }
    }
    // A final batch carries losses that no kernel batch reported.
    if let Some(s) = stream.as_mut() {
        let dropped = sink.pending_dropped.swap(0, Ordering::Relaxed);
        let cupti_dropped = sink.pending_cupti_dropped.swap(0, Ordering::Relaxed);
        if dropped + cupti_dropped > 0 {
            let _ = write(
                s,
                &KernelBatch {
                    dropped_records: dropped,
                    cupti_dropped_records: cupti_dropped,
                    ..Default::default()
                },
            );
        }
    }
    sink.connected.store(false, Ordering::Relaxed);
    sink.stopped.store(true, Ordering::Release);
}

pub fn connect(st: &crate::init::Shim) -> Option<UnixStream> {
    let mut s = UnixStream::connect(&st.config.socket).ok()?;
    s.set_write_timeout(Some(WRITE_TIMEOUT)).ok()?;
    let hello = KernelBatch {
        hello: Some(Hello {
            pid: std::process::id(),
            shim_version: env!("CARGO_PKG_VERSION").to_string(),
            clock_source: st.clock.source().to_string(),
            cupti_version: st.cupti_version,
            cuda_driver_version: st.driver_version,
        }),
        dropped_records: st.sink.pending_dropped.swap(0, Ordering::Relaxed),
        cupti_dropped_records: st.sink.pending_cupti_dropped.swap(0, Ordering::Relaxed),
        ..Default::default()
    };
    write(&mut s, &hello).then_some(s)
}

fn write(s: &mut UnixStream, msg: &KernelBatch) -> bool {
    let buf = msg.encode_length_delimited_to_vec();
    s.write_all(&buf).is_ok()
}
