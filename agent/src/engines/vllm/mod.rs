//! vLLM: the OpenAI-compatible API server (`vllm serve`, or the entrypoint module) and its
//! EngineCore process, and the V1 IPC between them (ZMQ + msgpack, see [`ipc`]).
mod ipc;
mod layout;
mod messages;
mod state;

use super::{Engine, EngineIpc, ProcessInfo};

pub use ipc::VllmIpc;

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
            // The engine process names itself with setproctitle.
            || p.cmdline.starts_with("VLLM::EngineCore")
    }

    fn ipc(&self) -> Option<Box<dyn EngineIpc>> {
        Some(Box::new(VllmIpc::default()))
    }
}

#[cfg(test)]
mod tests;
