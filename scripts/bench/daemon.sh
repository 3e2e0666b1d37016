#!/usr/bin/env bash
# What exporting costs: agent CPU per 1,000 requests and peak RSS for the same loopback SSE load
# (tests/src/bin/sse_load.rs), for `inferscope record` (JSONL only), `inferscope run` without
# OTLP (Prometheus + gRPC + timelines), and `inferscope run` exporting every request as OTLP
# spans to a real collector (rotel, blackhole exporter). As root.
# Usage: scripts/bench/daemon.sh [CONNECTIONS] [REQUESTS_PER_CONNECTION]
set -euo pipefail
cd "$(dirname "$0")/../.."
conns=${1:-8}; reqs=${2:-1000}
cargo build --release -q -p inferscope -p inferscope-integration-tests --bin inferscope --bin sse_load
B=target/release
ROTEL=$(ls .venv/lib/python3*/site-packages/rotel/rotel-agent)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

port=$(free_port)
$B/sse_load serve --port "$port" & server=$!
sleep 0.5
$B/sse_load load --port "$port" --connections 4 --requests 200 >/dev/null   # warm-up
otlp=$(free_port)
"$ROTEL" start --otlp-grpc-endpoint 127.0.0.1:$otlp --otlp-http-endpoint 127.0.0.1:$(free_port) --exporter blackhole >/dev/null 2>&1 &
sleep 1

one() {  # name, agent args...
  local name=$1; shift
  "$B/inferscope" "$@" 2>"$work/$name.log" & local agent=$!
  until grep -q attached "$work/$name.log"; do sleep 0.1; done
  local c0 c1 total=$((conns * reqs))
  c0=$(cpu_ticks $agent)
  $B/sse_load load --port "$port" --connections "$conns" --requests "$reqs" | sed 's/^/  load: /'
  sleep 3   # timelines settle and spans leave
  c1=$(cpu_ticks $agent)
  if [ -n "${metrics_port:-}" ]; then
    curl -s "127.0.0.1:$metrics_port/metrics" | grep -E 'counter="otlp_' | sed 's/^/  /'
  fi
  echo "  $name: $(python3 -c "print(f'{($c1-$c0)*10/$total*1000:.0f}')") ms CPU per 1,000 requests; $(grep VmHWM /proc/$agent/status | tr -s ' ')"
  kill -INT $agent; wait $agent || true
}

echo "== $((conns * reqs)) requests, $conns connections"
one record record --pid $server --out "$work/r.jsonl"
one run-no-otlp run --pid $server --prometheus off --grpc "unix://$work/a.sock"
metrics_port=$(free_port)
one run-otlp run --pid $server --prometheus 127.0.0.1:$metrics_port --grpc "unix://$work/b.sock" --otlp-endpoint "http://127.0.0.1:$otlp"
