//! What a long-running agent keeps for diagnosis: bounded rings of recent samples (by count and
//! by age), from which [`Inputs`] for any baseline and incident window inside them are cut.
use std::collections::VecDeque;

use super::{DeviceSample, EngineConfigSample, EngineSample, Inputs, RequestSample, StepSample};

#[derive(Debug, Clone, Copy)]
pub(crate) struct HistoryLimits {
    /// Samples older than this (relative to the newest) are dropped.
    pub max_age_ns: u64,
    pub requests: usize,
    pub steps: usize,
    pub engine: usize,
    pub devices: usize,
    /// Engine processes' scheduler settings (one per process attached).
    pub configs: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self {
            max_age_ns: 2 * 3600 * 1_000_000_000,
            // Powers of two: a VecDeque grows by doubling, so a cap just above one (200,000)
            // made each ring allocate room for 262,144 (memory bound of `run`: docs/src/running.md).
            requests: 1 << 17,
            steps: 1 << 17,
            engine: 20_000,
            devices: 50_000,
            configs: 256,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct History {
    limits: HistoryLimits,
    requests: VecDeque<RequestSample>,
    steps: VecDeque<StepSample>,
    engine: VecDeque<EngineSample>,
    devices: VecDeque<DeviceSample>,
    configs: VecDeque<EngineConfigSample>,
    /// Samples dropped because a ring was full (not because they aged out).
    pub dropped: u64,
}

fn push<T>(ring: &mut VecDeque<T>, cap: usize, item: T, dropped: &mut u64) {
    if ring.len() >= cap {
        ring.pop_front();
        *dropped += 1;
    }
    ring.push_back(item);
}

fn expire<T>(ring: &mut VecDeque<T>, oldest: u64, time: impl Fn(&T) -> u64) {
    while ring.front().is_some_and(|x| time(x) < oldest) {
        ring.pop_front();
    }
}

impl History {
    pub(crate) fn new(limits: HistoryLimits) -> Self {
        Self {
            limits,
            ..Default::default()
        }
    }

    pub(crate) fn push_request(&mut self, r: RequestSample) {
        let cap = self.limits.requests;
        push(&mut self.requests, cap, r, &mut self.dropped);
    }

    pub(crate) fn push_step(&mut self, s: StepSample) {
        let cap = self.limits.steps;
        push(&mut self.steps, cap, s, &mut self.dropped);
    }

    pub(crate) fn push_engine(&mut self, e: EngineSample) {
        let cap = self.limits.engine;
        push(&mut self.engine, cap, e, &mut self.dropped);
    }

    pub(crate) fn push_device(&mut self, d: DeviceSample) {
        let cap = self.limits.devices;
        push(&mut self.devices, cap, d, &mut self.dropped);
    }

    pub(crate) fn push_config(&mut self, c: EngineConfigSample) {
        let cap = self.limits.configs;
        push(&mut self.configs, cap, c, &mut self.dropped);
    }

    /// Drops what is older than the age limit before `now_ns`.
    pub(crate) fn expire(&mut self, now_ns: u64) {
        let oldest = now_ns.saturating_sub(self.limits.max_age_ns);
        expire(&mut self.requests, oldest, |r| r.end_mono_ns);
        expire(&mut self.steps, oldest, |s| s.start_mono_ns);
        expire(&mut self.engine, oldest, |e| e.mono_ns);
        expire(&mut self.devices, oldest, |d| d.mono_ns);
    }

    /// Requests held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.requests.len()
    }

    /// Every sample at or after `from_ns`.
    pub(crate) fn inputs_since(&self, from_ns: u64) -> Inputs {
        Inputs {
            requests: self
                .requests
                .iter()
                .filter(|r| r.end_mono_ns >= from_ns)
                .cloned()
                .collect(),
            steps: self
                .steps
                .iter()
                .filter(|s| s.start_mono_ns >= from_ns)
                .cloned()
                .collect(),
            engine: self
                .engine
                .iter()
                .filter(|e| e.mono_ns >= from_ns)
                .cloned()
                .collect(),
            devices: self
                .devices
                .iter()
                .filter(|d| d.mono_ns >= from_ns)
                .cloned()
                .collect(),
            // A process's settings hold for as long as it runs, however long ago it attached.
            configs: self.configs.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(end: u64) -> RequestSample {
        RequestSample {
            arrival_mono_ns: end.saturating_sub(10),
            end_mono_ns: end,
            ..Default::default()
        }
    }

    #[test]
    fn bounded_by_count_and_age() {
        let mut h = History::new(HistoryLimits {
            max_age_ns: 100,
            requests: 3,
            ..Default::default()
        });
        for t in [10, 20, 30, 40] {
            h.push_request(request(t));
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.dropped, 1);
        h.expire(125);
        assert_eq!(h.len(), 2, "20 is more than 100 ns before 125");
        assert_eq!(h.inputs_since(40).requests.len(), 1);
    }
}
