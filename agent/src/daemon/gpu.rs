//! The daemon's GPU inputs: kernel records from CUPTI shims, and NVML samples.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use crate::capture::{
    gpu::{GpuSample, KernelFeed, ListenerConfig, ListenerError, NvmlSampler, ShimListener},
    process::sockpath::ClaimError,
};

/// The one way starting the GPU inputs fails.
#[derive(Debug, thiserror::Error)]
#[error("{0}; pass --shim-socket PATH (or off)")]
pub(crate) struct ShimSocketInUse(ClaimError);

pub(crate) struct GpuInputs {
    shim: KernelFeed,
    nvml: Option<NvmlSampler>,
    nvml_interval: Duration,
    last_sample: Option<Instant>,
}

impl GpuInputs {
    /// Neither input is required: without them, records say the GPU layer is unknown.
    /// Fails only when another live agent holds the shim socket: two agents would split the
    /// shims between them.
    pub(crate) fn start(
        shim_socket: Option<&Path>,
        nvml_interval: Option<Duration>,
    ) -> Result<Self, ShimSocketInUse> {
        let shim = KernelFeed::default();
        if let Some(path) = shim_socket
            && let Some(listener) = bind_shim(path)?
        {
            shim.set(listener);
        }
        let nvml = nvml_interval.and_then(|interval| match NvmlSampler::start(interval) {
            Ok(sampler) => {
                info!(gpus = sampler.gpus, "sampling NVML");
                Some(sampler)
            }
            Err(e) => {
                info!("{e}");
                None
            }
        });
        Ok(Self {
            shim,
            nvml,
            nvml_interval: nvml_interval.unwrap_or(Duration::from_secs(1)),
            last_sample: None,
        })
    }

    /// Starts listening for shims late: a successor agent, once the previous one has let go of
    /// the socket (a surge roll's takeover).
    pub(crate) fn listen(&mut self, path: &Path) -> Result<(), ShimSocketInUse> {
        if let Some(listener) = bind_shim(path)? {
            self.shim.set(listener);
        }
        Ok(())
    }

    /// Where the pipeline reads the shims' kernel records (it joins them to the requests).
    pub(crate) fn kernel_feed(&self) -> KernelFeed {
        self.shim.clone()
    }

    /// The newest NVML samples, at most once per interval.
    pub(crate) fn samples_due(&mut self) -> Option<Vec<GpuSample>> {
        let nvml = self.nvml.as_ref()?;
        if self
            .last_sample
            .is_some_and(|t| t.elapsed() < self.nvml_interval)
        {
            return None;
        }
        self.last_sample = Some(Instant::now());
        let samples = nvml.latest();
        (!samples.is_empty()).then_some(samples)
    }

    pub(crate) fn counters(&self) -> Vec<(inferscope_model::Counter, u64)> {
        self.shim.counters()
    }
}

/// Listens for shims at `path`; None (logged) where the socket cannot be made, an error where
/// another live agent holds it.
fn bind_shim(path: &Path) -> Result<Option<ShimListener>, ShimSocketInUse> {
    match ShimListener::bind(ListenerConfig::new(path)) {
        Ok(listener) => {
            info!(socket = %path.display(), "listening for CUPTI shims (CUDA_INJECTION64_PATH=libinferscope_cupti.so)");
            Ok(Some(listener))
        }
        Err(ListenerError::Claim(e @ ClaimError::InUse(_))) => Err(ShimSocketInUse(e)),
        Err(e) => {
            warn!("GPU kernel records are off: {e}; pass --shim-socket PATH (or off)");
            Ok(None)
        }
    }
}
