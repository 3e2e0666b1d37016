//! When a TCP write's bytes went out, read at the write's return from its socket: the kernel
//! stamps every segment it transmits with the socket's `tcp_wstamp_ns` (CLOCK_MONOTONIC, the
//! clock of `bpf_ktime_get_ns`), and when `snd_nxt` has caught up with `write_seq` every byte
//! written so far, this write's included, has been transmitted, so the last stamp falls
//! between the write's own transmission and its return. That is the time the bytes reached
//! the wire (tcpdump's clock), ahead of the return: on loopback the reader's whole receive and
//! wakeup run inside the write. A write whose bytes are still queued at its return (cork,
//! autocork behind a segment in flight, congestion window) goes out later: its return is the
//! nearest time known, and it is counted.
//!
//! The member offsets come from the kernel's BTF (user space sets them at load time). Where the
//! kernel has `bpf_rdonly_cast` (6.2+) the three members are loaded through a typed pointer to
//! the socket, one instruction each; elsewhere they sit within one window of the socket, read
//! with one helper call (~45 ns more per write here, BENCHMARKS §32).
use aya_ebpf::helpers::{bpf_ktime_get_ns, generated::bpf_probe_read_kernel};
use inferscope_common::{Counter, XMIT_WINDOW};

use crate::{counters::bump, kfunc::rdonly_cast};

/// 1 once user space has set the offsets below.
#[unsafe(no_mangle)]
static XMIT_STAMP: u32 = 0;
/// Offset in `struct tcp_sock` of the window read (8-aligned, its members inside it).
#[unsafe(no_mangle)]
static XMIT_BASE: u32 = 0;
/// Offsets inside the window of `write_seq`, `snd_nxt` (u32 each) and `tcp_wstamp_ns` (u64).
#[unsafe(no_mangle)]
static XMIT_WRITE_SEQ: u32 = 0;
#[unsafe(no_mangle)]
static XMIT_SND_NXT: u32 = 0;
#[unsafe(no_mangle)]
static XMIT_WSTAMP: u32 = 0;
/// The BTF id of `struct tcp_sock` where user space patched in `bpf_rdonly_cast` (0: the
/// window is read instead).
#[unsafe(no_mangle)]
static XMIT_TCP_SOCK_TYPE: u32 = 0;

#[inline(always)]
fn global(value: &u32) -> usize {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    (unsafe { core::ptr::read_volatile(value) }) as usize
}

#[repr(C, align(8))]
struct Window([u8; XMIT_WINDOW]);

/// The time a write of `sock` (a `struct tcp_sock`'s address, 0 if unknown) that returned
/// having written bytes is stamped with: when its bytes were transmitted, or its return.
///
/// A paced socket (BBR, or the fq qdisc) keeps in `tcp_wstamp_ns` the earliest departure of its
/// *next* segment: its last departure plus the time its length takes at the pacing rate, which
/// can lie after this write's return (seen: 12 to 48 µs, on hosts whose congestion control is
/// BBR, as this project's machines'). The stamp is never later than the return: such a write
/// is stamped at its return, and counted.
#[inline(always)]
pub fn write_time(sock: u64) -> u64 {
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    let now = unsafe { bpf_ktime_get_ns() };
    if sock != 0 && global(&XMIT_STAMP) == 1 {
        if let Some(sent) = transmitted(sock)
            && sent <= now
        {
            return sent;
        }
        bump(Counter::WritesStampedAtReturn);
    }
    now
}

#[inline(always)]
fn transmitted(sock: u64) -> Option<u64> {
    let tcp_sock = global(&XMIT_TCP_SOCK_TYPE) as u32;
    if tcp_sock != 0 {
        let sock = rdonly_cast(sock, tcp_sock);
        let base = global(&XMIT_BASE);
        // SAFETY: exception-handled loads through the typed pointer (`rdonly_cast`): the
        // verifier checks each offset (constants set at load time) against tcp_sock's BTF.
        let (write_seq, snd_nxt, wstamp) = unsafe {
            (
                core::ptr::read_volatile(sock.add(base + global(&XMIT_WRITE_SEQ)).cast::<u32>()),
                core::ptr::read_volatile(sock.add(base + global(&XMIT_SND_NXT)).cast::<u32>()),
                core::ptr::read_volatile(sock.add(base + global(&XMIT_WSTAMP)).cast::<u64>()),
            )
        };
        return (write_seq == snd_nxt && wstamp != 0).then_some(wstamp);
    }
    let mut window = core::mem::MaybeUninit::<Window>::uninit();
    // SAFETY: the helper writes at most XMIT_WINDOW bytes into the window and fails (leaving
    // nothing read) on an address it cannot read, rather than faulting.
    let read = unsafe {
        bpf_probe_read_kernel(
            window.as_mut_ptr().cast(),
            XMIT_WINDOW as u32,
            (sock + global(&XMIT_BASE) as u64) as *const _,
        )
    };
    if read != 0 {
        return None;
    }
    // SAFETY: the helper filled all of it.
    let window = unsafe { window.assume_init_ref() };
    let write_seq: u32 = at(window, global(&XMIT_WRITE_SEQ) & (XMIT_WINDOW - 4) & !3);
    let snd_nxt: u32 = at(window, global(&XMIT_SND_NXT) & (XMIT_WINDOW - 4) & !3);
    let wstamp: u64 = at(window, global(&XMIT_WSTAMP) & (XMIT_WINDOW - 8) & !7);
    (write_seq == snd_nxt && wstamp != 0).then_some(wstamp)
}

#[inline(always)]
fn at<T: Copy>(window: &Window, offset: usize) -> T {
    // SAFETY: the offset is masked inside the window and aligned for T (4 or 8 bytes, the
    // window 8-aligned); every byte of the window was written by the read.
    unsafe { core::ptr::read(window.0.as_ptr().add(offset).cast::<T>()) }
}
