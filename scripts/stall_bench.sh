#!/usr/bin/env bash
# Loss under a stalled agent: `inferscope record` traces a loopback SSE server (sse_load serve,
# TOKENS token events per response) while 8 keep-alive clients send RATE requests/s for 8 s; at
# 2 s the agent is stopped (SIGSTOP) for STALL seconds, as a CPU limit would deschedule it.
# Prints the client's completed responses, the records (incomplete ones too), the requests the
# agent counted as lost, the kernel records dropped and the agent's peak RSS.
#
#   scripts/stall_bench.sh [RATE] [RING_MB] [STALL_S] [TOKENS]     (root; build first:
#   cargo build --release -p inferscope -p inferscope-integration-tests --bin sse_load)
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-3000}" ring="${2:-16}" stall="${3:-2}" tokens="${4:-16}"
port="${STALL_BENCH_PORT:-17201}"
bin=target/release
dir=$(mktemp -d)
trap 'kill $server $agent 2>/dev/null || true; rm -rf "$dir"' EXIT
"$bin/sse_load" serve --port "$port" --tokens "$tokens" & server=$!
sleep 0.3
INFERSCOPE_LOG=info "${STALL_BENCH_AGENT:-$bin/inferscope}" record --port "$port" --ring-buffer-mb "$ring" \
  --out "$dir/r.jsonl" 2>"$dir/log" & agent=$!
until grep -q "attached pid=$server" "$dir/log"; do sleep 0.1; done
"$bin/sse_load" load --port "$port" --connections 8 --requests 100000000 --seconds 8 \
  --rate "$rate" >"$dir/client" & load=$!
peak=0
for i in $(seq 1 80); do
  sleep 0.1
  [ "$i" = 20 ] && kill -STOP "$agent"
  [ "$i" = $((20 + stall * 10)) ] && kill -CONT "$agent"
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status" 2>/dev/null || echo 0)
  [ "${rss:-0}" -gt "$peak" ] && peak=$rss
done
kill -CONT "$agent" 2>/dev/null || true
wait "$load"
sleep 2
kill -INT "$agent"; wait "$agent" || true
done_n=$(awk '{print $1}' "$dir/client")
records=$(wc -l <"$dir/r.jsonl")
incomplete=$(grep -c '"incomplete":"' "$dir/r.jsonl" || true)
counter() { { grep -o "counter=\"$1\" value=[0-9]*" "$dir/log" || true; } | tail -1 | sed 's/.*value=//'; }
lost=$(counter requests_lost); drops=$(counter kernel_ringbuf_full_drops)
grep -o "counter=\"kernel_[a-z_]*\" value=[0-9]*" "$dir/log" | sort -u -t" " -k1,1 | tr "\n" " " >&2 || true; echo >&2
echo "rate=$rate ring_mb=$ring stall_s=$stall tokens=$tokens client_completed=$done_n records=$records incomplete=$incomplete lost=${lost:-0} kernel_drops=${drops:-0} peak_rss_kib=$peak"
