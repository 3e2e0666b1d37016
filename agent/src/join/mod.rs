//! Join stage: everything that waits for more information about a finished request, in one
//! place. A record pushed here gets its process's container and pod, then waits in one bounded
//! queue (`waiting`) for what it still lacks — its engine's word over IPC (a client that left
//! before the API server forwarded its request), its decode leg (a P/D proxy's record), the
//! kernel records of its steps (CUPTI hands them over seconds later) — each for at most one
//! wait ([`TimelineLimits::settle_ns`]) from when it came. On its way out it is stitched to its
//! P/D legs, given the engine metrics sampled at its arrival, and closed into a
//! [`RequestTimeline`] with its steps and kernels.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
pub(crate) mod disagg;
pub(crate) mod engine_metrics;
pub(crate) mod timeline;
mod waiting;

use inferscope_model::{Counter, PerProcess, RequestRecord, Stats, StepRecord};

use self::{disagg::Stitcher, timeline::TimelineBuilder, waiting::Waiting};
pub(crate) use self::{
    engine_metrics::{EngineMetrics, EngineMetricsRecord},
    timeline::{KernelRecord, RequestTimeline, TimelineLimits},
};
use crate::{
    capture::metrics::Scrape,
    engines::EngineWord,
    identity::{Identities, pods::PodStore},
};

pub(crate) struct Join {
    waiting: Waiting,
    identities: Identities,
    engine_metrics: EngineMetrics,
    stitcher: Stitcher,
    timelines: TimelineBuilder,
    stats: Stats,
}

impl Join {
    pub(crate) fn new(limits: TimelineLimits) -> Self {
        Self {
            waiting: Waiting::new(limits.waiting_records, limits.settle_ns),
            identities: Identities::default(),
            engine_metrics: EngineMetrics::new(Default::default(), 0),
            stitcher: Stitcher::default(),
            timelines: TimelineBuilder::new(limits),
            stats: Stats::default(),
        }
    }

    /// Names records' pods from this cache of the Kubernetes API; without it records carry
    /// container ids only.
    pub(crate) fn use_pod_store(&mut self, pods: std::sync::Arc<PodStore>) {
        self.identities = Identities::new(Some(pods));
    }

    /// Joins requests to the engine metrics scraped within `max_gap_ns` of their arrival.
    pub(crate) fn scrape_engine_metrics(&mut self, max_gap_ns: u64) {
        self.engine_metrics = EngineMetrics::new(Default::default(), max_gap_ns);
    }

    /// A scrape of an engine's metrics endpoint, normalised (and kept for the arrival join).
    pub(crate) fn on_scrape(&mut self, scrape: &Scrape) -> EngineMetricsRecord {
        self.engine_metrics.on_scrape(scrape)
    }

    /// An engine step ended (its launches already annotated).
    pub(crate) fn on_step(&mut self, step: StepRecord) {
        self.timelines.on_step(step);
    }

    /// A GPU kernel record from a CUPTI shim arrived at `now_ns`.
    pub(crate) fn on_kernel(&mut self, kernel: KernelRecord, now_ns: u64) {
        self.timelines.on_kernel(kernel, now_ns);
    }

    /// A finished request, at `now_ns` (monotonic). The agent's own metric scrapes (seen by the
    /// socket probes) are no requests and go no further.
    pub(crate) fn push(&mut self, mut record: RequestRecord, now_ns: u64) {
        if self.engine_metrics.is_own_scrape(&record) {
            return;
        }
        record.identity = self.identities.of(record.pid);
        self.waiting.push(record, now_ns);
    }

    /// Moves on every waiting record whose wait is over (it has what it lacked, or waited
    /// long enough) and hands its timeline to `out`.
    pub(crate) fn poll(
        &mut self,
        now_ns: u64,
        engine: &mut dyn EngineWord,
        out: &mut Vec<RequestTimeline>,
    ) {
        self.advance(now_ns, engine, false, out);
    }

    /// Hands every waiting record on now (the agent stops).
    pub(crate) fn flush(
        &mut self,
        now_ns: u64,
        engine: &mut dyn EngineWord,
        out: &mut Vec<RequestTimeline>,
    ) {
        self.advance(now_ns, engine, true, out);
    }

    fn advance(
        &mut self,
        now_ns: u64,
        engine: &mut dyn EngineWord,
        flush: bool,
        out: &mut Vec<RequestTimeline>,
    ) {
        self.timelines.settle_steps(now_ns, flush);
        let mut parts = waiting::Parts {
            engine,
            stitcher: &mut self.stitcher,
            engine_metrics: &self.engine_metrics,
            timelines: &mut self.timelines,
            stats: &mut self.stats,
        };
        self.waiting.advance(now_ns, flush, &mut parts, out);
        self.stitcher.expire_decode_legs();
    }

    /// The join's counters: its queue, the P/D stitch, the timelines, the identities.
    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        let mut all: Vec<(Counter, u64)> = self.stats.iter().collect();
        all.push((Counter::JoinRecordsWaiting, self.waiting.len() as u64));
        all.extend(self.stitcher.counters());
        all.extend(self.timelines.stats().iter());
        all.extend(self.identities.counters());
        all.push((
            Counter::MetricsScrapeRequestsHidden,
            self.engine_metrics.scrape_requests_hidden,
        ));
        all
    }
}

#[cfg(test)]
impl Join {
    /// Which of the join's per-process components hold something for `tgid`.
    pub(crate) fn holding(&self, tgid: u32) -> Vec<&'static str> {
        let mut holding = Vec::new();
        if self.engine_metrics.knows(tgid) {
            holding.push("engine_metrics");
        }
        if self.identities.knows(tgid) {
            holding.push("identities");
        }
        holding
    }

    /// Looks `tgid`'s container and pod up, as a record of it would.
    pub(crate) fn identify(&mut self, tgid: u32) {
        self.identities.of(tgid);
    }
}

/// State joined to records of a process: kept until its last records went through.
impl PerProcess for Join {
    fn process_gone(&mut self, tgid: u32) {
        self.engine_metrics.process_gone(tgid);
        self.identities.process_gone(tgid);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! The join stage driven as the pipeline drives it, with no engine IPC: for the tests of
    //! the stages around it.
    use inferscope_model::{RequestRecord, StepRecord};

    use super::{Join, KernelRecord, RequestTimeline, TimelineLimits};

    pub(crate) struct Driver {
        pub(crate) join: Join,
        engine: crate::engines::IpcRouter,
    }

    impl Driver {
        pub(crate) fn new(limits: TimelineLimits) -> Self {
            Self {
                join: Join::new(limits),
                engine: crate::engines::IpcRouter::default(),
            }
        }

        pub(crate) fn on_step(&mut self, step: StepRecord) {
            self.join.on_step(step);
        }

        pub(crate) fn on_kernel(&mut self, kernel: KernelRecord, now_ns: u64) {
            self.join.on_kernel(kernel, now_ns);
        }

        /// A finished request at `now_ns`, and what the join closes then.
        pub(crate) fn on_request(
            &mut self,
            r: RequestRecord,
            now_ns: u64,
            out: &mut Vec<RequestTimeline>,
        ) {
            self.join.push(r, now_ns);
            self.poll(now_ns, out);
        }

        pub(crate) fn poll(&mut self, now_ns: u64, out: &mut Vec<RequestTimeline>) {
            self.join.poll(now_ns, &mut self.engine, out);
        }

        pub(crate) fn flush(&mut self, now_ns: u64, out: &mut Vec<RequestTimeline>) {
            self.join.flush(now_ns, &mut self.engine, out);
        }
    }
}

#[cfg(test)]
mod tests;
