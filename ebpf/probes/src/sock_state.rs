//! sock:inet_sock_set_state on watched local ports: the client's FIN (ESTABLISHED→CLOSE_WAIT)
//! and the socket's end (→CLOSE). The server's syscalls alone do not show a client that gave
//! up while the server had not answered yet: its later write into the half-closed socket
//! succeeds. User space joins these to connections by socket address.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use inferscope_common::{Counter, RecordType, SockStateRecord, TCP_CLOSE, TCP_CLOSE_WAIT};

use crate::{ctx::field_at, maps::watched, ringbuf::output};

const IPPROTO_TCP: u16 = 6;

/// Offsets of the tracepoint's fields, read by user space from its tracefs format at load
/// time (0: unknown; the program is then not attached).
#[unsafe(no_mangle)]
static SOCK_STATE_SKADDR: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_STATE_OLDSTATE: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_STATE_NEWSTATE: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_STATE_SPORT: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_STATE_PROTOCOL: u32 = 0;

#[inline(always)]
fn at<T: Copy + Default>(ctx: &TracePointContext, global: &u32) -> T {
    field_at(ctx, global).unwrap_or_default()
}

#[tracepoint]
pub fn sock_state(ctx: TracePointContext) -> u32 {
    try_sock_state(&ctx);
    0
}

#[inline(always)]
fn try_sock_state(ctx: &TracePointContext) {
    let new_state: i32 = at(ctx, &SOCK_STATE_NEWSTATE);
    if new_state != TCP_CLOSE_WAIT && new_state != TCP_CLOSE {
        return;
    }
    let protocol: u16 = at(ctx, &SOCK_STATE_PROTOCOL);
    if protocol != IPPROTO_TCP {
        return;
    }
    // sport is the socket's own (local) port, in host order.
    let local_port: u16 = at(ctx, &SOCK_STATE_SPORT);
    if !watched(local_port) {
        return;
    }
    let old_state: i32 = at(ctx, &SOCK_STATE_OLDSTATE);
    let record = SockStateRecord {
        record_type: RecordType::SockState as u8,
        old_state: old_state as u8,
        new_state: new_state as u8,
        _pad0: 0,
        local_port,
        _pad1: 0,
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        sock: at(ctx, &SOCK_STATE_SKADDR),
    };
    output::<SockStateRecord>(&record, Counter::SockStates);
}
