//! Wires capture → decode → correlate → export on one thread: a ring-buffer record is decoded
//! and correlated where it is read, with no queue between stages to size or drop from.
use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use inferscope_common::{Counter, SyscallKind};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use crate::{
    capture::{
        CaptureConfig, CaptureError, CapturedEvent, Discovery, DiscoveryChange, FdClass,
        FdClassifier, SocketProbes, TargetSelector, records, records::SyscallEvent, sched_hooks,
    },
    correlate::{Peer, RequestRecord, Stats, StepRecord, Tracker, monotonic_now_ns},
    decode::{http::Limits, zmtp},
    engines::{IpcBytes, IpcDirection, IpcRouter, IpcVerdict},
};

#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub selector: TargetSelector,
    pub capture: CaptureConfig,
    pub limits: Limits,
    /// How often /proc is scanned for engines that started, restarted or exited.
    pub discovery_interval: Duration,
}

impl PipelineConfig {
    pub fn new(selector: TargetSelector) -> Self {
        Self {
            selector,
            capture: CaptureConfig::default(),
            limits: Limits::default(),
            discovery_interval: Duration::from_millis(500),
        }
    }
}

/// What the pipeline reports as it runs.
pub trait Observer {
    fn on_record(&mut self, record: RequestRecord);
    /// An engine step finished (scheduler hooks).
    fn on_step(&mut self, _step: StepRecord) {}
    /// Discovery attached to or detached from processes.
    fn on_discovery(&mut self, _change: &DiscoveryChange) {}
}

pub struct Pipeline {
    config: PipelineConfig,
    probes: SocketProbes,
    discovery: Discovery,
    classifier: FdClassifier,
    tracker: Tracker,
    /// Listening ports per traced process; looked up per record.
    ports: FxHashMap<u32, Vec<u16>>,
    /// IPC decoders, one per engine kind that has one (engines::Engine::ipc).
    ipc: IpcRouter,
    stats: Stats,
    records: Vec<RequestRecord>,
    steps: Vec<StepRecord>,
    /// Kernel ring-buffer drops seen so far.
    ringbuf_drops: u64,
    /// Ring-buffer records read (a plain field: it counts every record).
    records_read: u64,
}

impl Pipeline {
    pub fn new(config: PipelineConfig) -> Result<Self, CaptureError> {
        let probes = SocketProbes::load(config.capture)?;
        Ok(Self {
            discovery: Discovery::new(config.selector.clone()),
            tracker: Tracker::new(config.limits),
            config,
            probes,
            classifier: FdClassifier::default(),
            ports: FxHashMap::default(),
            ipc: IpcRouter::default(),
            stats: Stats::default(),
            records: Vec::new(),
            steps: Vec::new(),
            ringbuf_drops: 0,
            records_read: 0,
        })
    }

    /// Runs until `stop` is set or `deadline` passes, then reports open requests as aborted.
    pub fn run(
        &mut self,
        observer: &mut dyn Observer,
        stop: &AtomicBool,
        deadline: Option<Instant>,
    ) -> std::io::Result<()> {
        let mut last_scan: Option<Instant> = None;
        let mut last_sweep = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            if last_scan.is_none_or(|t| t.elapsed() >= self.config.discovery_interval) {
                let change = self.discovery.scan();
                self.apply_discovery(&change, observer);
                last_scan = Some(Instant::now());
            }
            wait_readable(self.probes.events_fd(), Duration::from_millis(50))?;
            self.drain(observer);
            if last_sweep.elapsed() >= Duration::from_secs(1) {
                self.probes.flush_logs();
                self.tracker.sweep(monotonic_now_ns());
                last_sweep = Instant::now();
            }
        }
        self.drain(observer);
        self.tracker
            .finish_all(monotonic_now_ns(), &mut self.records);
        self.emit_records(observer);
        Ok(())
    }

    fn apply_discovery(&mut self, change: &DiscoveryChange, observer: &mut dyn Observer) {
        for gone in &change.removed {
            info!(
                pid = gone.tgid,
                engine = gone.engine,
                "engine process gone; detaching"
            );
            self.probes.untrace_process(gone.tgid);
            self.probes.detach_uprobes(gone.tgid);
            for port in &gone.ports {
                self.probes.unwatch_port(*port);
            }
            self.ports.remove(&gone.tgid);
            self.ipc.forget_process(gone.tgid);
            self.classifier.forget_process(gone.tgid);
            self.tracker
                .forget_process(gone.tgid, monotonic_now_ns(), &mut self.records);
        }
        for (now, before) in &change.ports_changed {
            for port in before {
                self.probes.unwatch_port(*port);
            }
            for port in &now.ports {
                self.probes.watch_port(*port);
            }
            self.ports.insert(now.tgid, now.ports.clone());
        }
        for new in &change.added {
            info!(pid = new.tgid, engine = new.engine, ports = ?new.ports, "tracing engine process");
            for port in &new.ports {
                self.probes.watch_port(*port);
            }
            self.ports.insert(new.tgid, new.ports.clone());
            self.tracker.set_engine(new.tgid, new.engine);
            self.ipc.add_process(new.tgid, new.engine);
            self.probes.trace_process(new.tgid);
            sched_hooks::attach(&mut self.probes, new);
        }
        if !change.added.is_empty()
            || !change.removed.is_empty()
            || !change.ports_changed.is_empty()
        {
            observer.on_discovery(change);
        }
        self.emit_records(observer);
    }

    /// Hands finished records to the observer, with what their engine's IPC knows added.
    fn emit_records(&mut self, observer: &mut dyn Observer) {
        for mut record in self.records.drain(..) {
            self.ipc.enrich(&mut record);
            observer.on_record(record);
        }
    }

    fn drain(&mut self, observer: &mut dyn Observer) {
        let Self {
            probes,
            classifier,
            tracker,
            ports,
            stats,
            records,
            steps,
            ringbuf_drops,
            records_read,
            ipc,
            ..
        } = self;
        let mut ignore: Vec<(u32, i32, u64)> = Vec::new();
        // Bound one drain so discovery and shutdown still run under a flood.
        for n in 0..1_000_000u32 {
            // A drop happened before the records that follow it: look before reading them.
            if n % 1024 == 0 {
                let drops = probes.counter(Counter::RingbufFull);
                if drops > *ringbuf_drops {
                    *ringbuf_drops = drops;
                    tracker.note_capture_loss(monotonic_now_ns());
                }
            }
            let Some(item) = probes.events().next() else {
                break;
            };
            *records_read += 1;
            match records::parse(&item) {
                Err(e) => stats.bump(e.as_str()),
                Ok(CapturedEvent::Segment(segment)) => tracker.on_segment(&segment),
                Ok(CapturedEvent::Sched(event)) => tracker.on_sched(&event, steps),
                Ok(CapturedEvent::Syscall(ev)) => {
                    let Some(listening) = ports.get(&ev.tgid) else {
                        // A record from a process detached a moment ago.
                        stats.bump("records_untraced_process");
                        continue;
                    };
                    match ev.kind {
                        SyscallKind::Accept => {
                            classifier.on_accept(ev.tgid, ev.ret as i32);
                            tracker.on_accept(&ev, Peer::default(), records);
                        }
                        SyscallKind::Close => {
                            ipc.on_close(ev.tgid, ev.fd);
                            tracker.on_close(&ev, records);
                            classifier.on_close(ev.tgid, ev.fd);
                        }
                        SyscallKind::Read | SyscallKind::Write => {
                            let first_read = (ev.kind == SyscallKind::Read).then_some(ev.payload);
                            let wants_ipc = ipc
                                .wants(ev.tgid)
                                .then(|| zmtp::looks_like_zmtp(ev.payload) && ev.lost_bytes() == 0);
                            match classifier
                                .classify(ev.tgid, ev.fd, listening, first_read, wants_ipc)
                            {
                                FdClass::Ipc if ev.ret > 0 => {
                                    if ipc.on_bytes(&ipc_bytes(&ev), steps) == IpcVerdict::NotIpc {
                                        stats.bump("records_not_engine_ipc");
                                        ignore.push((ev.tgid, ev.fd, ev.conn_gen));
                                    }
                                }
                                // EOF or an error: nothing to decode.
                                FdClass::Ipc => {}
                                FdClass::Other => {
                                    stats.bump("records_not_server_connection");
                                    ignore.push((ev.tgid, ev.fd, ev.conn_gen));
                                }
                                FdClass::Server { local_port, remote } => {
                                    let peer = Peer { local_port, remote };
                                    if ev.kind == SyscallKind::Read {
                                        tracker.on_read(&ev, peer, records);
                                    } else {
                                        tracker.on_write(&ev, peer, records);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for (tgid, fd, conn_gen) in tracker.take_ignored() {
            // Not HTTP on a listening port of an engine with IPC: a ZeroMQ tcp:// connection
            // joined after its greeting. Its IPC decoder looks for a frame boundary.
            if ipc.wants(tgid) && classifier.reroute_to_ipc(tgid, fd) {
                stats.bump("connections_rerouted_to_ipc");
            } else {
                ignore.push((tgid, fd, conn_gen));
            }
        }
        for (tgid, fd, conn_gen) in ignore {
            probes.ignore_connection(tgid, fd, conn_gen);
        }
        for mut record in records.drain(..) {
            ipc.enrich(&mut record);
            observer.on_record(record);
        }
        for step in steps.drain(..) {
            observer.on_step(step);
        }
    }

    /// Every counter: kernel side (`kernel_*`), capture and decode/correlate.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> = self
            .probes
            .counters()
            .into_iter()
            .map(|(k, v)| (format!("kernel_{k}"), v))
            .collect();
        all.extend(self.stats.iter().map(|(k, v)| (k.to_string(), v)));
        all.extend(self.tracker.stats().iter().map(|(k, v)| (k.to_string(), v)));
        all.extend(self.ipc.counters());
        all.push(("ringbuf_records".into(), self.records_read));
        all.push(("fd_lookups".into(), self.classifier.lookups));
        all.push((
            "open_connections".into(),
            self.tracker.open_connections() as u64,
        ));
        all
    }

    pub fn log_counters(&self) {
        for (name, value) in self.counters() {
            if value > 0 {
                info!(counter = name.as_str(), value, "counter");
            }
        }
        let dropped = self.probes.counter(Counter::RingbufFull);
        if dropped > 0 {
            warn!(
                "{dropped} kernel records were dropped because the ring buffer was full; raise --ring-buffer-mb"
            );
        }
    }
}

/// One captured syscall as the engines' IPC decoders see it.
fn ipc_bytes<'a>(ev: &SyscallEvent<'a>) -> IpcBytes<'a> {
    // A failed copy loses the whole syscall.
    let (data, lost) = if ev.copy_failed {
        (&[][..], ev.ret.max(0) as u64)
    } else {
        (ev.payload, ev.lost_bytes())
    };
    IpcBytes {
        tgid: ev.tgid,
        tid: ev.tid,
        fd: ev.fd,
        conn_gen: ev.conn_gen,
        direction: if ev.kind == SyscallKind::Read {
            IpcDirection::Read
        } else {
            IpcDirection::Write
        },
        data,
        lost,
    }
}

fn wait_readable(fd: i32, timeout: Duration) -> std::io::Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}
