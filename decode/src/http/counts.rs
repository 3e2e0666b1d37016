//! The counts a response body or stream reports about itself (token usage, llama.cpp's timings):
//! filled by the JSON field reader, carried by the response events.
use serde::{Deserialize, Serialize};

/// Token counts reported by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: Option<u64>,
    /// Generated tokens.
    pub completion_tokens: Option<u64>,
    /// Prompt tokens the engine served from its prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`: vLLM, SGLang, llama.cpp; llama.cpp's
    /// `timings.cache_n` and native `tokens_cached` where usage lacks it).
    pub cached_tokens: Option<u64>,
}

/// llama.cpp's own prefill/decode measurements, to compare with what the
/// wire shows.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Timings {
    /// Prompt tokens processed.
    pub prompt_n: Option<u64>,
    /// Prompt processing time.
    pub prompt_ms: Option<f64>,
    /// Tokens generated.
    pub predicted_n: Option<u64>,
    /// Generation time.
    pub predicted_ms: Option<f64>,
}
