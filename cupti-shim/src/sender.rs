//! Transport to the agent: length-delimited `KernelBatch` messages over a Unix stream socket.
//!
//! One background thread owns the socket and drains the queue of [`crate::sink::Sink`].
//! Reconnection backs off from 100 ms to 5 s. While disconnected the sender neither flushes CUPTI
//! nor encodes anything, and completed buffers are only counted (see activity.rs).
use std::{
    io::Write,
    os::unix::net::UnixStream,
    sync::{
        atomic::Ordering,
        mpsc::{Receiver, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

use inferscope_proto::v1::shim::{Hello, KernelBatch};
use prost::Message;

use crate::{sink::Batch, state::Shim};

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
const CALIBRATE_EVERY: Duration = Duration::from_secs(1);

/// The sender thread's loop.
pub(crate) fn run(st: &Shim, rx: Receiver<Batch>, first: Option<UnixStream>) {
    let sink = &st.sink;
    let mut stream = first;
    let mut backoff = BACKOFF_MIN;
    let mut next_attempt = Instant::now();
    let mut last_flush = Instant::now();
    let mut last_calibration = Instant::now();
    let tick = st.config.flush_interval.min(BACKOFF_MIN);
    loop {
        let stopping = sink.is_stopping();
        if stream.is_none() && Instant::now() >= next_attempt {
            stream = connect(st);
            if stream.is_some() {
                backoff = BACKOFF_MIN;
                sink.set_connected(true);
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
                    let (dropped_records, cupti_dropped_records) = sink.take_pending();
                    let msg = KernelBatch {
                        hello: None,
                        kernels: batch.kernels,
                        memcpys: batch.memcpys,
                        dropped_records,
                        cupti_dropped_records,
                    };
                    if write(s, &msg) {
                        sink.totals.sent.fetch_add(n, Ordering::Relaxed);
                    } else {
                        // Put the loss counts back and count this batch; reconnect later.
                        sink.restore_pending(msg.dropped_records, msg.cupti_dropped_records);
                        sink.add_dropped(n);
                        stream = None;
                        sink.set_connected(false);
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
        let (dropped, cupti_dropped) = sink.take_pending();
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
    sink.set_connected(false);
    sink.set_stopped();
}

pub(crate) fn connect(st: &Shim) -> Option<UnixStream> {
    let mut s = UnixStream::connect(&st.config.socket).ok()?;
    s.set_write_timeout(Some(WRITE_TIMEOUT)).ok()?;
    let (dropped_records, cupti_dropped_records) = st.sink.take_pending();
    let hello = KernelBatch {
        hello: Some(Hello {
            pid: std::process::id(),
            shim_version: env!("CARGO_PKG_VERSION").to_string(),
            clock_source: st.clock.source().to_string(),
            cupti_version: st.cupti_version,
            cuda_driver_version: st.driver_version,
        }),
        dropped_records,
        cupti_dropped_records,
        ..Default::default()
    };
    if write(&mut s, &hello) {
        Some(s)
    } else {
        st.sink
            .restore_pending(hello.dropped_records, hello.cupti_dropped_records);
        None
    }
}

fn write(s: &mut UnixStream, msg: &KernelBatch) -> bool {
    let buf = msg.encode_length_delimited_to_vec();
    s.write_all(&buf).is_ok()
}
