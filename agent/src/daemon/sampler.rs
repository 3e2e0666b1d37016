//! Which finished requests become traces.
use std::hash::{Hash, Hasher};

use inferscope_model::RequestRecord;

/// Which requests become traces: a share of all, plus every slow one, plus every one whose
/// caller's trace is sampled (a parent-based decision, as OpenTelemetry SDKs make it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sampler {
    pub ratio: f64,
    pub always_ttft_ms: Option<f64>,
}

impl Sampler {
    pub(crate) fn keep(&self, r: &RequestRecord) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        if self
            .always_ttft_ms
            .is_some_and(|min| r.ttft_ms.is_some_and(|t| t >= min))
        {
            return true;
        }
        if r.traceparent
            .as_deref()
            .is_some_and(|tp| tp.len() == 55 && tp.ends_with("-01"))
        {
            return true;
        }
        let mut h = rustc_hash::FxHasher::default();
        r.request_id.hash(&mut h);
        (h.finish() as f64 / u64::MAX as f64) < self.ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_keeps_a_share_and_every_slow_or_sampled_parent() {
        let s = Sampler {
            ratio: 0.1,
            always_ttft_ms: Some(500.0),
        };
        let kept = (0..10_000)
            .filter(|i| {
                s.keep(&RequestRecord {
                    request_id: format!("1-{i}-0"),
                    ..Default::default()
                })
            })
            .count();
        assert!((700..1300).contains(&kept), "kept {kept} of 10000 at 0.1");
        assert!(s.keep(&RequestRecord {
            ttft_ms: Some(600.0),
            ..Default::default()
        }));
        assert!(s.keep(&RequestRecord {
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            ..Default::default()
        }));
    }
}
