//! The daemon's GPU inputs: kernel records from CUPTI shims, and NVML samples.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use crate::capture::{
    gpu::{GpuSample, KernelRecord, ListenerConfig, ListenerError, NvmlSampler, ShimListener},
    process::sockpath::ClaimError,
};

/// The one way starting the GPU inputs fails.
#[derive(Debug, thiserror::Error)]
#[error("{0}; pass --shim-socket PATH (or off)")]
pub(crate) struct ShimSocketInUse(ClaimError);

pub(crate) struct GpuInputs {
    shim: Option<ShimListener>,
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
        let mut shim = None;
        if let Some(path) = shim_socket {
            match ShimListener::bind(ListenerConfig::new(path)) {
                Ok(listener) => {
                    info!(socket = %path.display(), "listening for CUPTI shims (CUDA_INJECTION64_PATH=libinferscope_cupti.so)");
                    shim = Some(listener);
                }
                Err(ListenerError::Claim(e @ ClaimError::InUse(_))) => {
                    return Err(ShimSocketInUse(e));
                }
                Err(e) => {
                    warn!("GPU kernel records are off: {e}; pass --shim-socket PATH (or off)");
                }
            }
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
        let nvml = self.nvml.take();
        let started = Self::start(Some(path), None)?;
        self.shim = started.shim;
        self.nvml = nvml;
        Ok(())
    }

    pub(crate) fn drain_kernels(&self, out: &mut Vec<KernelRecord>) {
        if let Some(shim) = &self.shim {
            shim.drain(out);
        }
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
        self.shim.as_ref().map(|s| s.counters()).unwrap_or_default()
    }
}
