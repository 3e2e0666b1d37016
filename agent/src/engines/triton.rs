//! NVIDIA Triton Inference Server (often fronting TensorRT-LLM).
use super::{CallStream, Engine, ProcessInfo, RpcIdField, kserve};

pub(super) struct Triton;

impl Engine for Triton {
    fn name(&self) -> &'static str {
        "triton"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("tritonserver")
    }

    fn rpc_id_fields(&self) -> &'static [RpcIdField] {
        &[RpcIdField {
            path: kserve::MODEL_INFER,
            field: kserve::ID_FIELD,
        }]
    }

    fn call_streams(&self) -> &'static [CallStream] {
        // Streamed generation (TensorRT-LLM's `stream: true`, decoupled models): one call per
        // `ModelInferRequest`, answered by responses that carry its id.
        &[CallStream {
            path: kserve::MODEL_STREAM_INFER,
            request_id: kserve::request_id,
            response: kserve::stream_response,
        }]
    }
}
