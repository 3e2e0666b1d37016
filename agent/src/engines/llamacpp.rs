//! llama.cpp's HTTP server: the `llama-server` binary, or the library loaded into another
//! process (libllama, or the xllamacpp Python extension).
use super::{Engine, ProcessInfo};

pub struct LlamaCpp;

impl Engine for LlamaCpp {
    fn name(&self) -> &'static str {
        "llamacpp"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        p.cmdline_has("llama-server")
            || p.maps_file("xllamacpp")
            || p.maps_file("libllama")
            || p.maps_file("llama-server")
    }
}
