//! Kernel side of inferscope: socket syscalls of traced processes and TCP segment arrivals on
//! traced ports, into one ring buffer. Everything is filtered in the kernel (process, fd verdict,
//! port) so untraced work pays one hash lookup.
#![no_std]
#![no_main]
// The workspace makes `pub(crate)` the default; this crate is a binary that nothing else can
// name, and its programs are checked by the verifier's instruction count, not by dead-code
// analysis, so its helpers and maps keep the visibility they were written with.
#![allow(unreachable_pub)]
// Inline assembly for the bpf target (one unaligned load: `socket::token`; kfunc calls:
// `kfunc`; clamps older verifiers see: `bound`), as aya-ebpf uses it.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

mod bound;
mod conn_seq;
mod cookie;
mod counters;
mod ctx;
mod engines;
mod gpu;
mod kfunc;
mod maps;
mod read;
mod ringbuf;
mod sock_state;
mod socket;
mod tcp;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
