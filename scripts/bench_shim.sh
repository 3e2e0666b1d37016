#!/usr/bin/env bash
# Host-side cost of the CUPTI shim per kernel launch, measured with the mock CUDA stack
# (tests/mock-cuda). Not a GPU measurement: on a GPU host use tests/gpu/run.sh.
#   scripts/bench_shim.sh [LAUNCHES] [RUNS]   (defaults 1000000 and 7)
# Configurations, run alternately RUNS times each (medians reported):
#   bare      no injection (the mock driver alone)
#   baseline  shim injected, mock CUPTI dispatching callbacks, but the shim's callback not called
#   shim      shim injected and called on every launch API enter/exit
# Both injected runs synthesise no activity records (MOCK_CUPTI_NO_ACTIVITY=1): record handling
# runs on CUPTI's worker thread, not the launching one, and on a 2-core machine it would only add
# noise. The shim's cost on the launching thread is shim − baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1000000}"
runs="${2:-7}"
cargo build --release -q -p inferscope-cupti
out=target/mock-cuda
mkdir -p "$out"
cc=${CC:-cc}
$cc -O2 -shared -fPIC -Itests/mock-cuda -o "$out/libcuda.so" tests/mock-cuda/cuda.c -ldl -lpthread
$cc -O2 -shared -fPIC -Itests/mock-cuda -o "$out/libcupti.so" tests/mock-cuda/cupti.c -L"$out" -lcuda -lpthread
$cc -O2 -Itests/mock-cuda -o "$out/engine" tests/mock-cuda/engine.c -L"$out" -lcuda -lpthread -ldl
export LD_LIBRARY_PATH="$PWD/$out"
shim="$PWD/target/release/libinferscope_cupti.so"
sock="$(mktemp -u /tmp/inferscope-bench-XXXX.sock)"
bare=() base=() with=()
for _ in $(seq "$runs"); do
  bare+=("$("$out/engine" bench "$n" | tail -1)")
  base+=("$(MOCK_CUPTI_NO_ACTIVITY=1 MOCK_CUPTI_SKIP_CALLBACKS=1 CUDA_INJECTION64_PATH="$shim" INFERSCOPE_SHIM_SOCKET="$sock" INFERSCOPE_SHIM_QUIET=1 "$out/engine" bench "$n" | tail -1)")
  with+=("$(MOCK_CUPTI_NO_ACTIVITY=1 CUDA_INJECTION64_PATH="$shim" INFERSCOPE_SHIM_SOCKET="$sock" INFERSCOPE_SHIM_QUIET=1 "$out/engine" bench "$n" | tail -1)")
done
python3 - "$n" "${bare[*]}" "${base[*]}" "${with[*]}" <<'PY'
import json, statistics, sys
n = int(sys.argv[1])
def per_launch(blob):
    rows = [json.loads(x) for x in blob.replace('} {', '}\n{').splitlines()]
    return statistics.median(r['wall_ns'] / r['launches'] for r in rows), rows[0]['callbacks']
bare, _ = per_launch(sys.argv[2])
base, _ = per_launch(sys.argv[3])
shim, cbs = per_launch(sys.argv[4])
print(f"{n} launches per run, {cbs / n:.0f} CUPTI callbacks per launch (runtime + nested driver, enter + exit)")
print(f"bare mock driver:                        {bare:7.0f} ns/launch")
print(f"shim injected, callback not called:      {base:7.0f} ns/launch")
print(f"shim injected and called:                {shim:7.0f} ns/launch")
print(f"shim cost on the launching thread:       {shim - base:7.0f} ns/launch")
PY
