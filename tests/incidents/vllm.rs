//! The incident suite's vLLM launcher: vLLM's real `vllm serve` (API server, EngineCore,
//! scheduler, KV cache manager) on CPU with only the forward pass faked by a sleep of
//! `step_ms` + `token_us` per scheduled token (tests/engine/vllm). The engine settings map onto
//! vLLM's own flags, so the agent reads them from the real process's command line.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use inferscope_integration_tests::{
    vllm::{VllmOptions, VllmServer},
    vllm_load::{self, IdSource, Job, Kind},
};

use super::{EngineSettings, Launcher, Running};

/// vLLM with a fixed fake device (step and per-token cost) and context length; the settings
/// give max_num_seqs, max_num_batched_tokens and the KV pool.
pub(crate) struct Vllm {
    pub step_ms: f64,
    pub token_us: f64,
    pub block_size: u32,
    pub max_model_len: u32,
    /// The KV pool when the settings name none, in blocks.
    pub kv_blocks: u32,
}

impl Running for VllmServer {
    fn pid(&self) -> u32 {
        VllmServer::pid(self)
    }
}

/// Each start gets a work dir of its own (sockets, ground truth, log).
static STARTS: AtomicU32 = AtomicU32::new(0);

fn work_dir(port: u16) -> PathBuf {
    let n = STARTS.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "inferscope-incident-vllm-{}-{port}-{n}",
        std::process::id()
    ))
}

impl Launcher for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn start(&self, port: u16, settings: EngineSettings) -> Box<dyn Running> {
        let opts = VllmOptions {
            kv_blocks: settings
                .kv_tokens
                .map_or(self.kv_blocks, |t| t.div_ceil(self.block_size)),
            block_size: self.block_size,
            max_num_seqs: settings.slots,
            max_num_batched_tokens: settings.batch_tokens.unwrap_or(0),
            max_model_len: self.max_model_len,
            step_ms: self.step_ms,
            token_us: self.token_us,
            extra: Vec::new(),
            env: Vec::new(),
            https: false,
            grpc: false,
        };
        let dir = work_dir(port);
        let _ = std::fs::remove_dir_all(&dir);
        let server = VllmServer::start(&dir, port, &opts);
        prioritize_group(server.pid());
        // vLLM's first requests run lazy start-up work (tokenizer, renderers) on the event
        // loop: a few, short and long, before anything is measured.
        let warm: Vec<Job> = (0..6)
            .map(|i| chat_job(900_000 + i, if i % 2 == 0 { 8 } else { 300 }, 4))
            .collect();
        let _ = vllm_load::run_all(port, &warm, 4);
        Box::new(server)
    }

    fn ask(&self, port: u16, seed: u64, words: usize, max_tokens: u32) {
        let job = chat_job(seed, words, max_tokens);
        let out = vllm_load::run(port, &job);
        assert!(out.done, "a request did not complete: {job:?}: {out:?}");
    }

    fn serves_metrics(&self) -> bool {
        true
    }

    fn settle(&self) -> Duration {
        Duration::from_millis(1500)
    }
}

/// A streaming chat of `words` one-token words, distinct per `seed` from the first token on (no
/// shared cached prefix beyond the chat template).
fn chat_job(seed: u64, words: usize, max_tokens: u32) -> Job {
    Job {
        kind: Kind::Chat,
        id: IdSource::Generated,
        max_tokens,
        words,
        seed: seed as usize,
    }
}

/// nice -10 for the API server and its EngineCore (one process group): a burst of other work
/// on a shared machine must not stall the scheduler into an unplanned regression.
fn prioritize_group(pgid: u32) {
    let status = Command::new("renice")
        .args(["-n", "-10", "-g", &pgid.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("running renice (util-linux)");
    assert!(status.success(), "renice of vLLM's process group failed");
}
