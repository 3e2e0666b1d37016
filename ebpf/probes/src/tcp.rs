//! tcp:tcp_probe fires in tcp_rcv_established for every segment a socket receives, before the
//! data is queued, so it stamps when a request's bytes reached the server, however late the
//! server then reads them.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use inferscope_common::{Counter, RecordType, SegmentRecord, tcp_probe_layout as layout};

use crate::{
    ctx::{field, field_at},
    maps::watched,
    ringbuf::output,
};

// Offsets of the record's fields on this kernel, which user space reads from
// /sys/kernel/tracing/events/tcp/tcp_probe/format at load time. 0: unknown; user space then
// does not attach the program (all but `skaddr`, which older kernels lack: segments then join
// connections by address only).
#[unsafe(no_mangle)]
static TCP_PROBE_DADDR: u32 = 0;
#[unsafe(no_mangle)]
static TCP_PROBE_SPORT: u32 = 0;
#[unsafe(no_mangle)]
static TCP_PROBE_DPORT: u32 = 0;
#[unsafe(no_mangle)]
static TCP_PROBE_FAMILY: u32 = 0;
#[unsafe(no_mangle)]
static TCP_PROBE_DATA_LEN: u32 = 0;
/// `skaddr`: the receiving socket, the address fexit on inet_csk_accept hands the accept.
#[unsafe(no_mangle)]
static TCP_PROBE_SKADDR: u32 = 0;
/// 1: the offsets above are those of [`layout`], so the integer fields are loaded in place
/// rather than through a helper call each (which costs every segment of the host ~50 ns more).
#[unsafe(no_mangle)]
static TCP_PROBE_IN_PLACE: u32 = 0;

#[tracepoint]
pub fn tcp_probe(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_probe(&ctx);
    0
}

/// The integer field at `global`'s offset, which is `in_place` when the layout is [`layout`].
#[inline(always)]
fn int<T: Copy>(ctx: &TracePointContext, fast: bool, in_place: u32, global: &u32) -> Option<T> {
    if fast {
        Some(field(ctx, in_place as usize))
    } else {
        field_at(ctx, global)
    }
}

#[inline(always)]
fn try_tcp_probe(ctx: &TracePointContext) -> Option<()> {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    let fast = unsafe { core::ptr::read_volatile(&TCP_PROBE_IN_PLACE) } == 1;
    let data_len: u16 = int(ctx, fast, layout::DATA_LEN, &TCP_PROBE_DATA_LEN)?;
    if data_len == 0 {
        return None;
    }
    // sport is the receiving socket's own (local) port, in host order.
    let local_port: u16 = int(ctx, fast, layout::SPORT, &TCP_PROBE_SPORT)?;
    if !watched(local_port) {
        return None;
    }
    let record = SegmentRecord {
        record_type: RecordType::Segment as u8,
        _pad0: 0,
        family: int(ctx, fast, layout::FAMILY, &TCP_PROBE_FAMILY)?,
        data_len: data_len as u32,
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        local_port,
        remote_port: int(ctx, fast, layout::DPORT, &TCP_PROBE_DPORT)?,
        _pad1: 0,
        // A 28-byte array at a 4-byte aligned offset: one helper read either way.
        remote_sockaddr: field_at(ctx, &TCP_PROBE_DADDR)?,
        _pad2: 0,
        sock: field_at(ctx, &TCP_PROBE_SKADDR).unwrap_or(0),
    };
    output::<SegmentRecord>(&record, Counter::Segments);
    Some(())
}
