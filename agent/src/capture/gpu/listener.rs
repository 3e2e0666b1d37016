//! The agent end of the shim socket. One accept thread and one reader thread per shim (bounded);
//! readers decode batches and push records into bounded queues the pipeline drains without
//! blocking. Every drop, rejection and parse failure is counted.
use std::{
    collections::VecDeque,
    io::{ErrorKind, Read},
    os::unix::{
        fs::PermissionsExt,
        io::AsRawFd,
        net::{UnixListener, UnixStream},
    },
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use inferscope_decode::shim::{FrameDecoder, FrameError};
use inferscope_model::Counter;

use super::record::{KernelRecord, MemcpyRecord};

#[derive(Debug, Clone)]
pub(crate) struct ListenerConfig {
    pub path: PathBuf,
    /// Socket file mode: 0o600 (same user only) or 0o660 (plus the socket's group).
    pub mode: u32,
    /// Kernel records held for the pipeline; beyond this new records are dropped and counted.
    pub queue_capacity: usize,
    pub max_connections: usize,
    /// A connection that has not sent a whole message for this long is closed, so idle or
    /// hostile peers cannot hold the connection slots (a real shim sends its hello at once).
    pub idle_timeout: Duration,
    /// Bytes of partial messages all connections together may hold; a connection that would
    /// take the total past it is closed (each one is also capped by `MAX_MESSAGE_BYTES`).
    pub max_buffered_bytes: usize,
}

impl ListenerConfig {
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        ListenerConfig {
            path: path.into(),
            mode: 0o600,
            queue_capacity: 262_144,
            max_connections: 256,
            idle_timeout: Duration::from_secs(300),
            max_buffered_bytes: 16 << 20,
        }
    }
}

/// What a shim said about itself when it connected.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ShimInfo {
    pub pid: u32,
    pub claimed_pid: u32,
    pub shim_version: String,
    pub clock_source: String,
    pub cupti_version: u32,
    pub cuda_driver_version: i32,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    connections_rejected: AtomicU64,
    batches: AtomicU64,
    kernels: AtomicU64,
    memcpys: AtomicU64,
    parse_failures: AtomicU64,
    oversize_or_bad_length: AtomicU64,
    queue_drops: AtomicU64,
    shim_dropped: AtomicU64,
    shim_cupti_dropped: AtomicU64,
    read_errors: AtomicU64,
    idle_closed: AtomicU64,
    over_budget: AtomicU64,
}

struct Shared {
    stop: AtomicBool,
    active: AtomicU64,
    /// Bytes of partial messages held by all readers.
    buffered: AtomicU64,
    /// The socket file this listener bound (removed at drop only if still that file).
    bound: Option<crate::capture::process::sockpath::Bound>,
    kernels: Mutex<VecDeque<KernelRecord>>,
    memcpys: Mutex<VecDeque<MemcpyRecord>>,
    shims: Mutex<Vec<ShimInfo>>,
    counters: Counters,
    config: ListenerConfig,
}

pub(crate) struct ShimListener {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ListenerError {
    #[error("creating the socket directory {0}: {1} (run as root or pick another --socket)")]
    Dir(PathBuf, std::io::Error),
    #[error("the shim socket: {0}")]
    Claim(#[from] crate::capture::process::sockpath::ClaimError),
    #[error("binding the shim socket {0}: {1}")]
    Bind(PathBuf, std::io::Error),
    #[error("setting permissions on {0}: {1}")]
    Perms(PathBuf, std::io::Error),
    #[error("starting the accept thread: {0}")]
    Thread(std::io::Error),
}

const POLL: Duration = Duration::from_millis(20);

impl ShimListener {
    pub(crate) fn bind(config: ListenerConfig) -> Result<Self, ListenerError> {
        let path = config.path.clone();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| ListenerError::Dir(dir.into(), e))?;
        }
        // A stale socket of ours is replaced; a live one (another agent) or anything else is not.
        crate::capture::process::sockpath::claim(&path)?;
        let listener =
            UnixListener::bind(&path).map_err(|e| ListenerError::Bind(path.clone(), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(config.mode))
            .map_err(|e| ListenerError::Perms(path.clone(), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ListenerError::Bind(path.clone(), e))?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            active: AtomicU64::new(0),
            buffered: AtomicU64::new(0),
            bound: crate::capture::process::sockpath::Bound::new(&path),
            kernels: Mutex::new(VecDeque::new()),
            memcpys: Mutex::new(VecDeque::new()),
            shims: Mutex::new(Vec::new()),
            counters: Counters::default(),
            config,
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("shim-accept".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(ListenerError::Thread)?;
        Ok(ShimListener {
            shared,
            accept: Some(accept),
        })
    }

    /// Moves every queued kernel record into `out`; never blocks on a reader.
    pub(crate) fn drain(&self, out: &mut Vec<KernelRecord>) {
        if let Ok(mut q) = self.shared.kernels.lock() {
            out.extend(q.drain(..));
        }
    }

    pub(crate) fn drain_memcpys(&self, out: &mut Vec<MemcpyRecord>) {
        if let Ok(mut q) = self.shared.memcpys.lock() {
            out.extend(q.drain(..));
        }
    }

    /// Shims that have connected so far (bounded by `max_connections` entries kept).
    pub(crate) fn shims(&self) -> Vec<ShimInfo> {
        self.shared
            .shims
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            (Counter::ShimConnections, get(&c.connections)),
            (Counter::ShimConnectionsActive, get(&self.shared.active)),
            (Counter::ShimConnectionsIdleClosed, get(&c.idle_closed)),
            (Counter::ShimConnectionsOverBudget, get(&c.over_budget)),
            (Counter::ShimBufferedBytes, get(&self.shared.buffered)),
            (
                Counter::ShimConnectionsRejected,
                get(&c.connections_rejected),
            ),
            (Counter::ShimBatches, get(&c.batches)),
            (Counter::ShimKernelsReceived, get(&c.kernels)),
            (Counter::ShimMemcpysReceived, get(&c.memcpys)),
            (Counter::ShimParseFailures, get(&c.parse_failures)),
            (Counter::ShimBadFrames, get(&c.oversize_or_bad_length)),
            (Counter::ShimReadErrors, get(&c.read_errors)),
            (Counter::ShimQueueDrops, get(&c.queue_drops)),
            (Counter::ShimDroppedRecords, get(&c.shim_dropped)),
            (Counter::ShimCuptiDroppedRecords, get(&c.shim_cupti_dropped)),
        ]
    }
}

impl Drop for ShimListener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        if let Some(bound) = &self.shared.bound {
            bound.remove();
        }
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                if shared.active.load(Ordering::Relaxed) >= shared.config.max_connections as u64 {
                    shared
                        .counters
                        .connections_rejected
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                shared.active.fetch_add(1, Ordering::Relaxed);
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("shim-reader".into())
                    .spawn(move || {
                        read_loop(stream, &s);
                        s.active.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    shared.active.fetch_sub(1, Ordering::Relaxed);
                    shared
                        .counters
                        .connections_rejected
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!("accepting a shim connection failed: {e}");
                std::thread::sleep(POLL);
            }
        }
    }
}

/// The pid of the process at the other end, from the kernel (not from what the peer claims).
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid fd, out-pointer and length for SO_PEERCRED.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

fn read_loop(stream: UnixStream, shared: &Shared) {
    let mut held = 0u64;
    read_messages(stream, shared, &mut held);
    // Whatever this connection still held is released with it.
    shared.buffered.fetch_sub(held, Ordering::Relaxed);
}

fn read_messages(mut stream: UnixStream, shared: &Shared, held: &mut u64) {
    let c = &shared.counters;
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let pid = peer_pid(&stream).unwrap_or(0);
    let mut decoder = FrameDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_message = std::time::Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        if last_message.elapsed() >= shared.config.idle_timeout {
            c.idle_closed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let n = match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                c.read_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        decoder.push(buf.get(..n).unwrap_or_default());
        if !account(shared, held, decoder.buffered()) {
            c.over_budget.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "shim connection from pid {pid} closed: partial messages of all shims would exceed {} bytes",
                shared.config.max_buffered_bytes
            );
            return;
        }
        loop {
            match decoder.next_batch() {
                Ok(None) => break,
                Ok(Some(batch)) => {
                    last_message = std::time::Instant::now();
                    accept_batch(shared, pid, batch);
                }
                Err(FrameError::Decode) => {
                    c.parse_failures.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    // The stream cannot be resynchronised: drop this connection.
                    c.oversize_or_bad_length.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("shim connection from pid {pid} closed: {e}");
                    return;
                }
            }
        }
        decoder.release();
        account(shared, held, decoder.buffered());
    }
}

/// Moves this connection's share of the global partial-message budget to `now` bytes; false
/// when that would take the total past the budget.
fn account(shared: &Shared, held: &mut u64, now: usize) -> bool {
    let now = now as u64;
    if now > *held {
        let grow = now - *held;
        let total = shared.buffered.fetch_add(grow, Ordering::Relaxed) + grow;
        *held = now;
        total <= shared.config.max_buffered_bytes as u64
    } else {
        shared.buffered.fetch_sub(*held - now, Ordering::Relaxed);
        *held = now;
        true
    }
}

fn accept_batch(shared: &Shared, pid: u32, batch: inferscope_proto::v1::shim::KernelBatch) {
    let c = &shared.counters;
    c.batches.fetch_add(1, Ordering::Relaxed);
    c.shim_dropped
        .fetch_add(batch.dropped_records, Ordering::Relaxed);
    c.shim_cupti_dropped
        .fetch_add(batch.cupti_dropped_records, Ordering::Relaxed);
    if let Some(h) = batch.hello {
        tracing::info!(
            pid,
            clock = %h.clock_source,
            cupti = h.cupti_version,
            "CUPTI shim connected"
        );
        if let Ok(mut shims) = shared.shims.lock()
            && shims.len() < shared.config.max_connections
        {
            shims.push(ShimInfo {
                pid,
                claimed_pid: h.pid,
                shim_version: h.shim_version,
                clock_source: h.clock_source,
                cupti_version: h.cupti_version,
                cuda_driver_version: h.cuda_driver_version,
            });
        }
    }
    c.kernels
        .fetch_add(batch.kernels.len() as u64, Ordering::Relaxed);
    c.memcpys
        .fetch_add(batch.memcpys.len() as u64, Ordering::Relaxed);
    let cap = shared.config.queue_capacity;
    if !batch.kernels.is_empty()
        && let Ok(mut q) = shared.kernels.lock()
    {
        for k in batch.kernels {
            if q.len() >= cap {
                c.queue_drops.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.push_back(KernelRecord::from_proto(pid, k));
        }
    }
    if !batch.memcpys.is_empty()
        && let Ok(mut q) = shared.memcpys.lock()
    {
        for m in batch.memcpys {
            if q.len() >= cap {
                c.queue_drops.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.push_back(MemcpyRecord::from_proto(pid, m));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use inferscope_proto::v1::shim::{Hello, Kernel, KernelBatch};
    use prost::Message;

    use super::*;

    fn wait_for(l: &ShimListener, n: usize) -> Vec<KernelRecord> {
        let mut out = Vec::new();
        for _ in 0..200 {
            l.drain(&mut out);
            if out.len() >= n {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        out
    }

    #[test]
    fn receives_batches_counts_failures_and_bounds_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/shim.sock");
        let mut cfg = ListenerConfig::new(&path);
        cfg.queue_capacity = 3;
        cfg.mode = 0o600;
        let l = ShimListener::bind(cfg).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mut s = UnixStream::connect(&path).unwrap();
        let batch = KernelBatch {
            hello: Some(Hello {
                pid: 1,
                clock_source: "timestamp_callback".into(),
                ..Default::default()
            }),
            kernels: (0..5)
                .map(|i| Kernel {
                    name: format!("k{i}"),
                    ..Default::default()
                })
                .collect(),
            dropped_records: 7,
            ..Default::default()
        };
        s.write_all(&[2, 0xff, 0xff]).unwrap(); // undecodable, skipped
        s.write_all(&batch.encode_length_delimited_to_vec())
            .unwrap();
        let got = wait_for(&l, 3);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].pid, std::process::id());
        let counters: std::collections::HashMap<_, _> = l.counters().into_iter().collect();
        assert_eq!(counters[&Counter::ShimQueueDrops], 2);
        assert_eq!(counters[&Counter::ShimParseFailures], 1);
        assert_eq!(counters[&Counter::ShimDroppedRecords], 7);
        assert_eq!(l.shims().len(), 1);
        // An oversize length closes that connection only.
        s.write_all(&[0xff, 0xff, 0xff, 0x7f]).unwrap();
        let mut s2 = UnixStream::connect(&path).unwrap();
        s2.write_all(&KernelBatch::default().encode_length_delimited_to_vec())
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let counters: std::collections::HashMap<_, _> = l.counters().into_iter().collect();
        assert_eq!(counters[&Counter::ShimBadFrames], 1);
        assert_eq!(counters[&Counter::ShimBatches], 2);
        drop(l);
        assert!(!path.exists());
    }

    /// Hostile peers: connections that never send a message are closed after the idle
    /// timeout, and partial messages of all connections together stay within the budget.
    #[test]
    fn idle_and_greedy_clients_are_closed_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shim.sock");
        let mut cfg = ListenerConfig::new(&path);
        cfg.idle_timeout = Duration::from_millis(400);
        cfg.max_buffered_bytes = 256 * 1024;
        let l = ShimListener::bind(cfg).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the default socket mode is owner-only");
        let _idle: Vec<UnixStream> = (0..4)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let mut greedy: Vec<UnixStream> = Vec::new();
        for _ in 0..3 {
            let mut s = UnixStream::connect(&path).unwrap();
            let mut prefix = Vec::new();
            prost::encoding::encode_varint(3 << 20, &mut prefix);
            let _ = s.write_all(&prefix);
            let _ = s.write_all(&vec![0u8; 200 * 1024]);
            greedy.push(s);
        }
        let counters =
            || -> std::collections::HashMap<Counter, u64> { l.counters().into_iter().collect() };
        for _ in 0..100 {
            if counters()[&Counter::ShimConnections] >= 7 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut peak = 0;
        for _ in 0..100 {
            let c = counters();
            peak = peak.max(c[&Counter::ShimBufferedBytes]);
            if c[&Counter::ShimConnectionsActive] == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let c = counters();
        assert_eq!(c[&Counter::ShimConnectionsActive], 0, "{c:?}");
        assert!(c[&Counter::ShimConnectionsOverBudget] >= 1, "{c:?}");
        assert!(c[&Counter::ShimConnectionsIdleClosed] >= 4, "{c:?}");
        // A reader may overshoot by one read (64 KiB) before it sees the total.
        assert!(peak <= (256 + 3 * 64) * 1024, "peak {peak}");
        assert_eq!(c[&Counter::ShimBufferedBytes], 0);
    }
}
