#!/usr/bin/env bash
# Token events summarised in the kernel (issue 26), side by side in one run, as root:
#   1. ring records and bytes per request for a 24-token and a 1,000-token stream (8 keep-alive
#      connections), inferscope with token events and with --no-token-events; the requests that
#      teach the templates are measured in a run of their own and taken out;
#   2. the loopback SSE server (8 keep-alive connections, 24 tokens) at its highest rate (no
#      pacing): requests/s with no tracer, with inferscope (token events on / off), with the
#      agent BEFORE token events (env BEFORE=path, optional) and with the bpftrace baseline;
#      then the same tracers at a paced PACED requests/s (default 3,000, which every tracer
#      keeps up with): tracer CPU per 1,000 requests and peak RSS. Variants rotate every
#      round; medians.
# Usage: scripts/bench/token_events.sh [ROUNDS] [REQUESTS_PER_CONNECTION]
# Needs: cargo build --release -p inferscope -p inferscope-integration-tests --bin sse_load
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/bpftrace.sh
rounds=${1:-5}; reqs=${2:-1000}; conns=8
B=target/release
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

start_tracer() {  # variant server-pid → sets $tracer ("" for none)
  tracer=""
  case $1 in
    none) return ;;
    bpftrace)
      start_bpftrace "$work/bt.txt" "$work/t.log" scripts/bench/baseline.bt "$2"
      tracer=$bpftrace_pid
      sleep 1 ;;
    *)
      local bin=$B/inferscope args=()
      [ "$1" = before ] && bin=$BEFORE
      [ "$1" = full ] && args=(--no-token-events)
      "$bin" record --pid "$2" --out "$work/r.jsonl" "${args[@]}" 2>"$work/t.log" & tracer=$!
      until grep -q "attached pid=" "$work/t.log"; do sleep 0.1; done ;;
  esac
}
stop_tracer() {
  [ -n "$tracer" ] || return 0
  kill -INT "$tracer"; wait "$tracer" || true
}

echo "== 1. ring records and bytes per request"
# One agent run: a fresh server, two requests per connection that teach the templates, then
# (MEASURED > 0) the measured load, paced so the agent keeps up and no write is cut behind a
# filling ring. Appends "tokens variant measured records ring_records ring_bytes token_events
# misses chunks truncated incomplete" to $work/part1.
part1_run() {  # tokens variant measured-per-connection
  local tokens=$1 variant=$2 n=$3
  port=$(free_port)
  $B/sse_load serve --port "$port" --tokens "$tokens" & server=$!
  sleep 0.3
  start_tracer "$variant" "$server"
  local rate; rate=$([ "$tokens" = 24 ] && echo 2000 || echo 40)
  $B/sse_load load --port "$port" --connections $conns --requests 2 --rate "$rate" >/dev/null
  sleep 1
  if [ "$n" -gt 0 ]; then
    $B/sse_load load --port "$port" --connections $conns --requests "$n" --rate "$rate" >/dev/null
    sleep 1
  fi
  stop_tracer
  kill "$server"; wait "$server" 2>/dev/null || true
  python3 - "$tokens" "$variant" "$((conns * n))" "$work/t.log" "$work/r.jsonl" >> "$work/part1" <<'PY'
import json, re, sys
tokens, variant, n, log, recs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
last = {}
for m in re.finditer(r'counter="([a-z_]+)" value=(\d+)', open(log).read()):
    last[m.group(1)] = int(m.group(2))
records = [json.loads(l) for l in open(recs)]
print(tokens, variant, n, len(records), last.get("ringbuf_records", 0), last.get("ringbuf_bytes", 0),
      last.get("kernel_token_events", 0), last.get("kernel_token_template_misses", 0),
      sum(r["output_chunks"] or 0 for r in records), sum(r["capture_truncated"] for r in records),
      sum(1 for r in records if r["incomplete"]))
PY
}
: > "$work/part1"
for tokens in 24 1000; do
  n=$([ "$tokens" = 24 ] && echo 500 || echo 20)
  for variant in tokens full; do
    part1_run "$tokens" "$variant" 0      # the teaching requests alone
    part1_run "$tokens" "$variant" "$n"   # the same, then the measured ones
  done
done
# The measured requests' share: the second run less the first (same teaching load).
python3 - "$work/part1" <<'PY'
import sys
rows = [line.split() for line in open(sys.argv[1])]
for teach, full in zip(rows[0::2], rows[1::2]):
    tokens, variant, n = full[0], full[1], int(full[2])
    t = [int(x) for x in teach[3:]]; f = [int(x) for x in full[3:]]
    d = [b - a for a, b in zip(t, f)]
    print(f"  {tokens:>5} tokens, {variant:6}: {n} measured requests ({d[0]} recorded), "
          f"{d[1] / n:.1f} records and {d[2] / n / 1024:.2f} KiB of ring per request; "
          f"token events {d[3]}, misses {d[4]}, chunks per request {d[5] / max(d[0], 1):.1f}, "
          f"truncated {d[6]}, incomplete {d[7]}")
PY

paced=${PACED:-3000}
echo "== 2. loopback server: $rounds rounds of $((conns * reqs)) requests, unpaced then at $paced/s"
variants=(none tokens full bpftrace)
[ -n "${BEFORE:-}" ] && variants+=(before)
port=$(free_port)
$B/sse_load serve --port "$port" --tokens 24 & server=$!
sleep 0.3
$B/sse_load load --port "$port" --connections 4 --requests 200 >/dev/null   # warm-up
: > "$work/samples"
for round in $(seq 1 "$rounds"); do
  # Rotate the order every round, so drift on a shared machine hits every variant alike.
  for i in "${!variants[@]}"; do
    v=${variants[$(( (i + round) % ${#variants[@]} ))]}
    start_tracer "$v" "$server"
    out=$($B/sse_load load --port "$port" --connections $conns --requests "$reqs")
    c0=0; [ -n "$tracer" ] && c0=$(cpu_ticks "$tracer")
    $B/sse_load load --port "$port" --connections $conns --requests "$reqs" --rate "$paced" >/dev/null
    c1=0; hwm=0
    if [ -n "$tracer" ]; then
      sleep 0.5
      c1=$(cpu_ticks "$tracer"); hwm=$(awk '/VmHWM/ {print $2}' "/proc/$tracer/status")
    fi
    stop_tracer
    rate=$(echo "$out" | sed -E 's/.*: ([0-9.]+) requests\/s.*/\1/')
    echo "$v $rate $(( (c1 - c0) * 10 )) $hwm" >> "$work/samples"
  done
done
python3 - "$work/samples" "$((conns * reqs))" "$paced" <<'PY'
import statistics, sys, collections
n, paced = int(sys.argv[2]), sys.argv[3]
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, rate, cpu, hwm = line.split()
    by[v].append((float(rate), int(cpu), int(hwm)))
base = statistics.median(r for r, _, _ in by["none"])
print(f"  {'variant':10} {'unpaced req/s':>14} {'÷ no tracer':>12} {'CPU ms/1,000 req at ' + paced + '/s':>27} {'peak RSS MB':>12}")
for v, s in by.items():
    rate = statistics.median(r for r, _, _ in s)
    cpu = statistics.median(c for _, c, _ in s) / n * 1000
    rss = max(h for _, _, h in s) / 1024
    rates = ", ".join(f"{r:.0f}" for r, _, _ in s)
    print(f"  {v:10} {rate:14.0f} {rate / base:12.3f} {cpu:27.0f} {rss:12.1f}   ({rates})")
PY
