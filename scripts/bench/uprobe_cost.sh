#!/usr/bin/env bash
# What one uprobe hit costs the probed thread on this machine: a C loop calls a noinline
# function N times, bare, then with an inferscope user-defined probe on it at entry, then at
# return (`inferscope record --pid --probes`). The difference per call is what the engine pays
# at each hooked call: the trap plus the probe program (whose own run time bpf_stats gives).
# See BENCHMARKS.md, section 4.
#   scripts/bench/uprobe_cost.sh [CALLS] [ROUNDS]      # root, after a release build
set -euo pipefail
cd "$(dirname "$0")/../.."
calls=${1:-200000}
rounds=${2:-5}
bin=${INFERSCOPE_BIN:-$PWD/target/release/inferscope}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/loop.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
__attribute__((noinline)) int hooked(int x) { __asm__ volatile("" ::: "memory"); return x + 1; }
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    sleep((unsigned)atoi(argv[2])); /* time for the agent to attach */
    struct timespec a, b;
    int acc = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) acc = hooked(acc);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return acc == 0;
}
C
cc -O2 -o "$dir/loop" "$dir/loop.c"
for at in entry return; do
  printf '[[probe]]\nobject = "loop"\nsymbol = "hooked"\nevent = "step_begin"\nat = "%s"\n' \
    "$at" >"$dir/$at.toml"
done


# ns per call with the probe at $1 (none: bare), one line per round in $dir/$1.calls; with
# bpf_stats on, the probe program's own ns per run in $dir/$1.prog.
run() {
  local at=$1
  : >"$dir/$at.calls"; : >"$dir/$at.prog"
  for _ in $(seq "$rounds"); do
    if [ "$at" = none ]; then
      "$dir/loop" "$calls" 0 >>"$dir/$at.calls"
      continue
    fi
    "$dir/loop" "$calls" 3 >>"$dir/$at.calls" &
    local pid=$!
    "$bin" record --pid "$pid" --probes "$dir/$at.toml" --out "$dir/r.jsonl" \
      >"$dir/agent.log" 2>&1 &
    local agent=$!
    wait "$pid"
    bpftool prog show --json | python3 -c '
import json, sys
for p in json.load(sys.stdin):
    if p.get("name", "").startswith("user_probe") and p.get("run_cnt"):
        print(p["run_time_ns"] / p["run_cnt"])' >>"$dir/$at.prog"
    kill -INT "$agent"; wait "$agent" || true
    grep -q "user probe attached" "$dir/agent.log" || { cat "$dir/agent.log" >&2; exit 1; }
  done
}

sysctl -qw kernel.bpf_stats_enabled=1
for at in none entry return; do run "$at"; done
sysctl -qw kernel.bpf_stats_enabled=0
bare=$(sort -n "$dir/none.calls" | sed -n "$(( (rounds + 1) / 2 ))p")
echo "| probe | ns per call | added per hit | of which the program |"
echo "| --- | --- | --- | --- |"
echo "| none | $bare | — | — |"
for at in entry return; do
  ns=$(sort -n "$dir/$at.calls" | sed -n "$(( (rounds + 1) / 2 ))p")
  prog=$(sort -n "$dir/$at.prog" | sed -n "$(( (rounds + 1) / 2 ))p")
  printf '| %s | %s | %.0f ns | %.0f ns |\n' "$at" "$ns" "$(echo "$ns - $bare" | bc)" "$prog"
done
