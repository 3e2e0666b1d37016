//! Capture stage: loads the eBPF programs, finds the processes to trace, and hands raw records to
//! the decoders. Nothing here interprets payload bytes. Its rooms, by what they touch:
//!
//! - [`kernel`]: the eBPF programs, their maps and ring buffer, the records they write, tracefs
//!   layouts, and what the kernel lets the agent do.
//! - [`process`]: /proc, sockets and fds of traced processes; which processes to trace, the
//!   connections they already held, engines restarted on their port, hooks attached late.
//! - [`elf`]: symbols and DWARF of engine binaries and libraries, and the uprobes placed with them
//!   (scheduler hooks, user-defined probes, TLS libraries).
//! - [`gpu`]: the CUPTI shim's socket, CUDA launch uprobes and NVML.
//! - [`metrics`]: the engines' own metrics endpoints, scraped.
//!
//! The stages and what each may import: `docs/src/architecture.md`.
pub(crate) mod elf;
pub(crate) mod gpu;
pub(crate) mod kernel;
pub(crate) mod metrics;
pub(crate) mod process;

pub(crate) use kernel::{
    probes::{CaptureConfig, CaptureError, SocketProbes},
    records::{CapturedEvent, SchedEvent, Segment, SockState, SyscallEvent},
};
pub(crate) use process::{
    discovery::{Discovery, DiscoveryChange, TargetSelector, TracedProcess},
    fd_class::{FdClass, FdClassifier},
};
