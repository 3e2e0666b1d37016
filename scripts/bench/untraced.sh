#!/usr/bin/env bash
# What the agent's programs cost the syscalls of a process it does not trace: `inferscope record`
# traces an idle process while `dd` makes COUNT one-byte reads and writes; bpf_stats around the
# `dd` give each program's runs and ns per run (the socket tracepoints run for every process).
# Also the `dd`'s own wall time, without the agent and with it (bpf_stats off; medians of
# three): what the process pays, the tracepoints' dispatch included, which bpf_stats does not
# see, and without bpf_stats' own clock reads, which it does.
#   scripts/bench/untraced.sh AGENT_BIN [COUNT]      (root)
set -euo pipefail
bin=$1; count=${2:-1000000}
work=$(mktemp -d)
sleep 1000 & idle=$!
trap 'kill $(jobs -p) 2>/dev/null || true; sysctl -qw kernel.bpf_stats_enabled=0; rm -rf "$work"' EXIT
dd_ns() {
  local t0 t1
  t0=$(date +%s%N)
  dd if=/dev/zero of=/dev/null bs=1 count="$count" 2>/dev/null
  t1=$(date +%s%N)
  echo $((t1 - t0))
}
median3() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
plain=$(median3 "$(dd_ns)" "$(dd_ns)" "$(dd_ns)")
"$bin" record --pid "$idle" --out "$work/r.jsonl" 2>"$work/agent.log" & agent=$!
until grep -q attached "$work/agent.log"; do sleep 0.1; done
sleep 0.5
traced=$(median3 "$(dd_ns)" "$(dd_ns)" "$(dd_ns)")
grep -h '^prog_id:' /proc/"$agent"/fdinfo/* 2>/dev/null | awk '{print $2}' > "$work/ids"
sysctl -qw kernel.bpf_stats_enabled=1
bpftool prog show --json > "$work/a.json"
dd if=/dev/zero of=/dev/null bs=1 count="$count" 2>/dev/null
bpftool prog show --json > "$work/b.json"
sysctl -qw kernel.bpf_stats_enabled=0
kill -INT "$agent"; wait "$agent" || true
echo "  dd wall time per read + write pair: $((plain / count)) ns without the agent, $((traced / count)) ns with it: +$(((traced - plain) / count)) ns"
python3 - "$work" "$count" <<'PY'
import json, sys
work, count = sys.argv[1], int(sys.argv[2])
mine = {int(x) for x in open(f"{work}/ids").read().split()}
before = {p["id"]: p for p in json.load(open(f"{work}/a.json"))}
total = 0
for p in json.load(open(f"{work}/b.json")):
    if p["id"] not in mine:
        continue
    runs = p.get("run_cnt", 0) - before.get(p["id"], {}).get("run_cnt", 0)
    ns = p.get("run_time_ns", 0) - before.get(p["id"], {}).get("run_time_ns", 0)
    if runs >= count // 2:
        print(f"  {p.get('name', '?'):<18} {runs:>9} runs {ns / runs:6.0f} ns per run")
        total += ns
print(f"  all programs per read + write pair: {total / count:.0f} ns")
PY
