//! The agent's gRPC API (proto/inferscope/v1/agent.proto): `Subscribe`, `ListRequests`,
//! `GetRequest`, served from the [`Hub`].
use std::{
    pin::Pin,
    sync::{Arc, Mutex, atomic::Ordering},
};

use inferscope_model::clock::monotonic_now_ns;
use inferscope_proto::v1::agent::{self as pb, event::Record, inferscope_server::Inferscope};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::{
    hub::{Hub, HubEvent},
    proto_conv,
};
use crate::{
    diagnose::{self, Timeline, history::History, parse_window},
    join::timeline::RequestTimeline,
};

/// Events queued per subscriber stream on the server side (the broadcast buffer is in front).
const STREAM_BUFFER: usize = 256;
const DEFAULT_LIST_LIMIT: usize = 100;
const MAX_LIST_LIMIT: usize = 10_000;

pub(crate) struct ApiService {
    hub: Arc<Hub>,
    /// What the agent keeps for diagnosis (`None`: the watch is off).
    history: Option<Arc<Mutex<History>>>,
}

impl ApiService {
    pub(crate) fn new(hub: Arc<Hub>, history: Option<Arc<Mutex<History>>>) -> Self {
        Self { hub, history }
    }
}

/// The diagnosis as the API returns it: the JSON of `inferscope diagnose --json` and the report.
pub(crate) fn diagnosis_message(d: &diagnose::Diagnosis) -> pb::Diagnosis {
    pb::Diagnosis {
        json: serde_json::to_string(d).unwrap_or_default(),
        report: diagnose::render(d),
        cause: d.cause.as_str().to_owned(),
        secondary_cause: d.secondary_cause.as_str().to_owned(),
        confidence: d.confidence,
    }
}

struct Filter {
    engine: String,
    pid: u32,
    min_ttft_ms: f64,
    requests: bool,
    steps: bool,
    kernels: bool,
    gpus: bool,
    diagnoses: bool,
}

impl Filter {
    fn new(r: &pb::SubscribeRequest) -> Self {
        let all = !(r.requests || r.steps || r.kernels || r.gpus);
        Self {
            engine: r.engine.clone(),
            pid: r.pid,
            min_ttft_ms: r.min_ttft_ms,
            requests: all || r.requests,
            steps: all || r.steps,
            kernels: all || r.kernels,
            gpus: all || r.gpus,
            diagnoses: all,
        }
    }

    fn keeps_request(&self, t: &RequestTimeline) -> bool {
        let r = &t.request;
        (self.engine.is_empty() || r.engine == self.engine)
            && (self.pid == 0 || r.pid == self.pid)
            && (self.min_ttft_ms <= 0.0 || r.ttft_ms.is_some_and(|v| v >= self.min_ttft_ms))
    }

    fn convert(&self, event: &HubEvent) -> Option<Record> {
        match event {
            HubEvent::Request(t) if self.requests && self.keeps_request(t) => {
                Some(Record::Request(proto_conv::request(t)))
            }
            HubEvent::Step(s)
                if self.steps
                    && (self.engine.is_empty() || s.engine == self.engine)
                    && (self.pid == 0 || s.pid == self.pid) =>
            {
                Some(Record::Step(proto_conv::step(s)))
            }
            HubEvent::Kernel(k) if self.kernels && (self.pid == 0 || k.pid == self.pid) => {
                Some(Record::Kernel(proto_conv::kernel(k)))
            }
            HubEvent::Gpu(g) if self.gpus => Some(Record::Gpu((**g).clone())),
            HubEvent::Diagnosis(d) if self.diagnoses => Some(Record::Diagnosis((**d).clone())),
            _ => None,
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl Inferscope for ApiService {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let filter = Filter::new(request.get_ref());
        let mut events = self.hub.subscribe();
        let hub = self.hub.clone();
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        hub.subscribers.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut lagged = 0u64;
            loop {
                let event = match events.recv().await {
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        lagged += n;
                        hub.note_lagged(n);
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                let Some(record) = filter.convert(&event) else {
                    continue;
                };
                let message = pb::Event {
                    record: Some(record),
                    lagged: std::mem::take(&mut lagged),
                };
                // Waiting here only delays this subscriber: the broadcast buffer absorbs the
                // difference, and past it this subscriber lags.
                if tx.send(Ok(message)).await.is_err() {
                    break;
                }
            }
            hub.subscribers.fetch_sub(1, Ordering::Relaxed);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_requests(
        &self,
        request: Request<pb::ListRequestsRequest>,
    ) -> Result<Response<pb::ListRequestsResponse>, Status> {
        let r = request.into_inner();
        let limit = match r.limit as usize {
            0 => DEFAULT_LIST_LIMIT,
            n => n.min(MAX_LIST_LIMIT),
        };
        let filter = Filter::new(&pb::SubscribeRequest {
            engine: r.engine,
            pid: r.pid,
            min_ttft_ms: r.min_ttft_ms,
            ..Default::default()
        });
        let since = r.since_mono_ns;
        let requests = self
            .hub
            .recent(
                |t| filter.keeps_request(t) && t.request.end_mono_ns >= since,
                limit,
            )
            .iter()
            .map(|t| proto_conv::request(t))
            .collect();
        Ok(Response::new(pb::ListRequestsResponse { requests }))
    }

    async fn diagnose(
        &self,
        request: Request<pb::DiagnoseRequest>,
    ) -> Result<Response<pb::Diagnosis>, Status> {
        let r = request.into_inner();
        let Some(history) = &self.history else {
            return Err(Status::failed_precondition(
                "this agent keeps no history for diagnosis (it runs with --diagnose-interval off)",
            ));
        };
        let baseline = parse_window(&r.baseline)
            .map_err(|e| Status::invalid_argument(format!("baseline: {e}")))?;
        let window = parse_window(&r.window)
            .map_err(|e| Status::invalid_argument(format!("window: {e}")))?;
        let inputs = history
            .lock()
            .map_err(|_| Status::internal("the diagnosis history is unavailable"))?
            .inputs_since(0);
        let Some(mut timeline) = Timeline::of(&inputs.requests) else {
            return Err(Status::failed_precondition(
                "the agent has seen no finished requests yet",
            ));
        };
        // "The last 5m" means up to now, not up to the last request.
        timeline.end_mono_ns = timeline.end_mono_ns.max(monotonic_now_ns());
        let (base, win) = timeline
            .windows(baseline, window)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let d = diagnose::diagnose(&inputs, base, win);
        Ok(Response::new(diagnosis_message(&d)))
    }

    async fn get_request(
        &self,
        request: Request<pb::GetRequestRequest>,
    ) -> Result<Response<pb::RequestTimeline>, Status> {
        let id = request.into_inner().request_id;
        match self.hub.find(&id) {
            Some(t) => Ok(Response::new(proto_conv::timeline(&t))),
            None => Err(Status::not_found(format!(
                "no recent request with id {id:?}; the agent keeps the most recent requests only (see --recent-requests)"
            ))),
        }
    }
}
