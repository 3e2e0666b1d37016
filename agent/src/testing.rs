//! The library's narrow public surface beside [`crate::cli::main`]: exactly what the fuzz targets
//! (`fuzz/`), the benchmarks (`agent/benches/`) and the integration tests (`tests/`) drive
//! directly. Every stage is private to the crate (`pub(crate)` in lib.rs), so the compiler's
//! dead-code analysis sees all of it and no other crate comes to depend on a stage's insides.
//! Not a stage: nothing in the crate names this module.

/// ELF symbols (test `engine_symbols`) and user probe specs (fuzz `probe_spec`).
pub use crate::capture::elf::{symbols::ElfSymbols, user_probes::spec::ProbeSpec};
/// The kernel's BTF as the agent reads it at load (fuzz `kernel_btf`).
pub use crate::capture::kernel::btf::{Btf, ExitArgs, SocketWalk, XmitStamp};
/// The connection tracker and what it is fed (fuzz `connection_tracker`, bench `pipeline`).
pub use crate::capture::kernel::records::{Kind as SyscallKind, SyscallEvent};
/// The connection tracker's records and why one was lost (fuzz `connection_tracker`).
pub use crate::correlate::{Peer, Tracker, loss::LOST_REQUEST_NOT_CAPTURED};
/// Engine plugins, their IPC decoders and gRPC call streams (fuzz `vllm_ipc`, `pickle_reader`,
/// `http2_decoder`; bench `vllm_ipc`).
pub use crate::engines::{
    Engine, EngineIpc, IpcBytes, IpcDirection, IpcVerdict, by_name as engine, call_stream,
};
/// Container and pod identity (fuzz `pod_identity`).
pub use crate::identity::{
    container,
    kube::apply_watch_line,
    pods::{MAX_PODS, PodStore},
};

/// `inferscope diagnose`'s inputs and verdict (fuzz `diagnose_inputs`).
pub mod diagnose {
    pub use crate::diagnose::{
        diagnose,
        input::{
            DeviceSample, EngineConfigSample, EngineSample, Inputs, RequestSample, read_jsonl,
            read_steps,
        },
        report::render,
        window::{Timeline, parse_window},
    };
}
