//! Wires capture → decode → correlate → export on one thread: a ring-buffer record is decoded
//! and correlated where it is read, with no queue between stages to size or drop from.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
mod lifecycle;
mod route;
use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use inferscope_common::Counter as KernelCounter;
use inferscope_decode::http::Limits;
use inferscope_model::{
    Counter, LaunchRecord, RequestRecord, Stats, StepRecord, clock::monotonic_now_ns,
};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use crate::{
    capture::{
        CaptureConfig, CaptureError, CapturedEvent, Discovery, DiscoveryChange, FdClassifier,
        SocketProbes, TargetSelector,
        elf::{
            sched_hooks, tls as tls_probes,
            user_probes::{ProbeSpec, UserProbes},
        },
        gpu::{
            KernelFeed,
            launches::{self as gpu_launches, LaunchBudget, StubNames},
        },
        kernel::{
            chunks::{Chunks, Joined},
            privileges::Privileges,
            records,
            stream_template::{TemplateSide, kernel_template},
        },
        metrics::{MetricsScraper, ScrapeConfig},
        process::{
            adopt::Adoption,
            late_attach::{LateAttach, Missing},
            preexisting,
        },
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

/// What the pipeline reports as it runs.
pub(crate) trait Observer {
    /// A finished request, joined with everything the join stage waited for.
    fn on_timeline(&mut self, timeline: RequestTimeline);
    /// An engine step finished (scheduler hooks).
    fn on_step(&mut self, _step: &StepRecord) {}
    /// A GPU kernel record from a CUPTI shim (with [`Pipeline::use_kernel_feed`]).
    fn on_kernel(&mut self, _kernel: &KernelRecord) {}
    /// A GPU kernel or graph launch (launch uprobes on the CUDA driver and runtime).
    fn on_launch(&mut self, _launch: LaunchRecord) {}
    /// A scrape of an engine's metrics endpoint (after [`Pipeline::scrape_engine_metrics`]).
    fn on_engine_metrics(&mut self, _record: EngineMetricsRecord) {}
    /// Discovery attached to or detached from processes.
    fn on_discovery(&mut self, _change: &DiscoveryChange) {}
    /// The pipeline forgot process `tgid` (detached, or adopted and given up) after handing
    /// on its last records: per-process state goes.
    fn on_process_gone(&mut self, _tgid: u32) {}
    /// Called on every pass of the loop (at least every 50 ms): time-driven work goes here.
    fn on_tick(&mut self) {}
    /// The pipeline's counters (see [`Pipeline::counters`]), about once a second.
    fn on_counters(&mut self, _counters: Vec<(Counter, u64)>) {}
}

pub(crate) struct Pipeline {
    config: PipelineConfig,
    probes: SocketProbes,
    discovery: Discovery,
    classifier: FdClassifier,
    tracker: Tracker,
    /// Listening ports per traced process; looked up per record.
    ports: lifecycle::Ports,
    /// IPC decoders, one per engine kind that has one (engines::Engine::ipc).
    ipc: IpcRouter,
    stats: Stats,
    records: Vec<RequestRecord>,
    steps: Vec<StepRecord>,
    /// Kernel ring-buffer drops seen so far.
    ringbuf_drops: u64,
    /// The agent is stopping: the drain also takes the token events the kernel still holds.
    last_drain: bool,
    /// Ring-buffer records read (a plain field: it counts every record).
    records_read: u64,
    /// Ring-buffer bytes those records took, the ring's 8-byte record header and padding
    /// included: what sizing the ring is about.
    ring_bytes_read: u64,
    /// Engine metrics scraping (after [`Pipeline::scrape_engine_metrics`]).
    scraper: Option<MetricsScraper>,
    /// Kernel records from CUPTI shims (after [`Pipeline::use_kernel_feed`]).
    kernel_feed: Option<KernelFeed>,
    /// Finished records wait here for what they lack, and leave as timelines.
    join: Join,
    /// User-defined probes (with [`Pipeline::use_probe_spec`]).
    user_probes: Option<UserProbes>,
    /// Processes with hooks whose function was not mapped yet.
    late: LateAttach,
    /// Processes with TLS library probes, and what their undecodable TLS costs.
    tls: route::TlsProcesses,
    /// Large sends/receives of engine IPC, captured in chunks, joined again.
    chunks: Chunks,
    /// Engines restarted on their port: kept ports and processes the kernel adopted.
    adoption: Adoption,
    /// GPU launches from the launch uprobes, named and joined to steps.
    launches: Launches,
    /// Names of runtime launches' host stubs, from the processes' symbols.
    stub_names: StubNames,
    /// Worker processes of traced engines whose CUDA launches are probed (vLLM's EngineCore),
    /// with their engine process.
    gpu_workers: FxHashMap<u32, u32>,
    /// Pauses the launch probes of processes whose launches cost them too much.
    budget: LaunchBudget,
}

/// Engine worker processes whose launches are probed at once.
const MAX_GPU_WORKERS: usize = 1024;

/// Bytes of one send/receive captured for processes whose engine IPC is decoded (vLLM's largest
/// message is a new request with its prompt's token ids, up to ~3 bytes a token, and libzmq
/// batches queued messages into one send) and for HTTP/2 servers (grpcio reads up to 64 KiB at
/// once; a read cut short loses the connection's framing and HPACK state).
const LARGE_CAPTURE_BYTES: u32 =
    (inferscope_common::MAX_CHUNKS * inferscope_common::MAX_CAPTURE_BYTES) as u32;

/// "N of M scheduler hooks attached" for the progress line of a newly traced engine.
fn hooks_progress(engine: &str, hooks: &sched_hooks::HookOutcome, token_hooks: bool) -> String {
    let total = engines::hook_set(engine)
        .map(|set| {
            set.hooks
                .iter()
                .filter(|h| token_hooks || !h.per_token)
                .count()
        })
        .unwrap_or(0);
    if total == 0 {
        return "no scheduler hooks for this engine (sockets, IPC and metrics only)".into();
    }
    let mut text = format!("{} of {total} scheduler hooks attached", hooks.live);
    if !hooks.not_found.is_empty() {
        text.push_str(&format!(
            " ({} not found yet: tried again when the process maps more of the engine)",
            hooks.not_found.len()
        ));
    }
    text
}

/// How often processes with missing hooks have their mappings looked at again.
const LATE_ATTACH_INTERVAL: Duration = Duration::from_secs(2);

impl Pipeline {
    /// The loaded kernel programs, for the start-up preflight (`inferscope check`'s summary in
    /// `run`), before the loop starts.
    pub(crate) fn probes_mut(&mut self) -> &mut SocketProbes {
        &mut self.probes
    }

    pub(crate) fn new(config: PipelineConfig) -> Result<Self, CaptureError> {
        let privileges = Privileges::read();
        if privileges.missing().is_empty() && privileges.btf && privileges.tracefs {
            info!("{}", privileges.summary());
        } else {
            warn!("{}", privileges.summary());
        }
        let probes = SocketProbes::load(config.capture)?;
        let classifier = FdClassifier::new(probes.sock_hook());
        let budget = LaunchBudget::new(config.gpu_launch_budget_pct);
        let mut tracker = Tracker::new(config.limits);
        tracker.set_learn_templates(config.token_events);
        Ok(Self {
            scraper: None,
            kernel_feed: None,
            join: Join::new(TimelineLimits::default()),
            discovery: Discovery::new(config.selector.clone(), engines::identify),
            tracker,
            config,
            probes,
            classifier,
            ports: FxHashMap::default(),
            ipc: IpcRouter::default(),
            stats: Stats::default(),
            records: Vec::new(),
            steps: Vec::new(),
            ringbuf_drops: 0,
            last_drain: false,
            records_read: 0,
            ring_bytes_read: 0,
            user_probes: None,
            late: LateAttach::default(),
            tls: route::TlsProcesses::default(),
            chunks: Chunks::default(),
            adoption: Adoption::default(),
            launches: Launches::default(),
            stub_names: StubNames::default(),
            gpu_workers: FxHashMap::default(),
            budget,
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
    /// [`Pipeline::run`]): records go to [`Observer::on_engine_metrics`], and request records
    /// get the engine state they found on arrival.
    pub(crate) fn scrape_engine_metrics(&mut self, config: ScrapeConfig) -> std::io::Result<()> {
        self.scraper = Some(MetricsScraper::start(config)?);
        // A request joins a scrape within two intervals of its arrival: scrapes land an
        // interval plus their own duration apart, and one may fail.
        let join_gap = 2 * config.interval.as_nanos() as u64;
        self.join.scrape_engine_metrics(join_gap);
        // Engines already attached (a call after run) are picked up too.
        let traced: Vec<_> = self
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
        let user = UserProbes::new(spec, &mut self.probes).map_err(CaptureError::Config)?;
        self.user_probes = Some(user);
        Ok(())
    }

    /// Runs until `stop` is set or `deadline` passes, then reports open requests as aborted.
    pub(crate) fn run(
        &mut self,
        observer: &mut dyn Observer,
        stop: &AtomicBool,
        deadline: Option<Instant>,
    ) -> std::io::Result<()> {
        self.run_until(observer, &mut |_| {
            stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d)
        })
    }

    /// Runs until `done` says so (asked on every pass of the loop, at least every 50 ms: a
    /// retiring agent keeps running until the requests it saw start have ended), then reports
    /// open requests as aborted.
    pub(crate) fn run_until(
        &mut self,
        observer: &mut dyn Observer,
        done: &mut dyn FnMut(&Pipeline) -> bool,
    ) -> std::io::Result<()> {
        let mut last_scan: Option<Instant> = None;
        let mut last_sweep = Instant::now();
        let mut last_late_attach = Instant::now();
        loop {
            if done(self) {
                break;
            }
            if last_scan.is_none_or(|t| t.elapsed() >= self.config.discovery_interval) {
                let change = self.discovery.scan();
                if last_scan.is_none() && change.added.is_empty() {
                    info!(
                        "progress: no engine found yet; looking again every {} ms",
                        self.config.discovery_interval.as_millis()
                    );
                }
                self.apply_discovery(&change, observer);
                self.settle_adopted(observer);
                last_scan = Some(Instant::now());
            }
            wait_readable(self.probes.events_fd(), Duration::from_millis(50))?;
            self.drain_metrics(observer);
            self.drain_kernels(observer);
            if self.drain(observer) {
                // The kernel adopted a process: attach it before reading its records.
                last_scan = None;
                continue;
            }
            observer.on_tick();
            if last_late_attach.elapsed() >= LATE_ATTACH_INTERVAL {
                self.probe_gpu_workers();
                self.attach_late_hooks();
                last_late_attach = Instant::now();
            }
            if last_sweep.elapsed() >= Duration::from_secs(1) {
                self.apply_launch_budget(last_sweep.elapsed());
                self.release_kept_ports();
                self.probes.flush_logs();
                self.tracker.sweep(monotonic_now_ns());
                last_sweep = Instant::now();
                observer.on_counters(self.counters());
            }
        }
        self.drain_metrics(observer);
        self.drain_kernels(observer);
        self.last_drain = true;
        self.drain(observer);
        self.tracker
            .finish_all(monotonic_now_ns(), &mut self.records);
        emit(
            &mut self.join,
            &mut self.ipc,
            &mut self.records,
            observer,
            true,
        );
        Ok(())
    }

    /// Open requests whose first bytes were read before `ts_ns` (monotonic clock).
    pub(crate) fn open_requests_read_before(&self, ts_ns: u64) -> usize {
        self.tracker.open_requests_read_before(ts_ns)
    }

    /// Scrapes the scraper thread finished, normalised into records (and kept for the join).
    fn drain_metrics(&mut self, observer: &mut dyn Observer) {
        let Some(scraper) = &self.scraper else {
            return;
        };
        // Bounded like the ring-buffer drain; the scraper's own queue bounds it anyway.
        for _ in 0..1024 {
            let Some(s) = scraper.try_next() else {
                break;
            };
            let record = self.join.on_scrape(&s);
            observer.on_engine_metrics(record);
        }
    }

    /// Kernel records the shims sent since the last pass, to the observer and the join.
    fn drain_kernels(&mut self, observer: &mut dyn Observer) {
        let Some(feed) = &self.kernel_feed else {
            return;
        };
        let mut kernels = Vec::new();
        feed.drain(&mut kernels);
        let now = monotonic_now_ns();
        for kernel in kernels {
            observer.on_kernel(&kernel);
            self.join.on_kernel(kernel, now);
        }
    }

    fn apply_discovery(&mut self, change: &DiscoveryChange, observer: &mut dyn Observer) {
        for gone in &change.removed {
            info!(
                pid = gone.tgid,
                engine = gone.engine,
                "engine process gone; detaching"
            );
            self.processes().forget(gone.tgid, observer);
            // Kept watched for a successor on the same port (capture::process::adopt).
            for port in &gone.ports {
                if let Some(evicted) = self.adoption.keep(*port, gone.engine, Instant::now()) {
                    self.unwatch_unserved(evicted);
                }
            }
        }
        for (now, before) in &change.ports_changed {
            for port in before {
                self.probes.unwatch_port(*port);
            }
            for port in &now.ports {
                self.probes.watch_port(*port);
                self.adoption.taken(*port);
            }
            self.ports.insert(now.tgid, now.ports.clone());
            self.watch_metrics(now.tgid, now.engine, &now.ports);
        }
        for new in &change.added {
            info!(pid = new.tgid, engine = new.engine, ports = ?new.ports, "tracing engine process");
            for port in &new.ports {
                self.probes.watch_port(*port);
                self.adoption.taken(*port);
            }
            self.ports.insert(new.tgid, new.ports.clone());
            self.tracker.set_engine(new.tgid, new.engine);
            self.ipc.add_process(new.tgid, new.engine);
            // IPC sockets are not accepted HTTP connections: engines whose IPC is decoded keep
            // the fds the kernel does not know captured.
            self.probes
                .capture_unknown_fds(new.tgid, self.ipc.wants(new.tgid));
            // Connections opened before the agent: registered before tracing starts (so their
            // first bytes are not skipped) and again after (those accepted in between).
            let mut preexisting =
                preexisting::register(&mut self.probes, &mut self.classifier, new.tgid, &new.ports);
            if self.ipc.wants(new.tgid) {
                // Engine IPC is decoded whole: libzmq sends large messages and batches in one
                // syscall, beyond the per-record capture.
                self.probes.capture_large(new.tgid, LARGE_CAPTURE_BYTES);
            }
            self.probes.trace_process(new.tgid);
            preexisting +=
                preexisting::register(&mut self.probes, &mut self.classifier, new.tgid, &new.ports);
            // Scraped only once traced: a scrape's request read before would leave its answer
            // looking like one to a request the capture lost.
            self.watch_metrics(new.tgid, new.engine, &new.ports);
            self.stats
                .add(Counter::ConnectionsPreexisting, preexisting as u64);
            if preexisting > 0 {
                self.tracker.join_arrivals_by_address();
            }
            let hooks = sched_hooks::attach(
                &mut self.probes,
                new.tgid,
                engines::hook_set(new.engine),
                None,
                self.config.token_hooks,
            );
            let user = self
                .user_probes
                .as_mut()
                .map(|u| u.attach(&mut self.probes, new.tgid, None));
            let gpu = if self.config.gpu_launches {
                let gpu = gpu_launches::attach(&mut self.probes, new.tgid, None);
                self.stats
                    .add(Counter::GpuLaunchHooksAttached, gpu.live as u64);
                gpu.not_found
            } else {
                Vec::new()
            };
            info!(
                "progress: engine {} pid {} on port(s) {:?} traced; {}",
                new.engine,
                new.tgid,
                new.ports,
                hooks_progress(new.engine, &hooks, self.config.token_hooks)
            );
            let tls_hooks = if self.config.tls {
                self.attach_tls(new.tgid, false)
            } else {
                Vec::new()
            };
            let missing = Missing {
                engine: new.engine,
                engine_hooks: hooks.not_found,
                user_probes: user.map(|u| u.not_found).unwrap_or_default(),
                gpu_hooks: gpu,
                tls_hooks,
            };
            let user_probes = self.user_probes.as_ref();
            let gpu = self.config.gpu_launches;
            let tls = self.config.tls;
            self.late.watch(new.tgid, missing, |path| {
                could_hold_hooks(new.engine, user_probes, gpu, tls, path)
            });
        }
        if !change.added.is_empty()
            || !change.removed.is_empty()
            || !change.ports_changed.is_empty()
        {
            observer.on_discovery(change);
        }
        emit(
            &mut self.join,
            &mut self.ipc,
            &mut self.records,
            observer,
            false,
        );
    }

    /// Attaches the TLS library probes to every copy of OpenSSL `tgid` maps that has none yet;
    /// the hooks to look for again when its mapped files change: all of them, whether a copy
    /// was found or not, since another may be mapped later (a wheel that bundles its own,
    /// imported after start-up).
    fn attach_tls(&mut self, tgid: u32, late: bool) -> Vec<usize> {
        let outcome = tls_probes::attach(&mut self.probes, tgid, self.tls.objects(tgid));
        if outcome.live > 0 {
            if self.tls.probed(tgid, outcome.objects) {
                self.stats.bump(Counter::TlsProbesAttached);
            }
            if late {
                self.stats.bump(Counter::HooksAttachedLate);
            }
        }
        if self.tls.room(tgid) {
            (0..inferscope_common::TlsApi::ALL.len()).collect()
        } else {
            Vec::new()
        }
    }

    /// Every component with state per process, for the one path that forgets a process.
    fn processes(&mut self) -> lifecycle::Processes<'_> {
        lifecycle::Processes {
            probes: &mut self.probes,
            scraper: &mut self.scraper,
            user_probes: &mut self.user_probes,
            launches: &mut self.launches,
            budget: &mut self.budget,
            late: &mut self.late,
            tls: &mut self.tls,
            ipc: &mut self.ipc,
            classifier: &mut self.classifier,
            ports: &mut self.ports,
            adoption: &mut self.adoption,
            tracker: &mut self.tracker,
            join: &mut self.join,
            records: &mut self.records,
        }
    }

    /// Processes the kernel adopted that discovery did not attach in time (not an engine the
    /// selector picks, or gone) are traced no longer, and forgotten like a detached process.
    fn settle_adopted(&mut self, observer: &mut dyn Observer) {
        let discovery = &self.discovery;
        let given_up = self.adoption.settle(Instant::now(), |tgid| {
            discovery.traced().any(|p| p.tgid == tgid)
        });
        for tgid in given_up {
            self.processes().forget(tgid, observer);
            self.stats.bump(Counter::ProcessesAdoptedNotAttached);
        }
    }

    /// Ports of exited engines whose grace passed stop being watched.
    fn release_kept_ports(&mut self) {
        for port in self.adoption.expired(Instant::now()) {
            self.unwatch_unserved(port);
        }
    }

    /// Stops watching `port` unless a traced process serves it.
    fn unwatch_unserved(&mut self, port: u16) {
        if !self.ports.values().any(|ports| ports.contains(&port)) {
            self.probes.unwatch_port(port);
        }
    }

    /// Probes the CUDA launches of traced engines' worker processes (vLLM's EngineCore runs the
    /// model in a child of the API server): their launches count for the engine's steps. They
    /// are not traced otherwise (they serve no requests).
    fn probe_gpu_workers(&mut self) {
        if !self.config.gpu_launches {
            return;
        }
        let roots: Vec<u32> = self.discovery.traced().map(|p| p.tgid).collect();
        let live = crate::capture::process::procfs::descendants(&roots);
        let gone: Vec<u32> = self
            .gpu_workers
            .keys()
            .filter(|w| !live.iter().any(|(p, _)| p == *w))
            .copied()
            .collect();
        for worker in gone {
            self.gpu_workers.remove(&worker);
            self.probes.detach_uprobes(worker);
            self.late.forget(worker);
            self.launches.forget(worker);
            self.budget.forget(worker);
        }
        for (worker, root) in live {
            if self.gpu_workers.contains_key(&worker) || self.discovery.engine_of(worker).is_some()
            {
                continue;
            }
            if self.gpu_workers.len() >= MAX_GPU_WORKERS {
                self.stats.bump(Counter::GpuWorkersOverLimit);
                continue;
            }
            self.gpu_workers.insert(worker, root);
            self.launches.set_owner(worker, root);
            let engine = self.discovery.engine_of(root).unwrap_or("unknown");
            let gpu = gpu_launches::attach(&mut self.probes, worker, None);
            self.stats
                .add(Counter::GpuLaunchHooksAttached, gpu.live as u64);
            let missing = Missing {
                engine,
                gpu_hooks: gpu.not_found,
                ..Missing::default()
            };
            self.late.watch(worker, missing, gpu_launches::could_hold);
        }
    }

    /// Pauses the launch probes of processes whose launches cost them more than the budget
    /// (their naming probes stay, so names are still learnt) and brings them back after the
    /// pause.
    fn apply_launch_budget(&mut self, elapsed: Duration) {
        let (pause, resume) = self.budget.check(elapsed, Instant::now());
        for tgid in pause {
            self.probes
                .detach_uprobe_programs(tgid, gpu_launches::LAUNCH_PROGRAMS);
            self.stats.bump(Counter::GpuLaunchProbesPaused);
            warn!(
                pid = tgid,
                budget_pct = self.config.gpu_launch_budget_pct,
                pause_s = gpu_launches::BUDGET_PAUSE.as_secs(),
                "GPU launches of this process cost it more than the launch budget (eager launches): launch probes paused; its steps lack launch figures meanwhile (--gpu-launch-budget 0 keeps them)"
            );
        }
        let hooks = gpu_launches::launch_hooks();
        for tgid in resume {
            let back = gpu_launches::attach(&mut self.probes, tgid, Some(&hooks));
            info!(pid = tgid, probes = back.live, "GPU launch probes resumed");
        }
    }

    /// Tries the missing hooks of processes that mapped new engine objects since last time.
    fn attach_late_hooks(&mut self) {
        let user_probes = self.user_probes.as_ref();
        let gpu = self.config.gpu_launches;
        let tls = self.config.tls;
        let due = self
            .late
            .changed(|engine, path| could_hold_hooks(engine, user_probes, gpu, tls, path));
        for (tgid, missing) in due {
            let hooks = if missing.engine_hooks.is_empty() {
                sched_hooks::HookOutcome::default()
            } else {
                sched_hooks::attach(
                    &mut self.probes,
                    tgid,
                    engines::hook_set(missing.engine),
                    Some(&missing.engine_hooks),
                    self.config.token_hooks,
                )
            };
            let user = match self.user_probes.as_mut() {
                Some(u) if !missing.user_probes.is_empty() => {
                    u.attach(&mut self.probes, tgid, Some(&missing.user_probes))
                }
                _ => sched_hooks::HookOutcome::default(),
            };
            let gpu_hooks = if missing.gpu_hooks.is_empty() {
                sched_hooks::HookOutcome::default()
            } else {
                gpu_launches::attach(&mut self.probes, tgid, Some(&missing.gpu_hooks))
            };
            self.stats
                .add(Counter::HooksAttachedLate, (hooks.live + user.live) as u64);
            self.stats
                .add(Counter::GpuLaunchHooksAttached, gpu_hooks.live as u64);
            let tls_hooks = if missing.tls_hooks.is_empty() {
                Vec::new()
            } else {
                self.attach_tls(tgid, true)
            };
            let still = Missing {
                engine: missing.engine,
                engine_hooks: hooks.not_found,
                user_probes: user.not_found,
                gpu_hooks: gpu_hooks.not_found,
                tls_hooks,
            };
            let user_probes = self.user_probes.as_ref();
            self.late.watch(tgid, still, |path| {
                could_hold_hooks(missing.engine, user_probes, gpu, tls, path)
            });
        }
        self.stats.add(
            Counter::LateAttachOverLimit,
            std::mem::take(&mut self.late.over_limit),
        );
    }

    fn watch_metrics(&mut self, pid: u32, engine: &'static str, ports: &[u16]) {
        let Some(scraper) = self.scraper.as_mut() else {
            return;
        };
        if let Some(endpoint) = engines::by_name(engine).and_then(|e| e.metrics()) {
            scraper.watch(pid, engine, endpoint, ports);
        }
    }

    /// Whether it stopped at a process the kernel adopted, which wants a rescan before its
    /// records (those that follow stay in the ring buffer).
    fn drain(&mut self, observer: &mut dyn Observer) -> bool {
        let Self {
            probes,
            classifier,
            tracker,
            ports,
            stats,
            records,
            steps,
            ringbuf_drops,
            last_drain,
            records_read,
            ring_bytes_read,
            join,
            ipc,
            user_probes,
            chunks,
            adoption,
            discovery,
            launches,
            stub_names,
            budget,
            tls,
            ..
        } = self;
        let mut adopted = false;
        let mut over_limit: Vec<u32> = Vec::new();
        let mut ignore: Vec<(u32, i32, u64)> = Vec::new();
        let mut joined: Vec<Joined> = Vec::new();
        // Where a syscall goes, over this drain's borrows (the ring's records and the closes
        // replayed after it).
        macro_rules! sockets {
            () => {
                route::Sockets {
                    ports,
                    classifier,
                    tracker,
                    ipc,
                    stats,
                    records,
                    steps,
                    ignore: &mut ignore,
                    adoption,
                    tls,
                }
            };
        }
        // Bound one drain so discovery and shutdown still run under a flood.
        for n in 0..1_000_000u32 {
            // A drop happened before the records that follow it: look before reading them.
            if n % 1024 == 0 {
                let drops = probes.counter(KernelCounter::RingbufFull);
                if drops > *ringbuf_drops {
                    *ringbuf_drops = drops;
                    tracker.note_capture_loss(monotonic_now_ns());
                }
            }
            let Some(item) = probes.events().next() else {
                if *last_drain {
                    // The streams' last token events, still waiting in the kernel: they came
                    // after every record of their connections the ring holds, and took no
                    // record number.
                    for bytes in probes.waiting_token_batches() {
                        if let Ok(CapturedEvent::TokenBatch(batch)) = records::parse(&bytes) {
                            for mut ev in batch.events() {
                                ev.conn_seq = None;
                                stats.bump(Counter::TokenEventsTakenAtExit);
                                sockets!().on_syscall(&ev);
                            }
                        }
                    }
                }
                // Read empty: the closes the ring had no room for come after every record of
                // their connections that it kept.
                let lost_closes = probes.take_lost_closes();
                stats.add(Counter::ClosesRecovered, lost_closes.len() as u64);
                for bytes in lost_closes {
                    if let Ok(CapturedEvent::Syscall(ev)) = records::parse(&bytes) {
                        sockets!().on_syscall(&ev);
                    }
                }
                break;
            };
            *records_read += 1;
            *ring_bytes_read += (item.len() as u64 + 8).next_multiple_of(8);
            match records::parse(&item) {
                Err(e) => stats.bump(e.counter()),
                Ok(CapturedEvent::Adopted { tgid, port }) => {
                    info!(pid = tgid, port, "process took a watched port; attaching");
                    if adoption.adopted(tgid, Instant::now()) {
                        // Its records count from now, as those of the port's last engine.
                        ports.entry(tgid).or_insert_with(|| vec![port]);
                        let engine = adoption.engine_for(port).or_else(|| {
                            discovery
                                .traced()
                                .find(|p| p.ports.contains(&port))
                                .map(|p| p.engine)
                        });
                        if let Some(engine) = engine {
                            tracker.set_engine(tgid, engine);
                        }
                        adopted = true;
                        break;
                    }
                    over_limit.push(tgid);
                    stats.bump(Counter::ProcessesAdoptedOverLimit);
                }
                Ok(CapturedEvent::GpuLaunch(launch)) => {
                    budget.count(launch.tgid, u64::from(launch.skipped) + 1);
                    if let Some(record) =
                        launches.on_launch(&launch, |tgid, stub| stub_names.name(tgid, stub))
                    {
                        observer.on_launch(record);
                    }
                }
                Ok(CapturedEvent::GpuName(name)) => {
                    launches.on_name(&name, |tgid, stub| stub_names.name(tgid, stub))
                }
                Ok(CapturedEvent::Segment(segment)) => tracker.on_segment(&segment),
                Ok(CapturedEvent::SockState(state)) => tracker.on_sock_state(&state),
                Ok(CapturedEvent::Sched(event)) => tracker.on_sched(&event, steps),
                Ok(CapturedEvent::UserProbe(hit)) => {
                    if let Some(event) = user_probes.as_mut().and_then(|u| u.on_hit(&hit)) {
                        tracker.on_sched(&event, steps);
                    }
                }
                Ok(CapturedEvent::Syscall(ev)) => {
                    let mut sockets = sockets!();
                    let plain = chunks.push(ev, &mut joined);
                    for whole in joined.drain(..) {
                        sockets.on_syscall(&whole.event());
                    }
                    if let Some(ev) = plain {
                        sockets.on_syscall(&ev);
                    }
                }
                // Token events are never chunks of a larger capture: straight to the
                // connection, as each would have come in a record of its own.
                Ok(CapturedEvent::TokenBatch(batch)) => {
                    let mut sockets = sockets!();
                    for ev in batch.events() {
                        sockets.on_syscall(&ev);
                    }
                }
            }
        }
        route::reroute_non_http(tracker, ipc, classifier, stats, &mut ignore);
        for (tgid, fd, conn_gen) in ignore {
            probes.ignore_connection(tgid, fd, conn_gen);
        }
        for tgid in tracker.take_http2_servers() {
            probes.capture_large(tgid, LARGE_CAPTURE_BYTES);
        }
        // Left to discovery's next scan.
        for tgid in over_limit {
            probes.untrace_process(tgid);
        }
        for (tgid, fd, conn_gen) in classifier.new_ipc.drain(..) {
            probes.keep_whole(tgid, fd, conn_gen);
        }
        // Empty with --no-token-events: the tracker learns nothing then.
        for update in tracker.take_templates() {
            let template = &update.template;
            let side = |bytes, mask| TemplateSide { bytes, mask };
            match kernel_template(
                0,
                side(&template.prefix, &template.prefix_mask),
                side(&template.suffix, &template.suffix_mask),
            ) {
                Some(kernel) => probes.set_process_template(update.tgid, &kernel),
                None => stats.bump(Counter::TokenTemplatesRefused),
            }
        }
        if let Some(user) = user_probes.as_mut() {
            user.detach_failed(probes);
        }
        // Steps first: a request that ended in this batch joins its last steps (vLLM's final
        // output and the HTTP response's end are seen together).
        for mut step in steps.drain(..) {
            launches.annotate(&mut step);
            observer.on_step(&step);
            join.on_step(step);
        }
        emit(join, ipc, records, observer, false);
        adopted
    }

    /// Every counter: kernel side (`kernel_*`), capture and decode/correlate.
    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        let mut all = self.probes.counters();
        all.extend(self.stats.iter());
        all.extend(self.tracker.stats().iter());
        all.extend(self.ipc.counters());
        all.extend(self.join.counters());
        all.extend(self.chunks.stats.iter());
        all.extend(self.launches.stats().iter());
        if let Some(user) = &self.user_probes {
            all.extend(user.stats().iter());
        }
        all.push((Counter::RingbufRecords, self.records_read));
        all.push((Counter::RingbufBytes, self.ring_bytes_read));
        if let Some(scraper) = &self.scraper {
            all.extend(scraper.counters());
        }
        all.push((Counter::FdLookups, self.classifier.lookups));
        all.push((
            Counter::OpenConnections,
            self.tracker.open_connections() as u64,
        ));
        all.push((Counter::OpenRequests, self.tracker.open_requests() as u64));
        all.push((
            Counter::EngineProcessesTraced,
            self.discovery.traced().count() as u64,
        ));
        all
    }

    pub(crate) fn log_counters(&self) {
        for (counter, value) in self.counters() {
            if value > 0 {
                info!(counter = counter.name(), value, "counter");
            }
        }
        let dropped = self.probes.counter(KernelCounter::RingbufFull);
        if dropped > 0 {
            warn!(
                "{dropped} kernel records were dropped because the ring buffer was full; raise --ring-buffer-mb"
            );
        }
    }
}

/// Hands finished requests to the join stage, and the timelines it closes to the observer (all
/// of them with `flush`, when the agent stops).
fn emit(
    join: &mut Join,
    ipc: &mut IpcRouter,
    records: &mut Vec<RequestRecord>,
    observer: &mut dyn Observer,
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
        observer.on_timeline(timeline);
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

/// Whether a mapped file could hold one of `engine`'s hooks, a user probe, (with `gpu`) a GPU
/// launch probe, or (with `tls`) the TLS library's functions.
fn could_hold_hooks(
    engine: &str,
    user_probes: Option<&UserProbes>,
    gpu: bool,
    tls: bool,
    path: &str,
) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    engines::by_name(engine).is_some_and(|e| e.hook_objects().iter().any(|h| name.contains(h)))
        || user_probes.is_some_and(|u| u.wants_object(path))
        || (gpu && gpu_launches::could_hold(path))
        || (tls && tls_probes::could_hold(path))
}
