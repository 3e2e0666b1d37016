//! Lengths restated for older verifiers. A length the compiler kept on the stack across a helper
//! call comes back to 5.10's and 6.1's verifiers as an unbounded scalar (5.10 tracks a spilled
//! scalar only when it is a constant; 6.1 loses it where the backend spills narrower), and on
//! some paths 5.10 reaches a helper call with a length whose bounds contradict each other (a
//! path that never runs: two compares it does not relate). A helper that takes a size then
//! refuses the program ("R3 min value is negative"). 6.12 and later keep the bounds.
//!
//! The clamp is written out in assembly at the call that needs it: the compiler drops a clamp in
//! Rust that it can prove redundant, or moves it before the spill.

/// `value`, or `MAX` where it is larger: between 0 and `MAX` to the verifier, whatever it knew
/// of `value`. `MAX` must be below 2^31 (an instruction's immediate).
///
/// In the build for older kernels (feature `legacy`) the value first goes through the stack in
/// two 4-byte halves and comes back as one 8-byte load: every verifier reads that as a number it
/// knows nothing of, which drops a contradictory state, and the compare then bounds it afresh.
/// Newer verifiers never hold such a state, and there the extra path the compare opens for an
/// unknown number would cost verified instructions for nothing.
#[inline(always)]
pub fn at_most<const MAX: u32>(value: usize) -> usize {
    #[cfg(all(target_arch = "bpf", feature = "legacy"))]
    {
        let mut value = value as u64;
        let mut slot = 0u64;
        // SAFETY: the stores and the load touch only `slot`, a local of 8 bytes that outlives
        // the block; the rest is register arithmetic.
        unsafe {
            core::arch::asm!(
                "*(u32 *)({slot} + 0) = {v}",
                "{v} >>= 32",
                "*(u32 *)({slot} + 4) = {v}",
                "{v} = *(u64 *)({slot} + 0)",
                "if {v} <= {max} goto +1",
                "{v} = {max}",
                v = inout(reg) value,
                slot = in(reg) &mut slot as *mut u64,
                max = const MAX,
                // Not `pure`: the clamp stays where it is written, after the calls before it.
                options(nostack, preserves_flags),
            );
        }
        value as usize
    }
    #[cfg(all(target_arch = "bpf", not(feature = "legacy")))]
    {
        let mut value = value as u64;
        // SAFETY: a compare and a move of one register; no memory is touched.
        unsafe {
            core::arch::asm!(
                "if {v} <= {max} goto +1",
                "{v} = {max}",
                v = inout(reg) value,
                max = const MAX,
                // Not `pure`: the clamp stays where it is written, after the calls before it.
                options(nomem, nostack, preserves_flags),
            );
        }
        value as usize
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        value.min(MAX as usize)
    }
}
