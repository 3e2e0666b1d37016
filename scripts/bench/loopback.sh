#!/usr/bin/env bash
# Loopback benchmarks of the agent against a high-rate SSE server (tests/src/bin/sse_load.rs),
# as root. Prints, for the same load:
#   1. inferscope: kernel ns per program run (bpf_stats), agent CPU per 1,000 requests, peak RSS,
#      records written vs requests served, drops;
#   2. the bpftrace baseline (scripts/bench/baseline.bt): the same figures for it;
#   3. inferscope with N requests in flight at once (RSS).
# Usage: scripts/bench/loopback.sh [CONNECTIONS] [REQUESTS_PER_CONNECTION] [IN_FLIGHT]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/bpftrace.sh
conns=${1:-8}; reqs=${2:-1000}; inflight=${3:-10000}
cargo build --release -q -p inferscope -p inferscope-integration-tests --bin inferscope --bin sse_load
B=target/release
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
prog_stats() { bpftool prog show --json > "$1"; }
prog_delta() {  # before.json after.json name-filter(python expr on name)
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = {p["id"]: p for p in json.load(open(sys.argv[1]))}
b = {p["id"]: p for p in json.load(open(sys.argv[2]))}
keep = eval("lambda n: " + sys.argv[3])
for i, p in sorted(b.items(), key=lambda kv: kv[1].get("name", "")):
    n = p.get("name", "")
    if p.get("type") != "tracepoint" or not keep(n):
        continue
    dc = p.get("run_cnt", 0) - a.get(i, {}).get("run_cnt", 0)
    dt = p.get("run_time_ns", 0) - a.get(i, {}).get("run_time_ns", 0)
    if dc:
        print(f"  {n:<18} {dc:>9} runs {dt / dc:>7.0f} ns/run")
PY
}

measure() {  # name pid-of-tracer
  local tracer=$2 c0 c1
  c0=$(cpu_ticks "$tracer")
  sysctl -qw kernel.bpf_stats_enabled=1
  prog_stats "$work/before.json"
  $B/sse_load load --port "$port" --connections "$conns" --requests "$reqs" | sed 's/^/  load: /'
  sleep 0.5
  prog_stats "$work/after.json"
  sysctl -qw kernel.bpf_stats_enabled=0
  c1=$(cpu_ticks "$tracer")
  local total=$((conns * reqs))
  echo "  $1 CPU: $(( (c1 - c0) * 10 )) ms for $total requests ($(python3 -c "print(f'{($c1-$c0)*10/$total*1000:.0f}')") ms per 1,000 requests); $(grep VmHWM /proc/$tracer/status | tr -s ' ')"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
$B/sse_load serve --port $port & server=$!
sleep 0.5
$B/sse_load load --port $port --connections 4 --requests 200 >/dev/null   # warm-up

echo "== inferscope"
$B/inferscope record --pid $server --out "$work/records.jsonl" 2>"$work/agent.log" & agent=$!
until grep -q attached "$work/agent.log"; do sleep 0.1; done
measure inferscope $agent
prog_delta "$work/before.json" "$work/after.json" 'n.startswith(("enter_", "exit_", "tcp_probe"))'
kill -INT $agent; wait $agent || true
echo "  records: $(wc -l < "$work/records.jsonl") (for $((conns * reqs)) requests; the warm-up came before attach)"
grep -o 'counter="[a-z_]*" value=[0-9]*' "$work/agent.log" | sed 's/^/  /'

echo "== bpftrace baseline"
start_bpftrace "$work/bt.txt" "$work/bt.log" scripts/bench/baseline.bt "$server"
bt=$bpftrace_pid
sleep 1
measure bpftrace $bt
prog_delta "$work/before.json" "$work/after.json" 'n.startswith("sys_")'
kill -INT $bt; wait $bt || true
echo "  lines printed: $(grep -c '^[RW] ' "$work/bt.txt"), events reported lost: $(awk '/^Lost/{s+=$2} END{print s+0}' "$work/bt.txt")"
kill $server; wait $server 2>/dev/null || true

echo "== inferscope, $inflight requests in flight"
port=$(free_port)
$B/sse_load serve --port $port --hold-ms 12000 & server=$!
sleep 0.5
$B/inferscope record --pid $server --out "$work/hold.jsonl" 2>"$work/hold.log" & agent=$!
until grep -q attached "$work/hold.log"; do sleep 0.1; done
echo "  idle: $(grep VmRSS /proc/$agent/status | tr -s ' ')"
$B/sse_load hold --port $port --connections "$inflight" > "$work/hold.out" & holder=$!
sleep 8
echo "  all in flight: $(grep VmRSS /proc/$agent/status | tr -s ' '), of which the ring buffer mapping $(awk '/anon_inode:bpf-map/{m=1} m&&/^Rss/{s+=$2; m=0} END{print s}' /proc/$agent/smaps) kB"
wait $holder; sed 's/^/  /' "$work/hold.out"
kill -INT $agent; wait $agent || true
echo "  records: $(wc -l < "$work/hold.jsonl"), marked capture_truncated: $(grep -c '"capture_truncated":true' "$work/hold.jsonl" || true)"
grep -o 'counter="kernel_ringbuf_full_drops" value=[0-9]*' "$work/hold.log" | sed 's/^/  /' || true
