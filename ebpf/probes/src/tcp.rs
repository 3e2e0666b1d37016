//! tcp:tcp_probe fires in tcp_rcv_established for every segment a socket receives, before the
//! data is queued, so it stamps when a request's bytes reached the server, however late the
//! server then reads them.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use inferscope_common::{Counter, RecordType, SegmentRecord};

use crate::{ctx::field_at, maps::watched, ringbuf::output};

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

#[tracepoint]
pub fn tcp_probe(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_probe(&ctx);
    0
}

#[inline(always)]
fn try_tcp_probe(ctx: &TracePointContext) -> Option<()> {
    // Every segment the host receives passes here: the port filter goes first, so a segment
    // for an unwatched port costs one read. sport is the receiving socket's own (local) port,
    // in host order.
    let local_port: u16 = field_at(ctx, &TCP_PROBE_SPORT)?;
    if !watched(local_port) {
        return None;
    }
    let data_len: u16 = field_at(ctx, &TCP_PROBE_DATA_LEN)?;
    if data_len == 0 {
        return None;
    }
    let record = SegmentRecord {
        record_type: RecordType::Segment as u8,
        _pad0: 0,
        family: field_at(ctx, &TCP_PROBE_FAMILY)?,
        data_len: data_len as u32,
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        local_port,
        remote_port: field_at(ctx, &TCP_PROBE_DPORT)?,
        _pad1: 0,
        remote_sockaddr: field_at(ctx, &TCP_PROBE_DADDR)?,
        _pad2: 0,
        sock: field_at(ctx, &TCP_PROBE_SKADDR).unwrap_or(0),
    };
    output::<SegmentRecord>(&record, Counter::Segments);
    Some(())
}
