//! Where finished records meet their readers: a bounded window of recent request timelines for
//! `ListRequests`/`GetRequest`, and a broadcast of every record for `Subscribe`. Publishing never
//! blocks: a subscriber that falls behind loses records (and is told how many), the pipeline and
//! other subscribers go on.
use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use inferscope_model::StepRecord;
use inferscope_proto::v1::agent::{Diagnosis, GpuSample};
use tokio::sync::broadcast;

use crate::join::timeline::{KernelRecord, RequestTimeline};

#[derive(Debug, Clone)]
pub(crate) enum HubEvent {
    Request(Arc<RequestTimeline>),
    Step(Arc<StepRecord>),
    Kernel(Arc<KernelRecord>),
    Gpu(Arc<GpuSample>),
    /// A diagnosis of the continuous watch (JSON as `inferscope diagnose --json`, and the report).
    Diagnosis(Arc<Diagnosis>),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct HubLimits {
    /// Finished requests kept for `ListRequests`/`GetRequest`.
    pub recent_requests: usize,
    /// Records buffered per subscriber before it starts losing them.
    pub subscriber_buffer: usize,
}

impl Default for HubLimits {
    fn default() -> Self {
        Self {
            recent_requests: 4096,
            subscriber_buffer: 8192,
        }
    }
}

pub(crate) struct Hub {
    recent: Mutex<VecDeque<Arc<RequestTimeline>>>,
    limits: HubLimits,
    events: broadcast::Sender<HubEvent>,
    /// Records subscribers missed because they were too slow.
    pub subscriber_lagged: AtomicU64,
    pub subscribers: AtomicU64,
}

impl Hub {
    pub(crate) fn new(limits: HubLimits) -> Self {
        let (events, _) = broadcast::channel(limits.subscriber_buffer.max(1));
        Self {
            recent: Mutex::new(VecDeque::with_capacity(limits.recent_requests.min(1 << 16))),
            limits,
            events,
            subscriber_lagged: AtomicU64::new(0),
            subscribers: AtomicU64::new(0),
        }
    }

    pub(crate) fn publish_request(&self, timeline: Arc<RequestTimeline>) {
        if let Ok(mut recent) = self.recent.lock() {
            if recent.len() >= self.limits.recent_requests {
                recent.pop_front();
            }
            recent.push_back(timeline.clone());
        }
        self.publish(HubEvent::Request(timeline));
    }

    /// Sends to current subscribers; with none, the record is simply not kept.
    pub(crate) fn publish(&self, event: HubEvent) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event);
        }
    }

    pub(crate) fn has_subscribers(&self) -> bool {
        self.events.receiver_count() > 0
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<HubEvent> {
        self.events.subscribe()
    }

    pub(crate) fn note_lagged(&self, n: u64) {
        self.subscriber_lagged.fetch_add(n, Ordering::Relaxed);
    }

    /// Newest first, filtered.
    pub(crate) fn recent(
        &self,
        mut keep: impl FnMut(&RequestTimeline) -> bool,
        limit: usize,
    ) -> Vec<Arc<RequestTimeline>> {
        let Ok(recent) = self.recent.lock() else {
            return Vec::new();
        };
        recent
            .iter()
            .rev()
            .filter(|t| keep(t))
            .take(limit)
            .cloned()
            .collect()
    }

    /// By the agent's request id, the response id (`chatcmpl-…`), the caller's x-request-id or
    /// the request id of a gRPC call's message.
    pub(crate) fn find(&self, id: &str) -> Option<Arc<RequestTimeline>> {
        let recent = self.recent.lock().ok()?;
        recent
            .iter()
            .rev()
            .find(|t| {
                let r = &t.request;
                r.request_id == id
                    || r.response_id.as_deref() == Some(id)
                    || r.x_request_id.as_deref() == Some(id)
                    || r.rpc_request_id.as_deref() == Some(id)
            })
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use inferscope_model::RequestRecord;

    use super::*;

    fn timeline(id: &str) -> RequestTimeline {
        RequestTimeline::bare(RequestRecord {
            request_id: id.into(),
            x_request_id: Some(format!("x-{id}")),
            ..Default::default()
        })
    }

    #[test]
    fn window_is_bounded_and_searchable() {
        let hub = Hub::new(HubLimits {
            recent_requests: 3,
            subscriber_buffer: 4,
        });
        for i in 0..5 {
            hub.publish_request(Arc::new(timeline(&i.to_string())));
        }
        let ids: Vec<_> = hub
            .recent(|_| true, 10)
            .iter()
            .map(|t| t.request.request_id.clone())
            .collect();
        assert_eq!(ids, ["4", "3", "2"]);
        assert!(hub.find("x-3").is_some());
        assert!(hub.find("0").is_none());
    }

    #[test]
    fn slow_subscriber_lags_instead_of_blocking() {
        let hub = Hub::new(HubLimits {
            recent_requests: 3,
            subscriber_buffer: 4,
        });
        let mut rx = hub.subscribe();
        for i in 0..10 {
            hub.publish_request(Arc::new(timeline(&i.to_string())));
        }
        match rx.try_recv() {
            Err(broadcast::error::TryRecvError::Lagged(n)) => assert_eq!(n, 6),
            other => panic!("expected lag, got {other:?}"),
        }
    }
}
