#!/usr/bin/env bash
# GPU check of the CUPTI shim on a machine with an NVIDIA GPU, PyTorch and transformers (no network
# needed). Build on a build machine and carry the two artefacts:
#   cargo build --release -p inferscope -p inferscope-cupti
#   -> target/release/inferscope, target/release/libinferscope_cupti.so
# Then, on the GPU machine, from the repository root:
#   tests/gpu/run.sh [OUT_DIR]
# Env: INFERSCOPE_BIN, INFERSCOPE_SHIM_LIB (default target/release/...), PYTHON (default python3),
#      STEPS (decode steps per run, default 64), REPEAT (runs per configuration, default 3).
# libcupti must be loadable by name (libcupti.so.12 etc.): PyTorch's CUDA wheels load it already;
# otherwise add its directory to LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(mktemp -d /tmp/inferscope-gpu-XXXX)}"
mkdir -p "$out"
bin="${INFERSCOPE_BIN:-$PWD/target/release/inferscope}"
shim="${INFERSCOPE_SHIM_LIB:-$PWD/target/release/libinferscope_cupti.so}"
py="${PYTHON:-python3}"
steps="${STEPS:-64}"
repeat="${REPEAT:-3}"
sock="$out/shim.sock"
[ -x "$bin" ] || { echo "no agent binary at $bin" >&2; exit 1; }
[ -f "$shim" ] || { echo "no shim library at $shim" >&2; exit 1; }
if command -v nm >/dev/null; then
  nm -D --defined-only "$shim" | grep -q ' T InitializeInjection' || { echo "InitializeInjection not exported" >&2; exit 1; }
fi
"$py" -c 'import torch, transformers; assert torch.cuda.is_available(), "no CUDA device"' || exit 1

"$bin" gpu --socket "$sock" --out "$out/gpu.jsonl" --nvml-interval 500ms 2>"$out/agent.log" &
agent=$!
trap 'kill $agent 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "agent did not create $sock" >&2; cat "$out/agent.log" >&2; exit 1; }

: >"$out/runs.jsonl"
for i in $(seq "$repeat"); do
  for mode in eager graphs; do
    echo "run $i: $mode without the shim" >&2
    "$py" tests/gpu/workload.py "$mode" "$steps" >>"$out/runs.jsonl" 2>>"$out/workload.log"
    echo "run $i: $mode with the shim" >&2
    CUDA_INJECTION64_PATH="$shim" INFERSCOPE_SHIM_SOCKET="$sock" \
      "$py" tests/gpu/workload.py "$mode" "$steps" >>"$out/runs.jsonl" 2>>"$out/workload.log"
  done
done
sleep 2
kill -TERM $agent
wait $agent || true
trap - EXIT
"$py" tests/gpu/check.py "$out"
