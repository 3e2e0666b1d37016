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
# Then the launch-uprobe proof on a real vLLM (tests/gpu/launches.sh, OUT_DIR/launches; its env
# there); LAUNCHES=0 skips it. Missing pieces are refused with the reason (exit 2), never waited on.
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
refuse() {
  echo "tests/gpu/run.sh refuses: $*" >&2
  exit 2
}
[ -x "$bin" ] || refuse "no agent binary at $bin (cargo build --release -p inferscope, or set INFERSCOPE_BIN)"
[ -f "$shim" ] || refuse "no shim library at $shim (cargo build --release -p inferscope-cupti, or set INFERSCOPE_SHIM_LIB)"
if command -v nm >/dev/null; then
  nm -D --defined-only "$shim" | grep -q ' T InitializeInjection' || refuse "InitializeInjection is not exported by $shim"
fi
command -v "$py" >/dev/null || refuse "no Python at $py (set PYTHON)"
timeout 300 "$py" -c 'import torch, transformers' 2>/dev/null || refuse "PyTorch and transformers are not importable from $py"
timeout 300 "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || refuse "PyTorch in $py cannot use a CUDA device (no GPU, CPU wheels, or a driver too old)"

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
if [ "${LAUNCHES:-1}" = 1 ]; then
  tests/gpu/launches.sh "$out/launches"
fi
