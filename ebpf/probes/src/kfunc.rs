//! Kernel functions (kfuncs) the programs call. aya 0.14 resolves no kfunc calls, so each call
//! is written out as its instruction, with a marker where the function's BTF id goes, and user
//! space patches the marker before loading (`agent/src/capture/kernel/kfunc.rs`): with the
//! running kernel's id, or, where the kernel lacks the function, with a register move that a
//! load-time flag keeps the programs from reaching.

/// `call` with `src_reg` BPF_PSEUDO_KFUNC_CALL (2) and the marker as its immediate.
#[cfg(target_arch = "bpf")]
const RDONLY_CAST_CALL: u64 =
    0x85 | (0x20 << 8) | ((inferscope_common::KFUNC_RDONLY_CAST_MARKER as u64) << 32);

/// `bpf_rdonly_cast(obj, type_id)`: the address `obj` as a read-only pointer to the kernel type
/// `type_id` (a constant: from a load-time global). Loads through it are the verifier's
/// exception-handled loads (a bad address reads 0, never faults), checked against the type's
/// BTF, so each member costs one instruction where `bpf_probe_read_kernel` is a helper call.
/// The verifier turns the call itself into a register move. Kernels since 6.2.
#[inline(always)]
pub fn rdonly_cast(obj: u64, type_id: u32) -> *const u8 {
    #[cfg(target_arch = "bpf")]
    {
        let cast: u64;
        // SAFETY: the instruction is a kfunc call taking r1 and r2 and returning r0; like any
        // call it clobbers r1 to r5. It reads or writes no memory itself.
        unsafe {
            core::arch::asm!(
                ".quad {call}",
                call = const RDONLY_CAST_CALL,
                inout("r1") obj => _,
                inout("r2") u64::from(type_id) => _,
                lateout("r0") cast,
                lateout("r3") _,
                lateout("r4") _,
                lateout("r5") _,
                options(nostack, preserves_flags),
            );
        }
        cast as *const u8
    }
    // Host builds (clippy, unit tests) never load through it.
    #[cfg(not(target_arch = "bpf"))]
    {
        let _ = type_id;
        obj as *const u8
    }
}
