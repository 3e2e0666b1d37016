//! What the GPU capture hands the pipeline: one record per kernel (or copy) with the process it
//! ran for. Times are CLOCK_MONOTONIC nanoseconds, the clock of the eBPF events.
use inferscope_proto::v1::shim::{Kernel, Memcpy};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KernelRecord {
    /// Process that launched the kernel (from the socket's peer credentials).
    pub pid: u32,
    pub name: String,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub launch_tid: u32,
    pub launch_api: String,
    pub launch_mono_ns: u64,
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub static_shared_bytes: u32,
    pub dynamic_shared_bytes: u32,
    /// 0 unless launched from a CUDA graph.
    pub graph_id: u32,
    pub graph_node_id: u64,
    pub tensor_core: bool,
}

impl KernelRecord {
    pub(crate) fn from_proto(pid: u32, k: Kernel) -> Self {
        KernelRecord {
            pid,
            name: k.name,
            device_id: k.device_id,
            context_id: k.context_id,
            stream_id: k.stream_id,
            correlation_id: k.correlation_id,
            launch_tid: k.launch_tid,
            launch_api: k.launch_api,
            launch_mono_ns: k.launch_mono_ns,
            start_mono_ns: k.start_mono_ns,
            end_mono_ns: k.end_mono_ns,
            grid: [k.grid_x, k.grid_y, k.grid_z],
            block: [k.block_x, k.block_y, k.block_z],
            static_shared_bytes: k.static_shared_bytes,
            dynamic_shared_bytes: k.dynamic_shared_bytes,
            graph_id: k.graph_id,
            graph_node_id: k.graph_node_id,
            tensor_core: k.tensor_core,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MemcpyRecord {
    pub pid: u32,
    pub device_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub kind: String,
    pub bytes: u64,
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
}

impl MemcpyRecord {
    pub(crate) fn from_proto(pid: u32, m: Memcpy) -> Self {
        MemcpyRecord {
            pid,
            device_id: m.device_id,
            stream_id: m.stream_id,
            correlation_id: m.correlation_id,
            kind: m.kind,
            bytes: m.bytes,
            start_mono_ns: m.start_mono_ns,
            end_mono_ns: m.end_mono_ns,
        }
    }
}
