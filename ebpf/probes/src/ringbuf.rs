//! Every write into the ring buffer goes through here: it counts drops, and it wakes the agent
//! once per `WAKEUP_BYTES` queued (the agent also polls on a short timer), so a busy server does
//! not pay for a wake-up per record. Only the record that takes the queue across the threshold
//! wakes: forcing a wake-up on every record while the queue stays above it (the agent is slow
//! to be scheduled) queued an irq_work per record and doubled exit_syscall's cost.
use aya_ebpf::bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};
use inferscope_common::{CONN_INET, CONN_PREEXISTING, Counter, fd_key};

use crate::{
    counters::bump,
    maps::{EVENTS, Inflight, KEEP_WHOLE, captures_unknown_fds},
};

/// Queued bytes that trigger a wake-up.
const WAKEUP_BYTES: u64 = 256 * 1024;

#[inline(always)]
fn wakeup_flag(size: u64) -> u64 {
    let queued = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    if queued < WAKEUP_BYTES && queued + size >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Bytes of a response write kept once the ring buffer fills past [`PRESSURE_BYTES`] (the agent
/// is behind): enough for a chunk-size line, so chunked framing survives (user space skips the
/// rest of the chunk, knowing how much the write moved) and whole records keep fitting, where
/// full payloads would overflow and lose requests.
pub const PRESSURE_PREFIX: usize = 16;
/// Writes up to this size are kept whole even then: a response's last write (`0\r\n\r\n`, often
/// after a last event) must not lose the terminator that ends it.
pub const PRESSURE_WHOLE: usize = 32;

/// Queued bytes past which the agent counts as behind; user space sets it from the ring size at
/// load time (`inferscope_common::pressure_bytes`).
#[unsafe(no_mangle)]
pub static PRESSURE_BYTES: u32 = 4 * 1024 * 1024;

/// Whether the adaptive capture may cut this write: a response on a connection the kernel knows.
/// Never an fd it does not know (engine IPC: a message cut to a prefix is a message lost), nor,
/// in a process whose IPC is decoded, a connection that is not a TCP server connection (an
/// accepted Unix socket may carry IPC too) or one user space found carrying IPC (ZeroMQ over
/// an accepted TCP connection: `KEEP_WHOLE`).
#[inline(always)]
pub fn may_cut(tgid: u32, fd: i32, inflight: &Inflight) -> bool {
    if inflight.conn_id == 0 {
        return false;
    }
    if !captures_unknown_fds(tgid) {
        return true;
    }
    if inflight.conn_flags & (CONN_INET | CONN_PREEXISTING) == 0 {
        return false;
    }
    // SAFETY: the id is copied out at once; user space rewriting it meanwhile gives the old or the
    // new id, either valid.
    match unsafe { KEEP_WHOLE.get(fd_key(tgid, fd)) } {
        Some(id) => *id != inflight.conn_id,
        None => true,
    }
}

/// The ring buffer holds more than [`PRESSURE_BYTES`]: the agent is behind.
#[inline(always)]
pub fn under_pressure() -> bool {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    let mark = unsafe { core::ptr::read_volatile(&PRESSURE_BYTES) };
    EVENTS.query(BPF_RB_AVAIL_DATA as u64) > u64::from(mark)
}

#[inline(always)]
pub fn output<T: ?Sized>(record: &T, counter: Counter) -> bool {
    let size = core::mem::size_of_val(record) as u64;
    send(record, wakeup_flag(size), counter)
}

/// [`output`] for a record of variable length, at most `MAX` bytes (the map value holding it
/// must have `MAX` bytes from where it starts). The length is restated after the ring query,
/// where older verifiers have lost its bounds ([`crate::bound`]).
#[inline(always)]
pub fn output_bytes<const MAX: u32>(bytes: &[u8], counter: Counter) -> bool {
    let flags = wakeup_flag(bytes.len() as u64);
    let len = crate::bound::at_most::<MAX>(bytes.len());
    // SAFETY: `len` is at most `bytes.len()`, so the slice lies inside the caller's.
    let bytes = unsafe { core::slice::from_raw_parts(bytes.as_ptr(), len) };
    send(bytes, flags, counter)
}

#[inline(always)]
fn send<T: ?Sized>(record: &T, flags: u64, counter: Counter) -> bool {
    match EVENTS.output::<T>(record, flags) {
        Ok(()) => {
            bump(counter);
            true
        }
        Err(_) => {
            bump(Counter::RingbufFull);
            false
        }
    }
}
