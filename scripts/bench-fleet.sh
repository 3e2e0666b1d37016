#!/usr/bin/env bash
# The fleet diagnosis at scale (BENCHMARKS.md §36): a real Prometheus scraping a simulated fleet
# of PODS pods (scripts/fleet_exporter.py: the agents' histograms and counters, every second; pod
# 7 slows after 50 s), then `inferscope diagnose --prometheus` over a 40 s baseline and a 40 s
# incident window, timed with its peak memory. Usage: scripts/bench-fleet.sh [PODS]
set -euo pipefail
cd "$(dirname "$0")/.."
pods="${1:-1000}"
bin="${INFERSCOPE_BIN:-target/release/inferscope}"
python="${INFERSCOPE_PYTHON:-.venv/bin/python3}"
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
port_of() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
exporter_port="$(port_of)"
prom_port="$(port_of)"
"$python" scripts/fleet_exporter.py "$exporter_port" "$pods" --slow-after 50 > "$dir/exporter.out" &
until grep -q ready "$dir/exporter.out" 2>/dev/null; do sleep 0.2; done
cat > "$dir/prometheus.yml" <<CONF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: fleet
    static_configs:
      - targets: ['127.0.0.1:$exporter_port']
CONF
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" > "$dir/prometheus.log" 2>&1 &
t0="$(date +%s)"
echo "scraping $pods pods for 100 s"
sleep 100
at() { date -u -d "@$(( t0 + $1 ))" +%Y-%m-%dT%H:%M:%SZ; }
series="$(curl -s "http://127.0.0.1:$prom_port/api/v1/query?query=count(%7B__name__%3D~%22gen_ai.*%7Cinferscope.*%22%7D)" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["data"]["result"][0]["value"][1])')"
echo "series in Prometheus: $series"
/usr/bin/time -v "$bin" diagnose --prometheus "http://127.0.0.1:$prom_port" \
  --baseline "$(at 5)..$(at 45)" --window "$(at 58)..$(at 98)" > "$dir/report.txt" 2> "$dir/time.txt" || true
head -3 "$dir/report.txt"
grep -E "Elapsed \(wall clock\)|Maximum resident set size" "$dir/time.txt"
