#!/usr/bin/env bash
# `inferscope run` with OTLP (to a real collector, rotel with its blackhole exporter) and
# Prometheus on, under a paced loopback SSE load (8 keep-alive connections, 24 tokens), for a
# while: the agent's CPU and RSS every minute, and at the end what the exporter did (spans
# exported, export calls: whether it batches) and what was lost. As root.
# Usage: scripts/bench/run_soak.sh [RATE] [MINUTES]
# Needs: cargo build --release -p inferscope -p inferscope-integration-tests --bin sse_load
set -euo pipefail
cd "$(dirname "$0")/../.."
rate=${1:-3000}; minutes=${2:-10}
B=target/release
ROTEL=$(ls .venv/lib/python3*/site-packages/rotel/rotel-agent)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

port=$(free_port); otlp=$(free_port); metrics=$(free_port)
$B/sse_load serve --port "$port" --tokens 24 & server=$!
"$ROTEL" start --otlp-grpc-endpoint "127.0.0.1:$otlp" --otlp-http-endpoint "127.0.0.1:$(free_port)" \
  --exporter blackhole >/dev/null 2>&1 &
sleep 1
$B/inferscope run --pid "$server" --prometheus "127.0.0.1:$metrics" --grpc "unix://$work/a.sock" \
  --otlp-endpoint "http://127.0.0.1:$otlp" 2>"$work/agent.log" & agent=$!
until grep -q "attached pid=" "$work/agent.log"; do sleep 0.1; done
seconds=$((minutes * 60))
$B/sse_load load --port "$port" --connections 8 --requests 100000000 --seconds "$seconds" \
  --rate "$rate" > "$work/client" & load=$!
echo "minute  agent CPU %  RSS MB"
c_prev=$(cpu_ticks $agent)
for m in $(seq 1 "$minutes"); do
  sleep 60
  c=$(cpu_ticks $agent)
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status")
  printf "%6d %11.1f %7.1f\n" "$m" "$(echo "($c - $c_prev) / 60" | bc -l)" "$(echo "$rss / 1024" | bc -l)"
  c_prev=$c
done
wait "$load"
sleep 5
echo "client: $(cat "$work/client")"
curl -s "127.0.0.1:$metrics/metrics" | grep -E 'counter="(otlp_|requests_lost|requests_incomplete"|kernel_ringbuf_full_drops|kernel_token_events|ringbuf_bytes|ringbuf_records)' | sed 's/^/  /'
echo "peak $(grep VmHWM /proc/$agent/status | tr -s ' ')"
kill -INT $agent; wait $agent || true
