//! CUPTI activity buffers: handed out on request, decoded on completion (on CUPTI's own worker
//! thread or a flushing thread, never a launching one), joined with the launch table and queued.
//!
//! Records are read field by field at the offsets of `CUpti_ActivityKernel9`; Kernel10/11 (CUDA 13)
//! and Memcpy6 keep those fields at the same offsets, so the reader works across CUPTI versions.
use std::{
    alloc::Layout,
    ffi::CStr,
    ptr::addr_of,
    sync::atomic::{AtomicUsize, Ordering},
};

use cudarc::cupti::sys;
use inferscope_proto::v1::shim::{Kernel, Memcpy};

use crate::{
    launches::API_NAMES,
    state::{Shim, state},
};

const ALIGN: usize = 8;
pub(crate) const KIND_MEMCPY: u32 = 1;
pub(crate) const KIND_MEMSET: u32 = 2;
pub(crate) const KIND_CONCURRENT_KERNEL: u32 = 10;
/// Kernels per queued batch.
const BATCH: usize = 512;

pub(crate) static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);

/// CUPTI asks for an activity buffer (registered with `cuptiActivityRegisterCallbacks`).
///
/// # Safety
///
/// `buffer`, `size` and `max_records` are null or valid for writes, as CUPTI passes them.
pub(crate) unsafe extern "C" fn buffer_requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_records: *mut usize,
) {
    if buffer.is_null() || size.is_null() {
        return;
    }
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buffer = std::ptr::null_mut();
        *size = 0;
        if !max_records.is_null() {
            *max_records = 0;
        }
    }
    let Some(st) = state() else { return };
    // Bounded: past the limit CUPTI drops records and counts them (cuptiActivityGetNumDroppedRecords).
    if OUTSTANDING.fetch_add(1, Ordering::AcqRel) >= st.config.max_buffers {
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let Ok(layout) = Layout::from_size_align(st.config.buffer_bytes, ALIGN) else {
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
        return;
    };
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    // SAFETY: valid out-pointers.
    unsafe {
        *buffer = p;
        *size = st.config.buffer_bytes;
    }
}

/// CUPTI hands back a buffer from [`buffer_requested`], filled with records.
///
/// # Safety
///
/// `buffer` is null or a buffer [`buffer_requested`] allocated with `size` bytes, of which the
/// first `valid_size` hold CUPTI activity records; it is not used after this call.
pub(crate) unsafe extern "C" fn buffer_completed(
    context: cudarc::driver::sys::CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid_size: usize,
) {
    if let Some(st) = state() {
        if !buffer.is_null() {
            // SAFETY: CUPTI hands back a buffer we allocated, `valid_size` bytes of records.
            unsafe { decode_buffer(st, buffer, valid_size.min(size)) };
        }
        let mut dropped = 0usize;
        // SAFETY: valid out-pointer; context/stream as CUPTI gave them.
        let rc =
            unsafe { sys::cuptiActivityGetNumDroppedRecords(context, stream_id, &mut dropped) };
        if rc == sys::CUptiResult::CUPTI_SUCCESS && dropped > 0 {
            st.sink.add_cupti_dropped(dropped as u64);
        }
    }
    if !buffer.is_null()
        && let Ok(layout) = Layout::from_size_align(size, ALIGN)
        && size > 0
    {
        // SAFETY: allocated in buffer_requested with this size and alignment.
        unsafe { std::alloc::dealloc(buffer, layout) };
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// # Safety
///
/// `buffer` holds `valid` bytes of CUPTI activity records.
unsafe fn decode_buffer(st: &Shim, buffer: *mut u8, valid: usize) {
    let listening = st.sink.is_connected();
    let mut kernels = Vec::new();
    let mut memcpys = Vec::new();
    let mut not_sent = 0u64;
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    loop {
        // SAFETY: buffer/valid from CUPTI; record is an in/out cursor.
        let rc = unsafe { sys::cuptiActivityGetNextRecord(buffer, valid, &mut record) };
        if rc != sys::CUptiResult::CUPTI_SUCCESS || record.is_null() {
            break;
        }
        // Read the kind as a plain integer: an unknown kind must not become an invalid Rust enum.
        // SAFETY: every record starts with a 4-byte kind.
        let kind = unsafe { (record as *const u32).read_unaligned() };
        match kind {
            KIND_CONCURRENT_KERNEL => {
                if !listening {
                    // Nobody listens: count, do not decode.
                    not_sent += 1;
                    continue;
                }
                // SAFETY: kind says this is a kernel record.
                kernels.push(unsafe { kernel(st, record as *const sys::CUpti_ActivityKernel9) });
                if kernels.len() >= BATCH {
                    st.sink.push(std::mem::take(&mut kernels), Vec::new());
                }
            }
            KIND_MEMCPY | KIND_MEMSET => {
                if !listening {
                    not_sent += 1;
                    continue;
                }
                // SAFETY: kind says which record this is.
                memcpys.push(unsafe { memcpy(st, record, kind) });
            }
            _ => {}
        }
    }
    if not_sent > 0 {
        st.sink.add_dropped(not_sent);
    }
    if !kernels.is_empty() || !memcpys.is_empty() {
        st.sink.push(kernels, memcpys);
    }
}

macro_rules! field {
    ($p:expr, $f:ident) => {
        // SAFETY: every use passes a `$p` that points at a live record of this layout (the
        // callers' contract); packed fields are read unaligned.
        unsafe { addr_of!((*$p).$f).read_unaligned() }
    };
}

/// # Safety
///
/// `k` points at a live kernel activity record (possibly unaligned).
unsafe fn kernel(st: &Shim, k: *const sys::CUpti_ActivityKernel9) -> Kernel {
    let name_ptr = field!(k, name);
    let raw = if name_ptr.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: CUPTI's name is a NUL-terminated string valid while the buffer is.
        unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy()
    };
    let (name, tensor_core) = st.names(&raw);
    let correlation_id = field!(k, correlationId);
    let launch = st.launches.get(correlation_id);
    if launch.is_none() {
        st.sink.add_unjoined(1);
    }
    let launch = launch.unwrap_or(crate::launches::Launch {
        tid: 0,
        mono_ns: 0,
        api: 0,
    });
    Kernel {
        name: name.to_string(),
        device_id: field!(k, deviceId),
        context_id: field!(k, contextId),
        stream_id: field!(k, streamId),
        correlation_id,
        launch_tid: launch.tid,
        launch_mono_ns: launch.mono_ns,
        start_mono_ns: st.clock.to_mono(field!(k, start)),
        end_mono_ns: st.clock.to_mono(field!(k, end)),
        grid_x: field!(k, gridX).max(0) as u32,
        grid_y: field!(k, gridY).max(0) as u32,
        grid_z: field!(k, gridZ).max(0) as u32,
        block_x: field!(k, blockX).max(0) as u32,
        block_y: field!(k, blockY).max(0) as u32,
        block_z: field!(k, blockZ).max(0) as u32,
        static_shared_bytes: field!(k, staticSharedMemory).max(0) as u32,
        dynamic_shared_bytes: field!(k, dynamicSharedMemory).max(0) as u32,
        graph_id: field!(k, graphId),
        graph_node_id: field!(k, graphNodeId),
        tensor_core,
        launch_api: API_NAMES
            .get(launch.api as usize)
            .copied()
            .unwrap_or("unknown")
            .to_string(),
    }
}

fn copy_kind(k: u8) -> &'static str {
    match k {
        1 => "HtoD",
        2 => "DtoH",
        3 => "HtoA",
        4 => "AtoH",
        5 => "AtoA",
        6 => "AtoD",
        7 => "DtoA",
        8 => "DtoD",
        9 => "HtoH",
        10 => "PtoP",
        _ => "unknown",
    }
}

/// # Safety
///
/// `record` points at a live memcpy or memset activity record of `kind` (possibly unaligned).
unsafe fn memcpy(st: &Shim, record: *const sys::CUpti_Activity, kind: u32) -> Memcpy {
    if kind == KIND_MEMSET {
        let m = record as *const sys::CUpti_ActivityMemset4;
        return Memcpy {
            device_id: field!(m, deviceId),
            stream_id: field!(m, streamId),
            correlation_id: field!(m, correlationId),
            kind: "memset".to_string(),
            bytes: field!(m, bytes),
            start_mono_ns: st.clock.to_mono(field!(m, start)),
            end_mono_ns: st.clock.to_mono(field!(m, end)),
        };
    }
    let m = record as *const sys::CUpti_ActivityMemcpy5;
    Memcpy {
        device_id: field!(m, deviceId),
        stream_id: field!(m, streamId),
        correlation_id: field!(m, correlationId),
        kind: copy_kind(field!(m, copyKind)).to_string(),
        bytes: field!(m, bytes),
        start_mono_ns: st.clock.to_mono(field!(m, start)),
        end_mono_ns: st.clock.to_mono(field!(m, end)),
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// The mock libcupti (tests/mock-cuda/cupti.c) asserts the same offsets with _Static_assert,
    /// so the shim reads what the mock writes the way it reads real CUPTI records.
    #[test]
    fn kernel9_layout_matches_the_mock() {
        type K = sys::CUpti_ActivityKernel9;
        assert_eq!(size_of::<K>(), 208);
        assert_eq!(offset_of!(K, start), 16);
        assert_eq!(offset_of!(K, correlationId), 92);
        assert_eq!(offset_of!(K, name), 104);
        assert_eq!(offset_of!(K, graphNodeId), 144);
        assert_eq!(offset_of!(K, graphId), 156);
        type M = sys::CUpti_ActivityMemcpy5;
        assert_eq!(size_of::<M>(), 88);
        assert_eq!(offset_of!(M, bytes), 8);
        assert_eq!(offset_of!(M, correlationId), 44);
    }
}
