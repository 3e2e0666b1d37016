//! Capture stage: loads the eBPF programs, finds the processes to trace, and hands raw records to
//! the decoders. Nothing here interprets payload bytes.
pub mod adopt;
pub mod chunks;
pub mod container;
pub mod discovery;
pub mod dwarf;
pub mod fd_class;
pub mod gpu;
pub mod late_attach;
pub mod metrics;
pub mod preexisting;
pub mod privileges;
pub mod probes;
pub mod procfs;
pub mod records;
pub mod sched_hooks;
pub mod sockets;
pub mod sockpath;
pub mod stream_template;
pub mod symbols;
pub mod tls;
pub mod tracefs;
pub mod user_probes;

pub use discovery::{Discovery, DiscoveryChange, TargetSelector, TracedProcess};
pub use fd_class::{FdClass, FdClassifier};
pub use probes::{CaptureConfig, CaptureError, SocketProbes};
pub use records::{CapturedEvent, RecordError, SchedEvent, Segment, SockState, SyscallEvent};
