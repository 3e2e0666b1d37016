//! SGLang's server (`python -m sglang.launch_server`, `sglang serve`).
use super::{Engine, ProcessInfo};

pub struct Sglang;

impl Engine for Sglang {
    fn name(&self) -> &'static str {
        "sglang"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("sglang.launch_server") || p.cmdline_has("sglang serve")
    }
}
