//! Reads of user and kernel memory into zeroed values. aya-ebpf's typed helpers read into an
//! uninitialised value and return it only on success, but the compiler may load it on the
//! failure path too (a select instead of a branch): verifiers before 6.3 refuse any read of
//! stack bytes never written ("invalid read from stack"), so every copy starts from zeros.

use aya_ebpf::{
    cty::{c_long, c_void},
    helpers::generated::{bpf_probe_read_kernel, bpf_probe_read_user},
};

/// `T` at the user address `addr`, or None where it cannot be read. `T` is a plain-integer type
/// (integers, arrays and `repr(C)` structs of them), for which any bytes are a valid value.
#[inline(always)]
pub fn user<T: Copy>(addr: u64) -> Option<T> {
    zeroed_read(bpf_probe_read_user, addr)
}

/// `T` at the kernel address `addr`, or None where it cannot be read (as [`user`]).
#[inline(always)]
pub fn kernel<T: Copy>(addr: u64) -> Option<T> {
    zeroed_read(bpf_probe_read_kernel, addr)
}

#[inline(always)]
fn zeroed_read<T: Copy>(
    helper: unsafe fn(*mut c_void, u32, *const c_void) -> c_long,
    addr: u64,
) -> Option<T> {
    let mut value = core::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the destination is `size_of::<T>()` writable bytes; the helper checks the address
    // and fails (rc != 0) instead of faulting.
    let rc = unsafe {
        helper(
            value.as_mut_ptr().cast(),
            core::mem::size_of::<T>() as u32,
            addr as *const _,
        )
    };
    // SAFETY: zeroed, then filled by the helper; T is a plain-integer type (above).
    (rc == 0).then(|| unsafe { value.assume_init() })
}
