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

/// A Python engine's CLOCK_MONOTONIC seconds (`time.monotonic()`, `time.perf_counter()`: vLLM's
/// and SGLang's IPC stamps) → nanoseconds, rounded; None for values no clock reads (negative,
/// NaN, more than ~300 years), since they come from decoded, untrusted bytes.
pub fn mono_seconds_to_ns(seconds: f64) -> Option<u64> {
    (seconds.is_finite() && (0.0..1e10).contains(&seconds))
        .then(|| (seconds * 1e9 + 0.5).floor() as u64)
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

#[cfg(test)]
mod tests {
    use super::mono_seconds_to_ns;

    #[test]
    fn clock_values_outside_any_clock_are_refused() {
        assert_eq!(mono_seconds_to_ns(1.5), Some(1_500_000_000));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e12] {
            assert_eq!(mono_seconds_to_ns(bad), None);
        }
    }
}
