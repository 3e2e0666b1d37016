//! GPU capture: kernel records from the CUPTI shim (`libinferscope_cupti.so`, over a Unix socket)
//! and per-GPU telemetry from NVML.
//!
//! - [`ShimListener`]: binds the shim socket, accepts any number of shims, decodes their
//!   length-delimited `KernelBatch` messages with bounds, and queues [`KernelRecord`]s.
//! - [`launches`]: uprobes on the CUDA driver's and runtime's launch functions (no shim, no
//!   restart): host-side launches and the kernel names the driver hands out.
//! - [`NvmlSampler`]: samples every GPU on an interval (utilisation, memory, clocks, power,
//!   throttle reasons, GPM tensor/DRAM/occupancy on Hopper+) and flags outlier cards.
mod feed;
pub(crate) mod launches;
mod listener;
mod nvml;
mod outliers;
mod record;

pub(crate) use feed::KernelFeed;
pub(crate) use listener::{ListenerConfig, ListenerError, ShimListener};
pub(crate) use nvml::{GpuSample, NvmlSampler};
pub(crate) use record::KernelRecord;

/// Where the shim connects unless `INFERSCOPE_SHIM_SOCKET` says otherwise.
pub(crate) const DEFAULT_SHIM_SOCKET: &str = "/run/inferscope/shim.sock";
