//! `run --records FILE`: one JSON line per finished request.
use std::sync::Arc;

use inferscope_model::Counter;

use crate::{export::jsonl::JsonlWriter, join::RequestTimeline, pipeline::Sink};

pub(crate) struct JsonlSink(pub JsonlWriter);

impl Sink for JsonlSink {
    fn on_timeline(&mut self, timeline: &Arc<RequestTimeline>) {
        self.0.write_or_report(&timeline.request, "a record");
    }

    fn counters(&self) -> Vec<(Counter, u64)> {
        vec![(Counter::RecordsWriteFailed, self.0.failed)]
    }
}
