//! vLLM's OpenAI-compatible API server (`vllm serve`, or the entrypoint module).
use super::{Engine, ProcessInfo};

pub struct Vllm;

impl Engine for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("vllm serve")
            || p.cmdline_has("/vllm ")
            || p.cmdline.ends_with("/vllm")
            || p.cmdline_has("vllm.entrypoints")
    }
}
