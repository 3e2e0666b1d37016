//! The pipeline, on one thread, in the order a record travels:
//!
//! ```text
//!  ring buffer ──Read──▶ route ──SyscallEvent──▶ correlate ──RequestRecord──▶ join ──RequestTimeline──▶ Sink
//!  (ring.rs)            (route.rs: HTTP to the    (Tracker; engine IPC      (identity, engine word,   (daemon: OTLP,
//!                        tracker, IPC to its        to its decoder → steps)   P/D stitch, metrics,      Prometheus, gRPC,
//!                        engine's decoder)                                    steps + kernels)          JSONL)
//!        ▲                                   │
//!        └──────────── Vec<KernelCommand> ◀──┘  (stop copying a connection, take sends whole,
//!                                               install a token template: applied once a drain)
//! ```
//!
//! Beside it: discovery and attaching (`attach.rs`), scrapes of the engines' metrics and the
//! shims' kernel records, both handed to the join; the one path that forgets a process
//! (`lifecycle.rs`). A record is read, routed and correlated where it is read, with no queue
//! between those stages to size or drop from; the join's queue is bounded and counted.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
mod attach;
mod lifecycle;
mod ring;
mod route;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use inferscope_common::Counter as KernelCounter;
use inferscope_decode::http::Limits;
use inferscope_model::{
    Counter, LaunchRecord, RequestRecord, Stats, StepRecord, clock::monotonic_now_ns,
};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use self::{
    attach::{Attach, LATE_ATTACH_INTERVAL},
    ring::{Flow, Read, Ring},
    route::{Routes, Sockets},
};
use crate::{
    capture::{
        CaptureConfig, CaptureError, CapturedEvent, Discovery, DiscoveryChange, FdClassifier,
        SocketProbes, TargetSelector,
        elf::user_probes::{ProbeSpec, UserProbes},
        gpu::{
            GpuSample, KernelFeed,
            launches::{LaunchBudget, StubNames},
        },
        kernel::{commands::KernelCommand, privileges::Privileges},
        metrics::{MetricsScraper, ScrapeConfig},
        process::{adopt::Adoption, late_attach::LateAttach},
    },
    correlate::{Tracker, launches::Launches},
    engines::{self, IpcRouter},
    join::{EngineMetricsRecord, Join, KernelRecord, RequestTimeline, TimelineLimits},
};

#[derive(Debug, Clone)]
pub(crate) struct PipelineConfig {
    pub selector: TargetSelector,
    pub capture: CaptureConfig,
    pub limits: Limits,
    /// How often /proc is scanned for engines that started, restarted or exited.
    pub discovery_interval: Duration,
    /// Also attach the engines' per-token hooks (one uprobe hit per generated token).
    pub token_hooks: bool,
    /// Attach the GPU launch probes to traced processes that map the CUDA driver or runtime.
    pub gpu_launches: bool,
    /// Share (percent) of a process's time its launch probes may cost before they are paused
    /// (see `LaunchBudget`; 0: never paused).
    pub gpu_launch_budget_pct: f64,
    /// Let the kernel summarise recognised token events (see `docs/src/token-events.md`);
    /// off, every response write is captured in full.
    pub token_events: bool,
    /// Attach the TLS library probes (OpenSSL's SSL_read/SSL_write) to traced processes, so
    /// HTTPS is recorded from its plaintext; off, TLS connections are counted as undecoded.
    pub tls: bool,
}

/// The launch budget unless the user sets another.
pub(crate) const DEFAULT_LAUNCH_BUDGET_PCT: f64 = 2.0;

impl PipelineConfig {
    pub(crate) fn new(selector: TargetSelector) -> Self {
        Self {
            selector,
            capture: CaptureConfig::default(),
            limits: Limits::default(),
            discovery_interval: Duration::from_millis(500),
            token_hooks: false,
            gpu_launches: true,
            gpu_launch_budget_pct: DEFAULT_LAUNCH_BUDGET_PCT,
            token_events: true,
            tls: true,
        }
    }
}

/// Where the pipeline's output goes: closed timelines, and what the exporters show beside them
/// (steps, kernels, launches, engine metrics, discovery, counters). The daemon fans it out to
/// every exporter (`daemon::FanOut`); `record` and `demo` write or print it.
pub(crate) trait Sink {
    /// A finished request, joined with everything the join stage waited for.
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>);
    /// An engine step finished (scheduler hooks).
    fn on_step(&mut self, _step: &StepRecord) {}
    /// A GPU kernel record from a CUPTI shim (with [`Pipeline::use_kernel_feed`]).
    fn on_kernel(&mut self, _kernel: &KernelRecord) {}
    /// A GPU kernel or graph launch (launch uprobes on the CUDA driver and runtime).
    fn on_launch(&mut self, _launch: &LaunchRecord) {}
    /// A scrape of an engine's metrics endpoint (with [`Pipeline::scrape_engine_metrics`]).
    fn on_engine_metrics(&mut self, _record: &EngineMetricsRecord) {}
    /// NVML's newest samples of every GPU (the daemon's own input, not the pipeline's).
    fn on_gpu(&mut self, _samples: &[GpuSample]) {}
    /// Discovery attached to or detached from processes.
    fn on_discovery(&mut self, _change: &DiscoveryChange) {}
    /// The pipeline forgot process `tgid` (detached, or adopted and given up) after handing
    /// on its last records: per-process state goes.
    fn on_process_gone(&mut self, _tgid: u32) {}
    /// Called on every pass of the loop (at least every 50 ms): time-driven work goes here.
    fn on_tick(&mut self) {}
    /// Every counter of the agent (see [`Pipeline::counters`]), about once a second.
    fn on_counters(&mut self, _counters: &[(Counter, u64)]) {}
    /// The sink's own counters, exported beside the pipeline's.
    fn counters(&self) -> Vec<(Counter, u64)> {
        Vec::new()
    }
    /// The agent stops: flush what is buffered.
    fn finish(&mut self) {}
}

pub(crate) struct Pipeline {
    config: PipelineConfig,
    ring: Ring,
    routes: Routes,
    correlated: Correlated,
    join: Join,
    attach: Attach,
    /// Kernel records from CUPTI shims (with [`Pipeline::use_kernel_feed`]).
    kernel_feed: Option<KernelFeed>,
    stats: Stats,
}

/// Correlate's state, and what one drain produced for the join.
pub(super) struct Correlated {
    pub tracker: Tracker,
    /// IPC decoders, one per engine kind that has one (engines::Engine::ipc).
    pub ipc: IpcRouter,
    /// GPU launches from the launch uprobes, named and joined to steps.
    pub launches: Launches,
    /// Names of runtime launches' host stubs, from the processes' symbols.
    pub stub_names: StubNames,
    pub records: Vec<RequestRecord>,
    pub steps: Vec<StepRecord>,
}

impl Pipeline {
    /// The loaded kernel programs, for the start-up preflight (`inferscope check`'s summary in
    /// `run`), before the loop starts.
    pub(crate) fn probes_mut(&mut self) -> &mut SocketProbes {
        &mut self.ring.probes
    }

    pub(crate) fn new(config: PipelineConfig) -> Result<Self, CaptureError> {
        let privileges = Privileges::read();
        if privileges.missing().is_empty() && privileges.btf && privileges.tracefs {
            info!("{}", privileges.summary());
        } else {
            warn!("{}", privileges.summary());
        }
        let probes = SocketProbes::load(config.capture)?;
        let mut tracker = Tracker::new(config.limits);
        tracker.set_learn_templates(config.token_events);
        Ok(Self {
            routes: Routes {
                ports: FxHashMap::default(),
                classifier: FdClassifier::new(probes.sock_hook()),
                adoption: Adoption::default(),
                tls: route::TlsProcesses::default(),
            },
            correlated: Correlated {
                tracker,
                ipc: IpcRouter::default(),
                launches: Launches::default(),
                stub_names: StubNames::default(),
                records: Vec::new(),
                steps: Vec::new(),
            },
            attach: Attach {
                discovery: Discovery::new(config.selector.clone(), engines::identify),
                late: LateAttach::default(),
                user_probes: None,
                gpu_workers: FxHashMap::default(),
                budget: LaunchBudget::new(config.gpu_launch_budget_pct),
                scraper: None,
            },
            ring: Ring::new(probes),
            join: Join::new(TimelineLimits::default()),
            kernel_feed: None,
            stats: Stats::default(),
            config,
        })
    }

    /// Names records' pods from this cache of the Kubernetes API (`identity::kube::start`);
    /// without it records carry container ids only.
    pub(crate) fn use_pod_store(&mut self, pods: std::sync::Arc<crate::identity::pods::PodStore>) {
        self.join.use_pod_store(pods);
    }

    /// Also joins the kernel records of CUPTI shims to the requests' steps (call before
    /// [`Pipeline::run`]).
    pub(crate) fn use_kernel_feed(&mut self, feed: KernelFeed) {
        self.kernel_feed = Some(feed);
    }

    /// Also scrapes every engine discovery finds at its own metrics endpoint (call before
    /// [`Pipeline::run`]): records go to [`Sink::on_engine_metrics`], and request records
    /// get the engine state they found on arrival.
    pub(crate) fn scrape_engine_metrics(&mut self, config: ScrapeConfig) -> std::io::Result<()> {
        self.attach.scraper = Some(MetricsScraper::start(config)?);
        // A request joins a scrape within two intervals of its arrival: scrapes land an
        // interval plus their own duration apart, and one may fail.
        let join_gap = 2 * config.interval.as_nanos() as u64;
        self.join.scrape_engine_metrics(join_gap);
        // Engines already attached (a call after run) are picked up too.
        let traced: Vec<_> = self
            .attach
            .discovery
            .traced()
            .map(|p| (p.tgid, p.engine, p.ports.clone()))
            .collect();
        for (pid, engine, ports) in traced {
            self.watch_metrics(pid, engine, &ports);
        }
        Ok(())
    }

    /// Also attaches the probes of a user-written spec to every traced process (call before
    /// [`Pipeline::run`]).
    pub(crate) fn use_probe_spec(&mut self, spec: ProbeSpec) -> Result<(), CaptureError> {
        let user = UserProbes::new(spec, &mut self.ring.probes).map_err(CaptureError::Config)?;
        self.attach.user_probes = Some(user);
        Ok(())
    }

    /// Runs until `stop` is set or `deadline` passes, then reports open requests as aborted.
    pub(crate) fn run(
        &mut self,
        sink: &mut dyn Sink,
        stop: &AtomicBool,
        deadline: Option<Instant>,
    ) -> std::io::Result<()> {
        self.run_until(sink, &mut |_| {
            stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d)
        })
    }

    /// Runs until `done` says so (asked on every pass of the loop, at least every 50 ms: a
    /// retiring agent keeps running until the requests it saw start have ended), then reports
    /// open requests as aborted.
    pub(crate) fn run_until(
        &mut self,
        sink: &mut dyn Sink,
        done: &mut dyn FnMut(&Pipeline) -> bool,
    ) -> std::io::Result<()> {
        let mut last_scan: Option<Instant> = None;
        let mut last_sweep = Instant::now();
        let mut last_late_attach = Instant::now();
        while !done(self) {
            if last_scan.is_none_or(|t| t.elapsed() >= self.config.discovery_interval) {
                self.scan(sink, last_scan.is_none());
                last_scan = Some(Instant::now());
            }
            wait_readable(self.ring.probes.events_fd(), Duration::from_millis(50))?;
            self.drain_metrics(sink);
            self.drain_kernels(sink);
            if self.drain(sink) == Flow::Stop {
                // The kernel adopted a process: attach it before reading its records.
                last_scan = None;
                continue;
            }
            sink.on_tick();
            if last_late_attach.elapsed() >= LATE_ATTACH_INTERVAL {
                self.probe_gpu_workers();
                self.attach_late_hooks();
                last_late_attach = Instant::now();
            }
            if last_sweep.elapsed() >= Duration::from_secs(1) {
                self.apply_launch_budget(last_sweep.elapsed());
                self.release_kept_ports();
                self.ring.probes.flush_logs();
                self.correlated.tracker.sweep(monotonic_now_ns());
                last_sweep = Instant::now();
                sink.on_counters(&self.counters());
            }
        }
        self.drain_metrics(sink);
        self.drain_kernels(sink);
        self.ring.last_drain = true;
        self.drain(sink);
        let correlated = &mut self.correlated;
        correlated
            .tracker
            .finish_all(monotonic_now_ns(), &mut correlated.records);
        hand_on(&mut self.join, correlated, sink, true);
        Ok(())
    }

    /// Open requests whose first bytes were read before `ts_ns` (monotonic clock).
    pub(crate) fn open_requests_read_before(&self, ts_ns: u64) -> usize {
        self.correlated.tracker.open_requests_read_before(ts_ns)
    }
    /// Scrapes the scraper thread finished, normalised into records (and kept for the join).
    fn drain_metrics(&mut self, sink: &mut dyn Sink) {
        let Some(scraper) = &self.attach.scraper else {
            return;
        };
        // Bounded like the ring-buffer drain; the scraper's own queue bounds it anyway.
        for _ in 0..1024 {
            let Some(s) = scraper.try_next() else {
                break;
            };
            let record = self.join.on_scrape(&s);
            sink.on_engine_metrics(&record);
        }
    }

    /// Kernel records the shims sent since the last pass, to the observer and the join.
    fn drain_kernels(&mut self, sink: &mut dyn Sink) {
        let Some(feed) = &self.kernel_feed else {
            return;
        };
        let mut kernels = Vec::new();
        feed.drain(&mut kernels);
        let now = monotonic_now_ns();
        for kernel in kernels {
            sink.on_kernel(&kernel);
            self.join.on_kernel(kernel, now);
        }
    }

    /// Reads the ring buffer, routes and correlates each record, applies the kernel commands
    /// that asked for, and hands what finished to the join and the sink. Stops early at a
    /// process the kernel adopted, which wants a rescan before its records (those that follow
    /// stay in the ring buffer).
    fn drain(&mut self, sink: &mut dyn Sink) -> Flow {
        let Self {
            ring,
            routes,
            correlated,
            attach,
            stats,
            ..
        } = self;
        let mut ignore = Vec::new();
        let mut commands = Vec::new();
        let mut flow = Flow::Go;
        ring.read(&mut |read| {
            flow = match read {
                Read::Lost => {
                    correlated.tracker.note_capture_loss(monotonic_now_ns());
                    Flow::Go
                }
                Read::Syscall(ev) => {
                    Sockets {
                        routes,
                        correlated,
                        stats,
                        ignore: &mut ignore,
                    }
                    .on_syscall(&ev);
                    Flow::Go
                }
                Read::Event(event) => on_event(
                    event,
                    routes,
                    correlated,
                    attach,
                    stats,
                    sink,
                    &mut commands,
                ),
            };
            flow
        });
        commands.extend(route::kernel_commands(routes, correlated, stats, ignore));
        commands.extend(correlated.tracker.kernel_commands());
        ring.probes.apply(commands);
        if let Some(user) = attach.user_probes.as_mut() {
            user.detach_failed(&mut ring.probes);
        }
        hand_on(&mut self.join, &mut self.correlated, sink, false);
        flow
    }

    /// Every counter: kernel side (`kernel_*`), capture, correlate and join.
    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        let correlated = &self.correlated;
        let mut all = self.ring.counters();
        all.extend(self.stats.iter());
        all.extend(correlated.tracker.stats().iter());
        all.extend(correlated.ipc.counters());
        all.extend(correlated.launches.stats().iter());
        all.extend(self.join.counters());
        if let Some(user) = &self.attach.user_probes {
            all.extend(user.stats().iter());
        }
        if let Some(scraper) = &self.attach.scraper {
            all.extend(scraper.counters());
        }
        all.extend([
            (Counter::FdLookups, self.routes.classifier.lookups),
            (
                Counter::OpenConnections,
                correlated.tracker.open_connections() as u64,
            ),
            (
                Counter::OpenRequests,
                correlated.tracker.open_requests() as u64,
            ),
            (
                Counter::EngineProcessesTraced,
                self.attach.discovery.traced().count() as u64,
            ),
        ]);
        all
    }

    pub(crate) fn log_counters(&self) {
        for (counter, value) in self.counters() {
            if value > 0 {
                info!(counter = counter.name(), value, "counter");
            }
        }
        let dropped = self.ring.probes.counter(KernelCounter::RingbufFull);
        if dropped > 0 {
            warn!(
                "{dropped} kernel records were dropped because the ring buffer was full; raise --ring-buffer-mb"
            );
        }
    }
}

/// A ring-buffer record that is not a socket syscall, to the stage it is for.
fn on_event(
    event: CapturedEvent<'_>,
    routes: &mut Routes,
    correlated: &mut Correlated,
    attach: &mut Attach,
    stats: &mut Stats,
    sink: &mut dyn Sink,
    commands: &mut Vec<KernelCommand>,
) -> Flow {
    let Correlated {
        tracker,
        launches,
        stub_names,
        steps,
        ..
    } = correlated;
    match event {
        CapturedEvent::Adopted { tgid, port } => {
            info!(pid = tgid, port, "process took a watched port; attaching");
            if routes.adoption.adopted(tgid, Instant::now()) {
                // Its records count from now, as those of the port's last engine.
                routes.ports.entry(tgid).or_insert_with(|| vec![port]);
                let engine = routes.adoption.engine_for(port).or_else(|| {
                    attach
                        .discovery
                        .traced()
                        .find(|p| p.ports.contains(&port))
                        .map(|p| p.engine)
                });
                if let Some(engine) = engine {
                    tracker.set_engine(tgid, engine);
                }
                return Flow::Stop;
            }
            // Left to discovery's next scan.
            commands.push(KernelCommand::Untrace { tgid });
            stats.bump(Counter::ProcessesAdoptedOverLimit);
        }
        CapturedEvent::GpuLaunch(launch) => {
            attach
                .budget
                .count(launch.tgid, u64::from(launch.skipped) + 1);
            if let Some(record) =
                launches.on_launch(&launch, |tgid, stub| stub_names.name(tgid, stub))
            {
                sink.on_launch(&record);
            }
        }
        CapturedEvent::GpuName(name) => {
            launches.on_name(&name, |tgid, stub| stub_names.name(tgid, stub))
        }
        CapturedEvent::Segment(segment) => tracker.on_segment(&segment),
        CapturedEvent::SockState(state) => tracker.on_sock_state(&state),
        CapturedEvent::Sched(event) => tracker.on_sched(&event, steps),
        CapturedEvent::UserProbe(hit) => {
            if let Some(event) = attach.user_probes.as_mut().and_then(|u| u.on_hit(&hit)) {
                tracker.on_sched(&event, steps);
            }
        }
        // The ring hands these on as syscalls (ring.rs).
        CapturedEvent::Syscall(_) | CapturedEvent::TokenBatch(_) => {}
    }
    Flow::Go
}

/// What a drain finished goes on: steps (their launches named) to the sink and the join, then
/// finished requests to the join, and the timelines it closes to the sink (all of them with
/// `flush`, when the agent stops). Steps first: a request that ended in this batch joins its
/// last steps (vLLM's final output and the HTTP response's end are seen together).
fn hand_on(join: &mut Join, correlated: &mut Correlated, sink: &mut dyn Sink, flush: bool) {
    for mut step in correlated.steps.drain(..) {
        correlated.launches.annotate(&mut step);
        sink.on_step(&step);
        join.on_step(step);
    }
    close(
        join,
        &mut correlated.ipc,
        &mut correlated.records,
        sink,
        flush,
    );
}

/// Finished requests to the join, and the timelines it closes to the sink.
fn close(
    join: &mut Join,
    ipc: &mut IpcRouter,
    records: &mut Vec<RequestRecord>,
    sink: &mut dyn Sink,
    flush: bool,
) {
    let now = monotonic_now_ns();
    for record in records.drain(..) {
        join.push(record, now);
    }
    let mut closed = Vec::new();
    if flush {
        join.flush(now, ipc, &mut closed);
    } else {
        join.poll(now, ipc, &mut closed);
    }
    for timeline in closed {
        sink.on_timeline(&Arc::new(timeline));
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
