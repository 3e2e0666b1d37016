//! The gRPC API's hub: the recent window and the live stream `top` and `inspect` read.
use std::sync::{Arc, atomic::Ordering};

use inferscope_model::{Counter, StepRecord};

use crate::{
    capture::gpu::GpuSample,
    export::hub::{Hub, HubEvent},
    join::{KernelRecord, RequestTimeline},
    pipeline::Sink,
};

pub(crate) struct GrpcSink(pub Arc<Hub>);

impl Sink for GrpcSink {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        self.0.publish_request(Arc::clone(timeline));
    }

    fn on_step(&mut self, step: &StepRecord) {
        if self.0.has_subscribers() {
            self.0.publish(HubEvent::Step(Arc::new(step.clone())));
        }
    }

    fn on_kernel(&mut self, kernel: &KernelRecord) {
        if self.0.has_subscribers() {
            self.0.publish(HubEvent::Kernel(Arc::new(kernel.clone())));
        }
    }

    fn on_gpu(&mut self, samples: &[GpuSample]) {
        if self.0.has_subscribers() {
            for g in samples {
                self.0
                    .publish(HubEvent::Gpu(Arc::new(crate::export::proto_conv::gpu(g))));
            }
        }
    }

    fn counters(&self) -> Vec<(Counter, u64)> {
        vec![
            (
                Counter::GrpcSubscriberRecordsLagged,
                self.0.subscriber_lagged.load(Ordering::Relaxed),
            ),
            (
                Counter::GrpcSubscribers,
                self.0.subscribers.load(Ordering::Relaxed),
            ),
        ]
    }
}
