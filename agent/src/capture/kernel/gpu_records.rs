//! The GPU launch probes' two records, decoded from the ring buffer's bytes: a kernel or graph
//! launch, and a kernel handle's name. Kept with the other kernel records (not with the probes
//! that attach them) so the record parser needs nothing from the GPU side of capture.
use inferscope_common::{
    GpuApi, GpuLaunchRecord, GpuNameRecord, LAUNCH_FLAG_READ_FAILED, LAUNCH_FLAG_SAMPLED,
    NAME_FLAG_TRUNCATED,
};

/// A kernel or graph launch, as the uprobe saw it at the call's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaunchEvent {
    pub api: GpuApi,
    pub tgid: u32,
    pub tid: u32,
    /// Host enqueue time (CLOCK_MONOTONIC), never the GPU's execution time.
    pub ts_ns: u64,
    pub handle: u64,
    pub stream: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    /// Launches of the process not emitted before this one (the rate cap's sampling).
    pub skipped: u32,
    pub sampled: bool,
    pub read_failed: bool,
}

impl LaunchEvent {
    pub(crate) fn from_record(r: &GpuLaunchRecord) -> Option<Self> {
        Some(Self {
            api: GpuApi::from_u8(r.api)?,
            tgid: r.tgid,
            tid: r.tid,
            ts_ns: r.ts_ns,
            handle: r.handle,
            stream: r.stream,
            grid: r.grid,
            block: r.block,
            shared_mem: r.shared_mem,
            skipped: r.skipped,
            sampled: r.flags & LAUNCH_FLAG_SAMPLED != 0,
            read_failed: r.flags & LAUNCH_FLAG_READ_FAILED != 0,
        })
    }
}

/// A kernel handle named by the driver (or, for `cuKernelGetFunction`, a function handle that is
/// the kernel `alias`; for `cudaGetKernel`, a kernel handle of host stub `alias`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NameEvent<'a> {
    pub api: GpuApi,
    pub tgid: u32,
    pub handle: u64,
    pub alias: u64,
    /// The name's bytes as the process passed them (empty for `cuKernelGetFunction` and
    /// `cudaGetKernel`).
    pub name: &'a [u8],
    pub truncated: bool,
}

impl<'a> NameEvent<'a> {
    /// The event in `bytes`, a [`GpuNameRecord`] the kernel wrote.
    pub(crate) fn parse(bytes: &'a [u8]) -> Option<Self> {
        let size = std::mem::size_of::<GpuNameRecord>();
        let raw = bytes.get(..size)?;
        // SAFETY: length checked above; GpuNameRecord is Pod (every bit pattern is a value) and
        // the read is unaligned-tolerant.
        let r: GpuNameRecord = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        let name_at = std::mem::offset_of!(GpuNameRecord, name);
        let name = raw.get(name_at..)?;
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Some(Self {
            api: GpuApi::from_u8(r.api)?,
            tgid: r.tgid,
            handle: r.handle,
            alias: r.alias,
            name: &name[..len],
            truncated: r.flags & NAME_FLAG_TRUNCATED != 0,
        })
    }
}
