//! Joins finished requests with the engine steps they took part in and the GPU kernels those
//! steps launched: kernels → steps (same process, launched inside the step's time window) →
//! requests (batch membership from the scheduler layer).
//!
//! Kernel records reach the agent seconds after the GPU ran them (CUPTI hands activity buffers
//! over when they fill or on a flush), so a finished request waits a short settle time before its
//! timeline is closed. Where a layer is missing the timeline says so in `unknown` rather than
//! attributing kernels by time alone, which would guess wrong under batching.
use std::collections::VecDeque;

use inferscope_model::{
    Counter, RequestRecord, Stats, StepLaunches, StepMember, StepRecord, clock::ns_to_ms,
};
use rustc_hash::FxHashMap;
use serde::Serialize;

pub(crate) use crate::capture::gpu::KernelRecord;

/// GPU work in one phase of a request (its prefill steps or its decode steps).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct GpuPhase {
    pub kernels: u64,
    /// Union of the kernels' GPU intervals, so overlapping streams are not counted twice.
    pub busy_ms: f64,
    /// Share of `busy_ms` spent in kernels flagged as using tensor cores.
    pub tensor_core_share: f64,
    pub devices: Vec<u32>,
}

/// One request with everything joined onto it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RequestTimeline {
    pub request: RequestRecord,
    pub steps: Vec<StepRecord>,
    #[serde(skip)]
    pub kernels: Vec<KernelRecord>,
    /// Kernels in the request's steps beyond [`TimelineLimits::kernels_per_request`], not kept.
    pub kernels_not_kept: u64,
    pub prefill_gpu: Option<GpuPhase>,
    pub decode_gpu: Option<GpuPhase>,
    /// Layers that were missing for this request: `scheduler` (no admission seen), `steps`
    /// (no step listed the request), `gpu` (no kernel records from its engine process).
    pub unknown: Vec<&'static str>,
}

impl RequestTimeline {
    /// A request with nothing joined onto it (no steps, no kernels, nothing marked unknown).
    pub(crate) fn bare(request: RequestRecord) -> Self {
        Self {
            request,
            steps: Vec::new(),
            kernels: Vec::new(),
            kernels_not_kept: 0,
            prefill_gpu: None,
            decode_gpu: None,
            unknown: Vec::new(),
        }
    }

    /// The kept kernels that `step` launched: same process, launched inside its time window
    /// (the join rule of [`TimelineBuilder`]).
    pub(crate) fn kernels_of<'a>(
        &'a self,
        step: &'a StepRecord,
    ) -> impl Iterator<Item = &'a KernelRecord> {
        self.kernels
            .iter()
            .filter(move |k| launched_during(k, step))
    }
}

fn launched_during(k: &KernelRecord, step: &StepRecord) -> bool {
    k.pid == step.gpu_pid() && (step.kernels_from()..=step.end_mono_ns).contains(&k.launch_mono_ns)
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct TimelineLimits {
    /// Steps kept for joining, across all processes.
    pub steps: usize,
    /// Kernels kept per process for joining.
    pub kernels_per_process: usize,
    /// Kernels kept on one request's timeline (all are still counted in its GPU phases).
    pub kernels_per_request: usize,
    /// Finished records waiting in the join (for their engine's word, their decode leg, their
    /// kernels) at once.
    pub waiting_records: usize,
    /// How long a finished record waits in the join for what it still lacks (its engine's word,
    /// its decode leg, the kernel records of its steps), and a step for its kernel records.
    pub settle_ns: u64,
    /// A process counts as having the shim if a kernel arrived from it this recently.
    pub shim_recent_ns: u64,
}

impl Default for TimelineLimits {
    fn default() -> Self {
        Self {
            steps: 1 << 16,
            kernels_per_process: 1 << 18,
            kernels_per_request: 4096,
            waiting_records: 8192,
            settle_ns: 2_000_000_000,
            shim_recent_ns: 60_000_000_000,
        }
    }
}

pub(crate) struct TimelineBuilder {
    limits: TimelineLimits,
    /// Recent steps in arrival order (steps arrive as they end, so roughly by end time).
    steps: VecDeque<StepRecord>,
    /// Recent kernels per process, sorted by launch time.
    kernels: FxHashMap<u32, VecDeque<KernelRecord>>,
    /// Per process: when its last kernel arrived, and the latest launch time seen.
    shim_seen: FxHashMap<u32, (u64, u64)>,
    /// Steps (from the front of `steps`) whose launches were merged with the shim's records.
    settled: usize,
    stats: Stats,
}

impl TimelineBuilder {
    pub(crate) fn new(limits: TimelineLimits) -> Self {
        Self {
            limits,
            steps: VecDeque::new(),
            kernels: FxHashMap::default(),
            shim_seen: FxHashMap::default(),
            settled: 0,
            stats: Stats::default(),
        }
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// A step ended. Its launch records (launch uprobes) are kept until the shim's records of
    /// the step can have arrived (`settle_ns`), then merged with them and dropped: at most the
    /// launches of the last settle time are held, and those are bounded per process by the
    /// launch join's own limit.
    pub(crate) fn on_step(&mut self, step: StepRecord) {
        if self.steps.len() >= self.limits.steps {
            self.steps.pop_front();
            self.settled = self.settled.saturating_sub(1);
            self.stats.bump(Counter::TimelineStepsEvicted);
        }
        self.steps.push_back(step);
    }

    pub(crate) fn on_kernel(&mut self, event: KernelRecord, now_ns: u64) {
        let launch = event.launch_mono_ns;
        let seen = self.shim_seen.entry(event.pid).or_insert((0, 0));
        seen.0 = now_ns;
        seen.1 = seen.1.max(launch);
        let ring = self.kernels.entry(event.pid).or_default();
        if ring.len() >= self.limits.kernels_per_process {
            ring.pop_front();
            self.stats.bump(Counter::TimelineKernelsEvicted);
        }
        // Activity buffers arrive roughly in launch order: insert from the back.
        let at = ring
            .iter()
            .rposition(|k| k.launch_mono_ns <= launch)
            .map_or(0, |i| i + 1);
        ring.insert(at, event);
    }

    /// Whether a finished request still waits for kernel records: its process has the shim
    /// and its kernels were not yet seen past the request's end.
    pub(crate) fn awaits_kernels(
        &self,
        gpu_pid: u32,
        request: &RequestRecord,
        now_ns: u64,
    ) -> bool {
        let watermark_passed = self
            .shim_seen
            .get(&gpu_pid)
            .is_some_and(|&(_, latest)| latest > request.end_mono_ns);
        self.has_recent_shim(gpu_pid, now_ns) && !watermark_passed
    }

    /// Merges the launch uprobes' launches of each step whose shim records can have arrived
    /// (the settle time passed, or the process's kernels were seen past the step's end) with
    /// those records, once, in arrival order; `all`: every step now (shutdown).
    pub(crate) fn settle_steps(&mut self, now_ns: u64, all: bool) {
        while let Some(step) = self.steps.get(self.settled) {
            let pid = step.gpu_pid();
            let watermark_passed = self
                .shim_seen
                .get(&pid)
                .is_some_and(|&(_, latest)| latest > step.end_mono_ns);
            if !all
                && !watermark_passed
                && step.end_mono_ns.saturating_add(self.limits.settle_ns) > now_ns
            {
                break;
            }
            let merged = self.merged_launches(step, now_ns);
            let step = &mut self.steps[self.settled];
            if let Some(merged) = merged {
                step.gpu_launches = merged;
            }
            step.launch_list = None;
            self.settled += 1;
        }
    }

    /// `step`'s launch summary merged with the shim's records of its window (launch_merge),
    /// or None where there is nothing to merge: no shim record (the uprobes' summary stands),
    /// or a summary whose launch records are gone.
    fn merged_launches(&self, step: &StepRecord, now_ns: u64) -> Option<Option<StepLaunches>> {
        let pid = step.gpu_pid();
        let kernels: Vec<&KernelRecord> = match self.kernels.get(&pid) {
            Some(ring) if self.has_recent_shim(pid, now_ns) => {
                let from = ring.partition_point(|k| k.launch_mono_ns < step.kernels_from());
                ring.iter()
                    .skip(from)
                    .take_while(|k| k.launch_mono_ns <= step.end_mono_ns)
                    .collect()
            }
            _ => Vec::new(),
        };
        match (&step.launch_list, kernels.is_empty()) {
            (_, true) => None,
            (None, false) if step.gpu_launches.is_some() => None,
            (launches, false) => Some(crate::correlate::launch_merge::merge_step(
                step,
                launches.as_deref().unwrap_or(&[]),
                &kernels,
            )),
        }
    }

    /// The process whose kernels `request` ran: its own, or that of its last step where its
    /// engine listed the steps (vLLM: the EngineCore, not the API server that answered).
    pub(crate) fn gpu_pid_of(&self, request: &RequestRecord) -> u32 {
        let Some(last) = request.engine_steps.last() else {
            return request.pid;
        };
        self.steps
            .iter()
            .rev()
            // Its last step is among the newest (it just finished).
            .take(4096)
            .find(|s| s.end_mono_ns == last.end_mono_ns && s.pid == last.pid)
            .map_or(request.pid, StepRecord::gpu_pid)
    }

    fn has_recent_shim(&self, pid: u32, now_ns: u64) -> bool {
        self.shim_seen
            .get(&pid)
            .is_some_and(|&(seen, _)| now_ns.saturating_sub(seen) <= self.limits.shim_recent_ns)
    }

    pub(crate) fn build(&mut self, request: RequestRecord, now_ns: u64) -> RequestTimeline {
        let start = request.admitted_mono_ns.unwrap_or(request.arrival_mono_ns);
        let recent = self
            .steps
            .iter()
            .rev()
            .take_while(|s| s.end_mono_ns >= start);
        let mut steps: Vec<StepRecord> = if request.engine_steps.is_empty() {
            recent
                .filter(|s| {
                    s.requests
                        .iter()
                        .any(|m| m.request_id == request.request_id)
                })
                .cloned()
                .collect()
        } else {
            // The engine joined its steps itself (they name engine ids): the timeline's copy of
            // each names the request by the agent's id too, with its phase there.
            let refs = &request.engine_steps;
            recent
                .filter_map(|s| {
                    let at = refs
                        .binary_search_by_key(&(s.end_mono_ns, s.pid), |r| (r.end_mono_ns, r.pid))
                        .ok()?;
                    let mut step = s.clone();
                    step.requests.push(StepMember {
                        request_id: request.request_id.clone(),
                        phase: refs[at].phase,
                    });
                    Some(step)
                })
                .collect()
        };
        steps.reverse();
        // Steps not settled yet (an earlier step of another process holds the queue up): their
        // copies are merged with what has arrived (the request's own kernels have).
        for step in steps.iter_mut().filter(|s| s.launch_list.is_some()) {
            if let Some(merged) = self.merged_launches(step, now_ns) {
                step.gpu_launches = merged;
            }
            step.launch_list = None;
        }

        let mut unknown = Vec::new();
        if request.admitted_mono_ns.is_none() {
            unknown.push("scheduler");
        }
        if steps.is_empty() {
            unknown.push("steps");
        }
        let shim = steps
            .iter()
            .any(|s| self.has_recent_shim(s.gpu_pid(), now_ns))
            || self.has_recent_shim(request.pid, now_ns);
        let mut timeline = RequestTimeline {
            unknown,
            ..RequestTimeline::bare(request)
        };
        if !shim || steps.is_empty() {
            timeline.unknown.push("gpu");
            timeline.steps = steps;
            return timeline;
        }
        self.join_kernels(&mut timeline, &steps);
        timeline.steps = steps;
        timeline
    }

    /// The kernels `steps` launched, onto the request's timeline: counted in its prefill or
    /// decode phase by the request's phase in each step, kept up to the limit.
    fn join_kernels(&mut self, timeline: &mut RequestTimeline, steps: &[StepRecord]) {
        let mut prefill = PhaseAccumulator::default();
        let mut decode = PhaseAccumulator::default();
        for step in steps {
            let phase = step
                .requests
                .iter()
                .find(|m| m.request_id == timeline.request.request_id)
                .map_or("decode", |m| m.phase);
            let Some(ring) = self.kernels.get(&step.gpu_pid()) else {
                continue;
            };
            let from = ring.partition_point(|k| k.launch_mono_ns < step.kernels_from());
            for event in ring.iter().skip(from) {
                if event.launch_mono_ns > step.end_mono_ns {
                    break;
                }
                if phase == "prefill" {
                    prefill.add(event);
                } else {
                    decode.add(event);
                }
                if timeline.kernels.len() < self.limits.kernels_per_request {
                    timeline.kernels.push(event.clone());
                } else {
                    timeline.kernels_not_kept += 1;
                }
            }
        }
        if timeline.kernels_not_kept > 0 {
            self.stats.bump(Counter::TimelineKernelsNotKept);
        }
        timeline.prefill_gpu = Some(prefill.finish());
        timeline.decode_gpu = Some(decode.finish());
    }
}

#[derive(Default)]
struct PhaseAccumulator {
    kernels: u64,
    intervals: Vec<(u64, u64)>,
    tensor_intervals: Vec<(u64, u64)>,
    devices: Vec<u32>,
}

impl PhaseAccumulator {
    fn add(&mut self, kernel: &KernelRecord) {
        self.kernels += 1;
        let span = (
            kernel.start_mono_ns,
            kernel.end_mono_ns.max(kernel.start_mono_ns),
        );
        self.intervals.push(span);
        if kernel.tensor_core {
            self.tensor_intervals.push(span);
        }
        if !self.devices.contains(&kernel.device_id) {
            self.devices.push(kernel.device_id);
        }
    }

    fn finish(mut self) -> GpuPhase {
        let busy = union_ns(&mut self.intervals);
        let tensor = union_ns(&mut self.tensor_intervals);
        self.devices.sort_unstable();
        GpuPhase {
            kernels: self.kernels,
            busy_ms: ns_to_ms(busy),
            tensor_core_share: if busy == 0 {
                0.0
            } else {
                tensor as f64 / busy as f64
            },
            devices: self.devices,
        }
    }
}

/// Total length covered by a set of intervals (end before start counts as empty).
pub(crate) fn union_ns(intervals: &mut [(u64, u64)]) -> u64 {
    intervals.sort_unstable();
    let mut total = 0;
    let mut current: Option<(u64, u64)> = None;
    for &(start, end) in intervals.iter() {
        let end = end.max(start);
        match current {
            Some((s, e)) if start <= e => current = Some((s, e.max(end))),
            Some((s, e)) => {
                total += e - s;
                current = Some((start, end));
            }
            None => current = Some((start, end)),
        }
    }
    if let Some((s, e)) = current {
        total += e - s;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::join::testing::Driver as B;

    trait Steps {
        fn steps(&self) -> &VecDeque<StepRecord>;
    }

    impl Steps for B {
        fn steps(&self) -> &VecDeque<StepRecord> {
            &self.join.timelines.steps
        }
    }

    fn request(id: &str, arrival: u64, admitted: Option<u64>, end: u64) -> RequestRecord {
        RequestRecord {
            request_id: id.into(),
            pid: 7,
            arrival_mono_ns: arrival,
            admitted_mono_ns: admitted,
            end_mono_ns: end,
            ..Default::default()
        }
    }

    fn step(start: u64, end: u64, members: &[(&str, &'static str)]) -> StepRecord {
        StepRecord {
            pid: 7,
            engine: "llama.cpp".into(),
            tid: 70,
            start_mono_ns: start,
            end_mono_ns: end,
            duration_ms: ns_to_ms(end - start),
            sequences: members.len() as u64,
            prefilling: members.iter().filter(|m| m.1 == "prefill").count() as u64,
            requests: members
                .iter()
                .map(|(id, phase)| StepMember {
                    request_id: (*id).into(),
                    phase,
                })
                .collect(),
            ..StepRecord::default()
        }
    }

    fn kernel(launch: u64, start: u64, end: u64, tensor: bool, device: u32) -> KernelRecord {
        KernelRecord {
            pid: 7,
            name: format!("k{launch}"),
            device_id: device,
            context_id: 1,
            stream_id: 7,
            correlation_id: launch as u32,
            launch_tid: 70,
            launch_api: "cuLaunchKernel".into(),
            launch_mono_ns: launch,
            start_mono_ns: start,
            end_mono_ns: end,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            static_shared_bytes: 0,
            dynamic_shared_bytes: 0,
            graph_id: 0,
            graph_node_id: 0,
            tensor_core: tensor,
        }
    }

    #[test]
    fn kernels_join_through_steps_into_phases() {
        let mut b = B::new(TimelineLimits::default());
        b.on_step(step(100, 200, &[("a", "prefill")]));
        b.on_step(step(200, 300, &[("a", "decode"), ("b", "prefill")]));
        b.on_step(step(300, 400, &[("b", "decode")]));
        // Prefill step of a: two overlapping kernels, one on tensor cores.
        b.on_kernel(kernel(110, 120, 160, true, 0), 1000);
        b.on_kernel(kernel(115, 140, 180, false, 0), 1000);
        // Decode step of a (shared with b's prefill).
        b.on_kernel(kernel(210, 220, 240, false, 1), 1000);
        // b's decode only.
        b.on_kernel(kernel(310, 320, 330, false, 0), 1000);
        let mut out = Vec::new();
        b.on_request(request("a", 50, Some(100), 350), 1000, &mut out);
        assert!(out.is_empty(), "waits for kernels to settle");
        b.poll(1000 + 2_000_000_000, &mut out);
        let t = &out[0];
        assert_eq!(t.steps.len(), 2);
        let prefill = t.prefill_gpu.as_ref().unwrap();
        assert_eq!(prefill.kernels, 2);
        assert!((prefill.busy_ms - 60e-6).abs() < 1e-12, "union 120..180");
        assert!((prefill.tensor_core_share - 40.0 / 60.0).abs() < 1e-9);
        let decode = t.decode_gpu.as_ref().unwrap();
        assert_eq!(decode.kernels, 1);
        assert_eq!(decode.devices, vec![1]);
        assert_eq!(t.kernels.len(), 3);
        assert!(t.unknown.is_empty());
    }

    #[test]
    fn a_step_s_launches_merge_with_its_shim_kernels_once_they_settle() {
        use inferscope_model::LaunchRecord;
        let mut b = B::new(TimelineLimits::default());
        let uprobe = |ts: u64, name: &str| LaunchRecord {
            pid: 7,
            tid: 70,
            kind: "kernel",
            api: "cuLaunchKernel",
            source: "uprobe",
            enqueue_mono_ns: ts,
            name: name.into(),
            named: !name.starts_with("unnamed#"),
            handle: ts,
            stream: 1,
            grid: Some([1, 1, 1]),
            block: Some([32, 1, 1]),
            shared_mem_bytes: Some(0),
            stands_for: 1,
            sampled: false,
            args_unread: false,
        };
        let mut s = step(100, 200, &[("a", "decode")]);
        let launches = vec![uprobe(110, "unnamed#1"), uprobe(150, "k150")];
        let items: Vec<crate::correlate::launches::Item<'_>> = launches
            .iter()
            .map(crate::correlate::launches::Item::of)
            .collect();
        s.gpu_launches = Some(crate::correlate::launches::summarise(
            &items, 100, 200, 100, "uprobe",
        ));
        s.launch_list = Some(launches.clone().into());
        b.on_step(s);
        // The shim saw both launches, 2 ns after the uprobes' entries.
        b.on_kernel(kernel(112, 120, 130, false, 0), 1000);
        b.on_kernel(kernel(152, 160, 170, false, 0), 1000);
        let mut out = Vec::new();
        b.on_request(request("a", 50, Some(100), 250), 1000, &mut out);
        b.poll(1000 + 2_000_000_000, &mut out);
        let t = &out[0];
        let l = t.steps[0].gpu_launches.as_ref().unwrap();
        assert_eq!(l.source, "both");
        assert_eq!(l.kernel_launches, 2, "each launch once: {l:?}");
        assert_eq!(l.named_launches, 2);
        let sources = l.sources.as_ref().unwrap();
        assert_eq!((sources.both, sources.named_by_shim), (2, 1));
        // Merged once, then the launch records are dropped.
        assert!(b.steps()[0].launch_list.is_none());
        assert!(t.steps[0].launch_list.is_none());
        // A process without the shim keeps its uprobes' summary, and drops its records too.
        let mut other = step(300, 400, &[("c", "decode")]);
        other.pid = 9;
        other.gpu_launches = Some(crate::correlate::launches::summarise(
            &items, 300, 400, 300, "uprobe",
        ));
        other.launch_list = Some(launches.into());
        b.on_step(other);
        b.poll(3_000_000_000, &mut out);
        assert_eq!(b.steps()[1].gpu_launches.as_ref().unwrap().source, "uprobe");
        assert!(b.steps()[1].launch_list.is_none());
    }

    #[test]
    fn engine_listed_steps_join_kernels_of_their_engine_process() {
        use inferscope_model::StepRef;
        let mut b = B::new(TimelineLimits::default());
        // Steps seen in process 7 (vLLM's API server) list engine ids; process 8 (its
        // EngineCore) launched their kernels. The second step's start is unknown (after an idle
        // gap) but its kernels are those since the engine's previous step.
        let mut first = step(100, 200, &[("chatcmpl-a-12345678", "prefill")]);
        first.kernel_pid = Some(8);
        let mut second = step(400, 400, &[("chatcmpl-a-12345678", "decode")]);
        second.kernel_pid = Some(8);
        second.kernels_from_ns = Some(201);
        b.on_step(first);
        b.on_step(second);
        let mut k = kernel(150, 160, 170, false, 0);
        k.pid = 8;
        b.on_kernel(k.clone(), 1000);
        k.launch_mono_ns = 350;
        b.on_kernel(k.clone(), 1000);
        k.pid = 7;
        b.on_kernel(k, 1000);
        let mut r = request("7-1-0", 50, Some(100), 450);
        r.engine_steps = vec![
            StepRef {
                pid: 7,
                end_mono_ns: 200,
                phase: "prefill",
            },
            StepRef {
                pid: 7,
                end_mono_ns: 400,
                phase: "decode",
            },
        ];
        let mut out = Vec::new();
        b.on_request(r, 1000, &mut out);
        assert!(out.is_empty(), "waits for the engine process's kernels");
        b.poll(1000 + 2_000_000_000, &mut out);
        let t = &out[0];
        assert_eq!(t.steps.len(), 2);
        assert!(
            t.steps
                .iter()
                .all(|s| s.requests.iter().any(|m| m.request_id == "7-1-0"))
        );
        assert_eq!(t.prefill_gpu.as_ref().unwrap().kernels, 1);
        assert_eq!(t.decode_gpu.as_ref().unwrap().kernels, 1);
        assert_eq!(t.kernels_of(&t.steps[1]).count(), 1);
    }

    #[test]
    fn missing_layers_are_named_not_guessed() {
        let mut b = B::new(TimelineLimits::default());
        let mut out = Vec::new();
        b.on_request(request("x", 10, None, 20), 1000, &mut out);
        assert_eq!(out.len(), 1, "no shim: closed at once");
        assert_eq!(out[0].unknown, vec!["scheduler", "steps", "gpu"]);
        assert!(out[0].prefill_gpu.is_none());
    }

    #[test]
    fn later_kernels_close_the_timeline_early() {
        let mut b = B::new(TimelineLimits::default());
        b.on_step(step(100, 200, &[("a", "prefill")]));
        b.on_kernel(kernel(110, 120, 130, false, 0), 1000);
        let mut out = Vec::new();
        b.on_request(request("a", 50, Some(100), 200), 1000, &mut out);
        assert!(out.is_empty());
        b.on_kernel(kernel(500, 510, 520, false, 0), 1001);
        b.poll(1001, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].prefill_gpu.as_ref().unwrap().kernels, 1);
    }

    #[test]
    fn union_merges_overlaps() {
        assert_eq!(union_ns(&mut [(0, 10), (5, 15), (20, 30)]), 25);
        assert_eq!(union_ns(&mut []), 0);
    }
}
