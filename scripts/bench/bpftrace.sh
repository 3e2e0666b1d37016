# Sourced by the benchmark scripts. start_bpftrace OUT LOG BPFTRACE_ARGS...: starts bpftrace
# with stdout to OUT and stderr to LOG, and returns once it says its probes are attached (its
# "Attaching" line), setting $bpftrace_pid. bpftrace 0.17 on this kernel has stalled half-way
# through attaching (two of four programs loaded, no line after eight minutes), so a start
# that has not attached within 30 s is killed and tried again; after three, it fails.
start_bpftrace() {
  local out=$1 log=$2 attempt
  shift 2
  for attempt in 1 2 3; do
    bpftrace "$@" > "$out" 2> "$log" &
    bpftrace_pid=$!
    for _ in $(seq 300); do
      grep -q Attaching "$out" "$log" 2>/dev/null && return 0
      kill -0 "$bpftrace_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$bpftrace_pid" 2>/dev/null || true
    wait "$bpftrace_pid" 2>/dev/null || true
    echo "bpftrace did not attach within 30 s (attempt $attempt of 3): $(tail -n 2 "$log")" >&2
  done
  return 1
}
