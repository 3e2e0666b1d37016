//! TensorRT-LLM: `trtllm-serve`, or any process that loaded libtensorrt_llm.
use super::{Engine, ProcessInfo};

pub struct TensorRtLlm;

impl Engine for TensorRtLlm {
    fn name(&self) -> &'static str {
        "tensorrt-llm"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("trtllm-serve") || p.maps_file("libtensorrt_llm")
    }
}
