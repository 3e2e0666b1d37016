//! Tracepoint records are readable in place: the verifier allows aligned loads from the context
//! of a tracepoint program, which saves a bpf_probe_read_kernel call per field.
use aya_ebpf::{EbpfContext, programs::TracePointContext};

/// Loads the field at `offset` (constant, aligned to `T`, inside the tracepoint record).
#[inline(always)]
pub fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: the verifier checks the access against the tracepoint's record bounds.
    unsafe { core::ptr::read(ctx.as_ptr().cast::<u8>().add(offset).cast::<T>()) }
}

/// Records whose layout changed between kernel releases: user space reads each field's offset
/// from the tracepoint's tracefs format at load time and patches it into a global (0: unknown).
/// The verifier refuses context loads at such variable offsets, so these go through a helper.
#[inline(always)]
pub fn field_at<T: Copy>(ctx: &TracePointContext, offset_global: &u32) -> Option<T> {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    let offset = unsafe { core::ptr::read_volatile(offset_global) } as usize;
    if offset == 0 || offset > 4096 {
        return None;
    }
    // SAFETY: the read helper checks the address and fails instead of faulting; T is only
    // ever an integer or a byte array, for which any bytes are a valid value.
    unsafe { ctx.read_at::<T>(offset) }.ok()
}
