#!/usr/bin/env bash
# Cost of the TLS library probes (issue 25), as root: an HTTPS server streaming SSE with no
# pause between events (tests/engine/tls_sse.py, uvicorn on uvloop or threaded ssl), driven
# unpaced by its own client; per round, fresh servers without the agent, with inferscope, and
# with inferscope --no-tls (the TLS connections are then only recognised and ignored).
#   scripts/bench/tls_cost.sh [ROUNDS] [MODE]      MODE: uvicorn (default) or threaded
# Prints medians: requests/s, the server's CPU per request, the agent's CPU per 1,000 requests,
# and the kernel time per run of the TLS programs (bpf_stats; the uprobe trap itself is in the
# server's CPU, not there).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}; mode=${2:-uvicorn}
conns=${CONNS:-16}; reqs=${REQS:-40}
agent=${AGENT:-target/release/inferscope}
python=.venv-vllm/bin/python3; [ "$mode" = threaded ] && python=.venv/bin/python3
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
  -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system ticks
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

one() {  # label [agent args...]
  local label=$1; shift
  port=$(free_port)
  TLS_SSE_TOKEN_DELAY_MS=0 $python tests/engine/tls_sse.py "$mode" "$port" "$work/cert.pem" "$work/key.pem" "$work/server.jsonl" > "$work/server.out" 2>&1 & server=$!
  until grep -q ready "$work/server.out" 2>/dev/null; do sleep 0.1; done
  $python tests/engine/tls_sse.py load "$port" 4 5 > /dev/null  # warm-up
  local apid=""
  if [ "$label" != none ]; then
    "$agent" record --pid "$server" --out "$work/r.jsonl" "$@" 2> "$work/agent.log" & apid=$!
    until grep -q "attached pid" "$work/agent.log" 2>/dev/null; do sleep 0.1; done
    sleep 0.3
    grep -h '^prog_id:' /proc/"$apid"/fdinfo/* 2>/dev/null | awk '{print $2}' > "$work/ids"
  fi
  sysctl -qw kernel.bpf_stats_enabled=1
  bpftool prog show --json > "$work/a.json"
  local s0 a0=0 t0 t1
  s0=$(cpu "$server"); [ -n "$apid" ] && a0=$(cpu "$apid")
  t0=$(date +%s%N)
  $python tests/engine/tls_sse.py load "$port" "$conns" "$reqs" > "$work/client.out"
  t1=$(date +%s%N)
  local s1 a1=0
  s1=$(cpu "$server"); [ -n "$apid" ] && a1=$(cpu "$apid")
  bpftool prog show --json > "$work/b.json"
  sysctl -qw kernel.bpf_stats_enabled=0
  local n=$((conns * reqs))
  python3 - "$label" "$n" "$t0" "$t1" "$s0" "$s1" "$a0" "$a1" "$work/a.json" "$work/b.json" "$work/ids" >> "$work/samples" <<'PY'
import json, sys
label, n, t0, t1, s0, s1, a0, a1 = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:9])
print(label, "req_per_s", n / ((t1 - t0) / 1e9))
print(label, "server_cpu_ms_per_req", (s1 - s0) * 10 / n)
if label != "none":
    print(label, "agent_cpu_ms_per_1000", (a1 - a0) * 10 / n * 1000)
    a = {p["id"]: p for p in json.load(open(sys.argv[9]))}
    mine = {int(x) for x in open(sys.argv[11]).read().split()}
    for p in json.load(open(sys.argv[10])):
        if p["id"] in mine and p.get("name") in ("tls_call", "tls_return"):
            runs = p.get("run_cnt", 0) - a.get(p["id"], {}).get("run_cnt", 0)
            ns = p.get("run_time_ns", 0) - a.get(p["id"], {}).get("run_time_ns", 0)
            if runs:
                print(label, p["name"] + "_ns_per_run", ns / runs)
                print(label, p["name"] + "_runs_per_req", runs / n)
PY
  if [ -n "$apid" ]; then
    kill -INT "$apid"; wait "$apid" || true
    echo "$label records $(wc -l < "$work/r.jsonl")" >> "$work/samples"
  fi
  kill "$server"; wait "$server" 2>/dev/null || true
}

for r in $(seq "$rounds"); do
  one none
  one inferscope
  one no-tls --no-tls
done
echo "$mode, $conns connections x $reqs requests, unpaced; median over $rounds rounds"
python3 - "$work/samples" <<'PY'
import sys, statistics, collections
s = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, metric, value = line.split()
    s[(label, metric)].append(float(value))
for (label, metric), v in s.items():
    print(f"{label:<12} {metric:<28} median {statistics.median(v):>10.3f}  (min {min(v):.3f}, max {max(v):.3f})")
PY
