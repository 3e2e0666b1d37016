//! The continuous diagnosis of a long-running agent: every interval, the last `window` against
//! the `baseline` before it; a regression is reported when P99 TTFT crossed `ratio` × its
//! baseline (and the diagnosis's own regression thresholds).
use std::time::Duration;

use inferscope_model::thresholds;

use super::{Diagnosis, TimeWindow, diagnose, history::History};

#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchConfig {
    pub baseline: Duration,
    pub window: Duration,
    pub interval: Duration,
    /// Incident P99 TTFT ÷ baseline P99 TTFT that raises the alarm.
    pub ratio: f64,
}

/// What one evaluation found.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub diagnosis: Diagnosis,
    /// The alarm is raised now.
    pub active: bool,
    /// The alarm was raised or cleared by this evaluation.
    pub changed: bool,
}

pub(crate) struct Watch {
    pub config: WatchConfig,
    next_ns: u64,
    active: bool,
}

impl Watch {
    pub(crate) fn new(config: WatchConfig, now_ns: u64) -> Self {
        Self {
            config,
            // The first evaluation needs a full baseline and window behind it.
            next_ns: now_ns + config.interval.as_nanos() as u64,
            active: false,
        }
    }

    /// Whether the interval has passed (the next [`Watch::tick`] evaluates).
    pub(crate) fn due(&self, now_ns: u64) -> bool {
        now_ns >= self.next_ns
    }

    /// Evaluates when the interval has passed; `None` otherwise.
    pub(crate) fn tick(&mut self, history: &History, now_ns: u64) -> Option<Verdict> {
        if !self.due(now_ns) {
            return None;
        }
        self.next_ns = now_ns + self.config.interval.as_nanos() as u64;
        let window_ns = self.config.window.as_nanos() as u64;
        let baseline_ns = self.config.baseline.as_nanos() as u64;
        let window = TimeWindow {
            start_mono_ns: now_ns.saturating_sub(window_ns),
            end_mono_ns: now_ns,
        };
        let baseline = TimeWindow {
            start_mono_ns: window.start_mono_ns.saturating_sub(baseline_ns),
            end_mono_ns: window.start_mono_ns,
        };
        // Requests that arrived in the baseline may end inside it or later.
        let inputs = history.inputs_since(baseline.start_mono_ns);
        let diagnosis = diagnose(&inputs, baseline, window);
        let enough = diagnosis.requests.baseline.min(diagnosis.requests.window)
            >= thresholds::MIN_REQUESTS_PER_WINDOW;
        let ratio = match (diagnosis.ttft_p99_ms.baseline, diagnosis.ttft_p99_ms.window) {
            (Some(b), Some(w)) if b > 0.0 => w / b,
            _ => 0.0,
        };
        let active = enough && diagnosis.regression && ratio >= self.config.ratio;
        let changed = active != self.active;
        self.active = active;
        Some(Verdict {
            diagnosis,
            active,
            changed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::{RequestSample, history::HistoryLimits};

    const S: u64 = 1_000_000_000;

    fn request(arrival_s: u64, ttft_ms: f64) -> RequestSample {
        RequestSample {
            method: "POST".into(),
            arrival_mono_ns: arrival_s * S,
            end_mono_ns: arrival_s * S + (ttft_ms * 1e6) as u64 + S,
            ttft_ms: Some(ttft_ms),
            queue_wait_ms: Some(ttft_ms * 0.9),
            prefill_ms: Some(ttft_ms * 0.1),
            ..Default::default()
        }
    }

    #[test]
    fn raises_and_clears_the_alarm() {
        let config = WatchConfig {
            baseline: Duration::from_secs(60),
            window: Duration::from_secs(20),
            interval: Duration::from_secs(10),
            ratio: 2.0,
        };
        let mut h = History::new(HistoryLimits::default());
        let mut w = Watch::new(config, 0);
        // Steady traffic for 60 s, then 20 s of 10× slower TTFT.
        for t in 0..60 {
            h.push_request(request(1000 + t, 100.0 + (t % 7) as f64));
        }
        assert!(w.tick(&h, 5 * S).is_none(), "before the first interval");
        let quiet = w.tick(&h, 1061 * S).expect("evaluated");
        assert!(!quiet.active);
        for t in 62..80 {
            h.push_request(request(1000 + t, 1000.0 + t as f64));
        }
        let alarm = w.tick(&h, 1082 * S).expect("evaluated");
        assert!(
            alarm.active && alarm.changed,
            "{:?}",
            alarm.diagnosis.summary
        );
        let again = w.tick(&h, 1083 * S);
        assert!(again.is_none(), "not before the interval");
        // Traffic stops: too few requests to decide, so the alarm clears.
        let cleared = w.tick(&h, 1200 * S).expect("evaluated");
        assert!(!cleared.active && cleared.changed);
    }
}
