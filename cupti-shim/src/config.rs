//! Settings read once from the environment at injection time.
use std::{path::PathBuf, time::Duration};

pub(crate) const DEFAULT_SOCKET: &str = "/run/inferscope/shim.sock";

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub socket: PathBuf,
    /// Also record memcpy and memset activity.
    pub memcpy: bool,
    /// Size of each CUPTI activity buffer.
    pub buffer_bytes: usize,
    /// Buffers handed to CUPTI and not yet returned; beyond this CUPTI drops (and counts) records.
    pub max_buffers: usize,
    /// Batches waiting for the sender thread; beyond this batches are dropped and counted.
    pub queue_batches: usize,
    /// How often the sender asks CUPTI for partly filled buffers while an agent listens.
    pub flush_interval: Duration,
    /// Print one summary line on stderr at process exit.
    pub summary: bool,
}

impl Config {
    pub(crate) fn from_env() -> Self {
        let socket = std::env::var_os("INFERSCOPE_SHIM_SOCKET")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        Config {
            socket,
            memcpy: env_flag("INFERSCOPE_SHIM_MEMCPY"),
            buffer_bytes: env_num("INFERSCOPE_SHIM_BUFFER_KIB", 256).clamp(4, 64 * 1024) * 1024,
            max_buffers: env_num("INFERSCOPE_SHIM_MAX_BUFFERS", 64).clamp(1, 4096),
            queue_batches: env_num("INFERSCOPE_SHIM_QUEUE", 256).clamp(1, 65536),
            flush_interval: Duration::from_millis(
                env_num("INFERSCOPE_SHIM_FLUSH_MS", 200).clamp(10, 60_000) as u64,
            ),
            summary: !env_flag("INFERSCOPE_SHIM_QUIET"),
        }
    }
}

pub(crate) fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "yes" | "on"))
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}
