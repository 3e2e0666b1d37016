//! The agent's clocks: records keep CLOCK_MONOTONIC nanoseconds (what bpf_ktime_get_ns reads and
//! the CUPTI shim aligns GPU times to) and turn them into wall time only at the export edge.

/// `clock` now, in ns. Every reading of a clock in inferscope (agent and CUPTI shim) goes through
/// here, so the conversion from a timespec is written once.
#[inline]
fn now_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; both clocks read here always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC: records keep monotonic times (the eBPF clock) and convert
/// to wall time only at the edge.
pub fn unix_offset_ns() -> u64 {
    now_ns(libc::CLOCK_REALTIME).saturating_sub(now_ns(libc::CLOCK_MONOTONIC))
}

/// CLOCK_MONOTONIC now, in ns (the clock bpf_ktime_get_ns reads). Inlined across crates: the
/// CUPTI shim calls it for every GPU timestamp CUPTI takes.
#[inline]
pub fn monotonic_now_ns() -> u64 {
    now_ns(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds as milliseconds: records keep ns, people read ms.
pub fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A duration in ms for a report: `12 ms` with `decimals` places, or `unknown` where it was not
/// measured.
pub fn ms_text(v: Option<f64>, decimals: usize, unknown: &str) -> String {
    v.map_or_else(|| unknown.to_owned(), |v| format!("{v:.decimals$} ms"))
}

/// A duration in ms for a table whose header names the unit: `decimals` places, or `unknown`.
pub fn ms_number(v: Option<f64>, decimals: usize, unknown: &str) -> String {
    v.map_or_else(|| unknown.to_owned(), |v| format!("{v:.decimals$}"))
}
