#!/usr/bin/env bash
# Kernel cost per program run (bpf_stats run_time_ns / run_cnt) under the loopback SSE load, as
# root. Alternates the tracers in every round, under the same load, and prints medians, so the
# noise of a shared machine hits every variant alike.
#   scripts/bench/kcost.sh ROUNDS AGENT_BIN...        inferscope binaries (A/B of kernel programs)
#   SAMPLES=FILE scripts/bench/kcost.sh ...        also keeps every round's figures in FILE.
#   FLOOR=1 scripts/bench/kcost.sh ROUNDS [AGENT_BIN...]  also the platform's floor: bpftrace
#       programs that do nothing, or one helper/map operation, on the same tracepoints.
# Needs target/release/sse_load (cargo build --release -p inferscope-integration-tests --bin sse_load).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/bpftrace.sh
rounds=${1:-5}; shift || true
conns=${CONNS:-8}; reqs=${REQS:-500}
load=${SSE_LOAD:-target/release/sse_load}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# name|program. Exits of write/sendto/read/recvfrom, like exit_syscall; enters of write/sendto.
EXITS='tracepoint:syscalls:sys_exit_write,tracepoint:syscalls:sys_exit_sendto,tracepoint:syscalls:sys_exit_read,tracepoint:syscalls:sys_exit_recvfrom'
floor=(
  "noop|$EXITS { }"
  "pid_hash_lookup|BEGIN { @t[0] = 1 } $EXITS { if (@t[pid]) { } }"
  "ktime|$EXITS { \$t = nsecs; }"
  "current_task|$EXITS { \$t = curtask; }"
  "hash_update|$EXITS { @m[tid] = 1; }"
  "hash_update_delete|$EXITS { @m[tid] = 1; delete(@m[tid]); }"
  "probe_read_user_16|tracepoint:syscalls:sys_enter_sendto { \$b = buf(args->buff, 16); }"
  "probe_read_user_200|tracepoint:syscalls:sys_enter_sendto { \$b = buf(args->buff, 200); }"
)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start_server() {  # a fresh server per measurement: every tracer sees the same history
  port=$(free_port)
  $load serve --port "$port" & server=$!
  sleep 0.3
  $load load --port "$port" --connections 4 --requests 100 >/dev/null
}

one_load() {  # label tracer-pid: runs the load with bpf_stats on, appends "label prog runs ns"
  # Only the tracer's own programs count (other tracers may be loaded on a shared machine).
  grep -h '^prog_id:' /proc/"$2"/fdinfo/* 2>/dev/null | awk '{print $2}' > "$work/ids"
  sysctl -qw kernel.bpf_stats_enabled=1
  bpftool prog show --json > "$work/a.json"
  $load load --port "$port" --connections "$conns" --requests "$reqs" >/dev/null
  bpftool prog show --json > "$work/b.json"
  sysctl -qw kernel.bpf_stats_enabled=0
  python3 - "$work/a.json" "$work/b.json" "$1" "$work/ids" >> "$work/samples" <<'PY'
import json, sys, collections
a = {p["id"]: p for p in json.load(open(sys.argv[1]))}
mine = {int(x) for x in open(sys.argv[4]).read().split()}
b = [p for p in json.load(open(sys.argv[2])) if p["id"] in mine]
runs, ns = collections.Counter(), collections.Counter()
for p in b:
    # fexit programs ("tracing": the accept hook) count too.
    if p.get("type") not in ("tracepoint", "tracing"):
        continue
    n = p.get("name", "")
    if not n.startswith(("enter_", "exit_", "tcp_probe", "sys_", "accepted_sock", "rcv_space_adj")):
        continue
    if n.startswith("sys_"):  # bpftrace: one program per attach point
        n = "enter" if "enter" in n else "exit"
    runs[n] += p.get("run_cnt", 0) - a.get(p["id"], {}).get("run_cnt", 0)
    ns[n] += p.get("run_time_ns", 0) - a.get(p["id"], {}).get("run_time_ns", 0)
for n in runs:
    if runs[n]:
        print(sys.argv[3], n, runs[n], ns[n] / runs[n])
print(sys.argv[3], "total_ns", sum(runs.values()), sum(ns.values()))
PY
}

bins=("$@")
for r in $(seq "$rounds"); do
  # Each round starts at the next tracer: the one measured right after another agent's exit
  # reads slower (seen on this VM: ~30 ns per program run), so no tracer is always second.
  tracers=${#bins[@]}
  for ((i = 0; i < tracers; i++)); do
    bin=${bins[$(( (i + r - 1) % tracers ))]}
    start_server
    $bin record --pid "$server" --out "$work/r.jsonl" 2>"$work/agent.log" & agent=$!
    until grep -q attached "$work/agent.log"; do sleep 0.1; done
    sleep 0.3
    one_load "$bin" $agent
    kill -INT $agent; wait $agent || true
    n=$(wc -l < "$work/r.jsonl"); echo "$bin records $n $n" >> "$work/samples"
    # Captured syscalls: the records emitted, with each token batch counted as the writes it
    # holds (binaries without batches print neither counter).
    kc() { { grep -o "counter=\"kernel_$1\" value=[0-9]*" "$work/agent.log" || true; } | tail -1 | grep -o '[0-9]*$' || echo 0; }
    n=$(( $(kc records_emitted) - $(kc token_batches) + $(kc token_events) ))
    echo "$bin emitted $n $n" >> "$work/samples"
    n=$(grep -o 'counter="kernel_ringbuf_full_drops" value=[0-9]*' "$work/agent.log" | tail -1 | grep -o '[0-9]*$' || true)
    echo "$bin ringbuf_drops ${n:-0} ${n:-0}" >> "$work/samples"
    kill $server; wait $server 2>/dev/null || true
  done
  if [ -n "${FLOOR:-}" ]; then
    start_server
    for f in "${floor[@]}"; do
      start_bpftrace "$work/bt.log" "$work/bt.err" -e "${f#*|}"
      bt=$bpftrace_pid
      sleep 0.5
      one_load "floor:${f%%|*}" $bt
      kill -INT $bt; wait $bt || true
    done
    kill $server; wait $server 2>/dev/null || true
  fi
done
# SAMPLES=FILE keeps every round's figures ("label program runs ns" per line).
[ -n "${SAMPLES:-}" ] && cp "$work/samples" "$SAMPLES"
echo "median over $rounds rounds (ns per program run; runs of the last round)"
python3 - "$work/samples" <<'PY'
import sys, statistics, collections
s = collections.defaultdict(list); runs = {}
for line in open(sys.argv[1]):
    label, prog, n, ns = line.split()
    s[(label, prog)].append(float(ns)); runs[(label, prog)] = int(n)
# Everything the kernel programs cost, over the syscalls captured (records emitted).
for label in sorted({l for l, _ in s}):
    if (label, "emitted") in s:
        per = [t / e for t, e in zip(s[(label, "total_ns")], s[(label, "emitted")]) if e]
        if per:
            # Two lowest rounds as well: on a machine with slow phases (BENCHMARKS §31) the
            # median compares phases, the quiet rounds compare builds.
            low = sorted(per)[:2]
            print(f"{label:<40} all programs per captured syscall: median {statistics.median(per):.0f} ns (lowest {', '.join(f'{x:.0f}' for x in low)}; max {max(per):.0f})")
for (label, prog), v in s.items():
    if prog in ("total_ns", "emitted"):
        continue
    print(f"{label:<40} {prog:<14} {runs[(label, prog)]:>9} runs  median {statistics.median(v):>6.0f}  (min {min(v):.0f}, max {max(v):.0f})")
PY
