//! Tracepoint records are readable in place: the verifier allows aligned loads from the context
//! of a tracepoint program, which saves a bpf_probe_read_kernel call per field.
use aya_ebpf::{EbpfContext, programs::TracePointContext};

/// Loads the field at `offset` (constant, aligned to `T`, inside the tracepoint record).
#[inline(always)]
pub fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: the verifier checks the access against the tracepoint's record bounds.
    unsafe { core::ptr::read(ctx.as_ptr().cast::<u8>().add(offset).cast::<T>()) }
}
