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
# there); LAUNCHES=0 skips it. Missing pieces are refused with the reason (exit 2), never waited on
# (tests/gpu/common.sh: the checks both scripts share). It has not been run on a GPU yet.
set -euo pipefail
script=run.sh
# shellcheck source=tests/gpu/common.sh
. "$(dirname "$0")/common.sh"
out="${1:-$(mktemp -d /tmp/inferscope-gpu-XXXX)}"
mkdir -p "$out"
py="${PYTHON:-python3}"
steps="${STEPS:-64}"
repeat="${REPEAT:-3}"
sock="$out/shim.sock"
need_artefacts
command -v "$py" >/dev/null || refuse "no Python at $py (set PYTHON)"
need_gpu
need_torch_cuda "$py"
timeout 300 "$py" -c 'import transformers' 2>/dev/null || refuse "transformers is not importable from $py"
# The launch-uprobe proof runs after this one: refuse now, not after the shim runs.
if [ "${LAUNCHES:-1}" = 1 ]; then
  need_launch_tools
fi

"$bin" gpu --socket "$sock" --out "$out/gpu.jsonl" --nvml-interval 500ms 2>"$out/agent.log" &
agent=$!
trap 'kill $agent 2>/dev/null || true' EXIT
wait_socket "$sock" 100 "$out/agent.log"

: >"$out/runs.jsonl"
for i in $(seq "$repeat"); do
  for mode in eager graphs; do
    echo "run $i: $mode without the shim" >&2
    timeout 600 "$py" tests/gpu/workload.py "$mode" "$steps" >>"$out/runs.jsonl" 2>>"$out/workload.log" \
      || refuse "the $mode workload failed or ran past 600 s ($out/workload.log)"
    echo "run $i: $mode with the shim" >&2
    CUDA_INJECTION64_PATH="$shim" INFERSCOPE_SHIM_SOCKET="$sock" \
      timeout 600 "$py" tests/gpu/workload.py "$mode" "$steps" >>"$out/runs.jsonl" 2>>"$out/workload.log" \
      || refuse "the $mode workload with the shim failed or ran past 600 s ($out/workload.log)"
  done
done
sleep 2
kill -TERM $agent
timeout 30 tail --pid="$agent" -f /dev/null || kill -KILL $agent 2>/dev/null || true
trap - EXIT
timeout 120 "$py" tests/gpu/check.py "$out"
if [ "${LAUNCHES:-1}" = 1 ]; then
  tests/gpu/launches.sh "$out/launches"
fi
