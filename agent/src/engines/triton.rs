//! NVIDIA Triton Inference Server (often fronting TensorRT-LLM).
use super::{Engine, ProcessInfo};

pub struct Triton;

impl Engine for Triton {
    fn name(&self) -> &'static str {
        "triton"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("tritonserver")
    }
}
