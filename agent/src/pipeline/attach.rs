//! Attaching to engine processes as discovery finds them and as they map more of themselves:
//! ports watched, connections that predate the agent registered, scheduler, TLS, GPU launch and
//! user probes attached (late where a function is not mapped yet), the metrics scraper told,
//! and the one path that forgets a process (`lifecycle.rs`).
use std::time::{Duration, Instant};

use inferscope_model::Counter;
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use super::{Pipeline, Sink, hand_on, lifecycle};
use crate::{
    capture::{
        Discovery, DiscoveryChange, TracedProcess,
        elf::{sched_hooks, tls as tls_probes, user_probes::UserProbes},
        gpu::launches::{self as gpu_launches, LaunchBudget},
        kernel::commands::LARGE_CAPTURE_BYTES,
        metrics::MetricsScraper,
        process::{
            late_attach::{LateAttach, Missing},
            preexisting,
        },
    },
    engines,
};

/// What is attached to which process, and what still waits to be.
pub(super) struct Attach {
    pub discovery: Discovery,
    /// Processes with hooks whose function was not mapped yet.
    pub late: LateAttach,
    /// User-defined probes (with [`Pipeline::use_probe_spec`]).
    pub user_probes: Option<UserProbes>,
    /// Worker processes of traced engines whose CUDA launches are probed (vLLM's EngineCore),
    /// with their engine process.
    pub gpu_workers: FxHashMap<u32, u32>,
    /// Pauses the launch probes of processes whose launches cost them too much.
    pub budget: LaunchBudget,
    /// Engine metrics scraping (after [`Pipeline::scrape_engine_metrics`]).
    pub scraper: Option<MetricsScraper>,
}

/// Engine worker processes whose launches are probed at once.
const MAX_GPU_WORKERS: usize = 1024;
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
pub(super) const LATE_ATTACH_INTERVAL: Duration = Duration::from_secs(2);

impl Pipeline {
    /// Discovery's scan: processes gone are forgotten, new ones attached, adopted ones that
    /// were not attached in time given up.
    pub(super) fn scan(&mut self, sink: &mut dyn Sink, first: bool) {
        let change = self.attach.discovery.scan();
        if first && change.added.is_empty() {
            info!(
                "progress: no engine found yet; looking again every {} ms",
                self.config.discovery_interval.as_millis()
            );
        }
        self.apply_discovery(&change, sink);
        self.settle_adopted(sink);
    }

    fn apply_discovery(&mut self, change: &DiscoveryChange, sink: &mut dyn Sink) {
        for gone in &change.removed {
            info!(
                pid = gone.tgid,
                engine = gone.engine,
                "engine process gone; detaching"
            );
            self.processes().forget(gone.tgid, sink);
            // Kept watched for a successor on the same port (capture::process::adopt).
            for port in &gone.ports {
                if let Some(evicted) = self
                    .routes
                    .adoption
                    .keep(*port, gone.engine, Instant::now())
                {
                    self.unwatch_unserved(evicted);
                }
            }
        }
        for (now, before) in &change.ports_changed {
            for port in before {
                self.ring.probes.unwatch_port(*port);
            }
            for port in &now.ports {
                self.ring.probes.watch_port(*port);
                self.routes.adoption.taken(*port);
            }
            self.routes.ports.insert(now.tgid, now.ports.clone());
            self.watch_metrics(now.tgid, now.engine, &now.ports);
        }
        for new in &change.added {
            self.attach_process(new);
        }
        if !change.added.is_empty()
            || !change.removed.is_empty()
            || !change.ports_changed.is_empty()
        {
            sink.on_discovery(change);
        }
        hand_on(&mut self.join, &mut self.correlated, sink, false);
    }

    /// Traces a process discovery found: its ports watched, its connections that predate the
    /// agent registered, its probes attached (the rest watched for, late).
    fn attach_process(&mut self, new: &TracedProcess) {
        info!(pid = new.tgid, engine = new.engine, ports = ?new.ports, "tracing engine process");
        for port in &new.ports {
            self.ring.probes.watch_port(*port);
            self.routes.adoption.taken(*port);
        }
        self.routes.ports.insert(new.tgid, new.ports.clone());
        self.correlated.tracker.set_engine(new.tgid, new.engine);
        self.correlated.ipc.add_process(new.tgid, new.engine);
        // IPC sockets are not accepted HTTP connections: engines whose IPC is decoded keep
        // the fds the kernel does not know captured.
        self.ring
            .probes
            .capture_unknown_fds(new.tgid, self.correlated.ipc.wants(new.tgid));
        // Connections opened before the agent: registered before tracing starts (so their
        // first bytes are not skipped) and again after (those accepted in between).
        let mut preexisting = preexisting::register(
            &mut self.ring.probes,
            &mut self.routes.classifier,
            new.tgid,
            &new.ports,
        );
        if self.correlated.ipc.wants(new.tgid) {
            // Engine IPC is decoded whole: libzmq sends large messages and batches in one
            // syscall, beyond the per-record capture.
            self.ring
                .probes
                .capture_large(new.tgid, LARGE_CAPTURE_BYTES);
        }
        self.ring.probes.trace_process(new.tgid);
        preexisting += preexisting::register(
            &mut self.ring.probes,
            &mut self.routes.classifier,
            new.tgid,
            &new.ports,
        );
        // Scraped only once traced: a scrape's request read before would leave its answer
        // looking like one to a request the capture lost.
        self.watch_metrics(new.tgid, new.engine, &new.ports);
        self.stats
            .add(Counter::ConnectionsPreexisting, preexisting as u64);
        if preexisting > 0 {
            self.correlated.tracker.join_arrivals_by_address();
        }
        let hooks = sched_hooks::attach(
            &mut self.ring.probes,
            new.tgid,
            engines::hook_set(new.engine),
            None,
            self.config.token_hooks,
        );
        let user = self
            .attach
            .user_probes
            .as_mut()
            .map(|u| u.attach(&mut self.ring.probes, new.tgid, None));
        let gpu = if self.config.gpu_launches {
            let gpu = gpu_launches::attach(&mut self.ring.probes, new.tgid, None);
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
        let user_probes = self.attach.user_probes.as_ref();
        let gpu = self.config.gpu_launches;
        let tls = self.config.tls;
        self.attach.late.watch(new.tgid, missing, |path| {
            could_hold_hooks(new.engine, user_probes, gpu, tls, path)
        });
    }

    /// Attaches the TLS library probes to every copy of OpenSSL `tgid` maps that has none yet;
    /// the hooks to look for again when its mapped files change: all of them, whether a copy
    /// was found or not, since another may be mapped later (a wheel that bundles its own,
    /// imported after start-up).
    fn attach_tls(&mut self, tgid: u32, late: bool) -> Vec<usize> {
        let outcome =
            tls_probes::attach(&mut self.ring.probes, tgid, self.routes.tls.objects(tgid));
        if outcome.live > 0 {
            if self.routes.tls.probed(tgid, outcome.objects) {
                self.stats.bump(Counter::TlsProbesAttached);
            }
            if late {
                self.stats.bump(Counter::HooksAttachedLate);
            }
        }
        if self.routes.tls.room(tgid) {
            (0..inferscope_common::TlsApi::ALL.len()).collect()
        } else {
            Vec::new()
        }
    }

    /// Every component with state per process, for the one path that forgets a process.
    fn processes(&mut self) -> lifecycle::Processes<'_> {
        lifecycle::Processes {
            probes: &mut self.ring.probes,
            scraper: &mut self.attach.scraper,
            user_probes: &mut self.attach.user_probes,
            launches: &mut self.correlated.launches,
            budget: &mut self.attach.budget,
            late: &mut self.attach.late,
            tls: &mut self.routes.tls,
            ipc: &mut self.correlated.ipc,
            classifier: &mut self.routes.classifier,
            ports: &mut self.routes.ports,
            adoption: &mut self.routes.adoption,
            tracker: &mut self.correlated.tracker,
            join: &mut self.join,
            records: &mut self.correlated.records,
        }
    }

    /// Processes the kernel adopted that discovery did not attach in time (not an engine the
    /// selector picks, or gone) are traced no longer, and forgotten like a detached process.
    fn settle_adopted(&mut self, sink: &mut dyn Sink) {
        let discovery = &self.attach.discovery;
        let given_up = self.routes.adoption.settle(Instant::now(), |tgid| {
            discovery.traced().any(|p| p.tgid == tgid)
        });
        for tgid in given_up {
            self.processes().forget(tgid, sink);
            self.stats.bump(Counter::ProcessesAdoptedNotAttached);
        }
    }

    /// Ports of exited engines whose grace passed stop being watched.
    pub(super) fn release_kept_ports(&mut self) {
        for port in self.routes.adoption.expired(Instant::now()) {
            self.unwatch_unserved(port);
        }
    }

    /// Stops watching `port` unless a traced process serves it.
    fn unwatch_unserved(&mut self, port: u16) {
        if !self
            .routes
            .ports
            .values()
            .any(|ports| ports.contains(&port))
        {
            self.ring.probes.unwatch_port(port);
        }
    }

    /// Probes the CUDA launches of traced engines' worker processes (vLLM's EngineCore runs the
    /// model in a child of the API server): their launches count for the engine's steps. They
    /// are not traced otherwise (they serve no requests).
    pub(super) fn probe_gpu_workers(&mut self) {
        if !self.config.gpu_launches {
            return;
        }
        let roots: Vec<u32> = self.attach.discovery.traced().map(|p| p.tgid).collect();
        let live = crate::capture::process::procfs::descendants(&roots);
        let gone: Vec<u32> = self
            .attach
            .gpu_workers
            .keys()
            .filter(|w| !live.iter().any(|(p, _)| p == *w))
            .copied()
            .collect();
        for worker in gone {
            self.attach.gpu_workers.remove(&worker);
            self.ring.probes.detach_uprobes(worker);
            self.attach.late.forget(worker);
            self.correlated.launches.forget(worker);
            self.attach.budget.forget(worker);
        }
        for (worker, root) in live {
            if self.attach.gpu_workers.contains_key(&worker)
                || self.attach.discovery.engine_of(worker).is_some()
            {
                continue;
            }
            if self.attach.gpu_workers.len() >= MAX_GPU_WORKERS {
                self.stats.bump(Counter::GpuWorkersOverLimit);
                continue;
            }
            self.attach.gpu_workers.insert(worker, root);
            self.correlated.launches.set_owner(worker, root);
            let engine = self.attach.discovery.engine_of(root).unwrap_or("unknown");
            let gpu = gpu_launches::attach(&mut self.ring.probes, worker, None);
            self.stats
                .add(Counter::GpuLaunchHooksAttached, gpu.live as u64);
            let missing = Missing {
                engine,
                gpu_hooks: gpu.not_found,
                ..Missing::default()
            };
            self.attach
                .late
                .watch(worker, missing, gpu_launches::could_hold);
        }
    }

    /// Pauses the launch probes of processes whose launches cost them more than the budget
    /// (their naming probes stay, so names are still learnt) and brings them back after the
    /// pause.
    pub(super) fn apply_launch_budget(&mut self, elapsed: Duration) {
        let (pause, resume) = self.attach.budget.check(elapsed, Instant::now());
        for tgid in pause {
            self.ring
                .probes
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
            let back = gpu_launches::attach(&mut self.ring.probes, tgid, Some(&hooks));
            info!(pid = tgid, probes = back.live, "GPU launch probes resumed");
        }
    }

    /// Tries the missing hooks of processes that mapped new engine objects since last time.
    pub(super) fn attach_late_hooks(&mut self) {
        let user_probes = self.attach.user_probes.as_ref();
        let gpu = self.config.gpu_launches;
        let tls = self.config.tls;
        let due = self
            .attach
            .late
            .changed(|engine, path| could_hold_hooks(engine, user_probes, gpu, tls, path));
        for (tgid, missing) in due {
            let hooks = if missing.engine_hooks.is_empty() {
                sched_hooks::HookOutcome::default()
            } else {
                sched_hooks::attach(
                    &mut self.ring.probes,
                    tgid,
                    engines::hook_set(missing.engine),
                    Some(&missing.engine_hooks),
                    self.config.token_hooks,
                )
            };
            let user = match self.attach.user_probes.as_mut() {
                Some(u) if !missing.user_probes.is_empty() => {
                    u.attach(&mut self.ring.probes, tgid, Some(&missing.user_probes))
                }
                _ => sched_hooks::HookOutcome::default(),
            };
            let gpu_hooks = if missing.gpu_hooks.is_empty() {
                sched_hooks::HookOutcome::default()
            } else {
                gpu_launches::attach(&mut self.ring.probes, tgid, Some(&missing.gpu_hooks))
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
            let user_probes = self.attach.user_probes.as_ref();
            self.attach.late.watch(tgid, still, |path| {
                could_hold_hooks(missing.engine, user_probes, gpu, tls, path)
            });
        }
        self.stats.add(
            Counter::LateAttachOverLimit,
            std::mem::take(&mut self.attach.late.over_limit),
        );
    }

    pub(super) fn watch_metrics(&mut self, pid: u32, engine: &'static str, ports: &[u16]) {
        let Some(scraper) = self.attach.scraper.as_mut() else {
            return;
        };
        if let Some(endpoint) = engines::by_name(engine).and_then(|e| e.metrics()) {
            scraper.watch(pid, engine, endpoint, ports);
        }
    }
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
