#!/usr/bin/env bash
# GPU proof of the launch uprobes (issue 27) on a real vLLM: serves a generated tiny random-weight
# Llama (real forward pass, CUDA graphs on), attaches the agent to the ALREADY RUNNING server
# with no environment variable (uprobes on libcuda in its EngineCore), sends requests, then does
# a second run with the CUPTI shim injected as well, and prints one table
# (tests/gpu/launches_table.py). Every step has a time limit: it refuses (exit 2) with the reason
# when something is missing, and never waits unbounded.
#   tests/gpu/launches.sh [OUT_DIR]
# Env: INFERSCOPE_BIN, INFERSCOPE_SHIM_LIB, VLLM_PYTHON (a Python with vLLM and CUDA PyTorch;
#      default .venv-gpu/bin/python3, created with INSTALL=1), VLLM_MODEL (default: a tiny model
#      written to OUT_DIR), REQUESTS (per run, default 24), PORT (default 18777),
#      INSTALL=1 (pip-install vLLM and its CUDA PyTorch wheels into .venv-gpu when missing),
#      LAUNCH_BUDGET (the agent's --gpu-launch-budget; default 0 here: every launch probed, so
#      the table shows the probes' full cost).
set -euo pipefail
script=launches.sh
# shellcheck source=tests/gpu/common.sh
. "$(dirname "$0")/common.sh"
out="${1:-$(mktemp -d /tmp/inferscope-launches-XXXX)}"
mkdir -p "$out"
py="${VLLM_PYTHON:-$PWD/.venv-gpu/bin/python3}"
requests="${REQUESTS:-24}"
port="${PORT:-18777}"
vllm_version="0.33.0"

need_artefacts
need_launch_tools
need_gpu
if [ ! -x "$py" ] && [ "${INSTALL:-0}" = 1 ]; then
  echo "installing vLLM $vllm_version and its CUDA PyTorch into .venv-gpu" >&2
  timeout 120 python3 -m venv .venv-gpu || refuse "python3 -m venv failed (apt-get install python3-venv)"
  timeout 900 .venv-gpu/bin/pip install -q --disable-pip-version-check "vllm==$vllm_version" \
    || refuse "pip could not install vllm==$vllm_version (the package registry must be reachable)"
fi
[ -x "$py" ] || refuse "no Python at $py (set VLLM_PYTHON, or INSTALL=1 to create .venv-gpu)"
need_torch_cuda "$py"
timeout 300 "$py" -c 'import vllm' 2>/dev/null || refuse "vLLM is not importable from $py"
model="${VLLM_MODEL:-$out/tiny-model}"
if [ ! -f "$model/config.json" ]; then
  timeout 300 "$py" tests/gpu/tiny_model.py "$model" >/dev/null || refuse "writing the tiny model to $model failed"
fi

server=""
agents=()
cleanup() {
  for a in "${agents[@]}"; do kill -INT "$a" 2>/dev/null || true; done
  [ -n "$server" ] && kill -TERM -- "-$server" 2>/dev/null || true
}
trap cleanup EXIT

# Starts vLLM in its own process group (env on top: $@), waits for it to answer (5 min).
start_server() {
  local name="$1"
  shift
  setsid env "$@" "$py" -m vllm.entrypoints.openai.api_server --model "$model" \
    --port "$port" --max-model-len 512 --gpu-memory-utilization 0.3 \
    >"$out/$name-vllm.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && return 0
    kill -0 "$server" 2>/dev/null || { tail -20 "$out/$name-vllm.log" >&2; refuse "vLLM exited at start-up ($out/$name-vllm.log)"; }
    sleep 1
  done
  refuse "vLLM did not answer within 300 s ($out/$name-vllm.log)"
}

stop_server() {
  kill -TERM -- "-$server" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$server" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$server" 2>/dev/null || true
  server=""
}

# Sends REQUESTS completions (4 at a time), timing them: one JSON line per run.
drive() {
  local name="$1" t0 t1
  t0=$(date +%s%N)
  seq "$requests" | xargs -P 4 -I{} curl -sf --max-time 60 "http://127.0.0.1:$port/v1/completions" \
    -H 'content-type: application/json' \
    -d "{\"model\":\"$model\",\"prompt\":\"w1 w2 w3 w4 w5 w6 w7 w8\",\"max_tokens\":64,\"ignore_eos\":true}" \
    -o /dev/null || refuse "a request to vLLM failed"
  t1=$(date +%s%N)
  echo "{\"run\":\"$name\",\"requests\":$requests,\"tokens\":$((requests * 64)),\"wall_ns\":$((t1 - t0))}" >>"$out/runs.jsonl"
}

# Attaches `record` to the running server (no env var, no restart) and waits for its attach.
attach() {
  local name="$1" pid="$2"
  "$bin" record --pid "$pid" --out "$out/$name-requests.jsonl" --steps "$out/$name-steps.jsonl" \
    --launches "$out/$name-launches.jsonl" --counters "$out/$name-counters.json" \
    --gpu-launch-budget "${LAUNCH_BUDGET:-0}" \
    2>"$out/$name-agent.log" &
  agents+=($!)
  for _ in $(seq 300); do
    grep -q "attached pid=$pid" "$out/$name-agent.log" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "attached pid=$pid" "$out/$name-agent.log" || refuse "the agent did not attach to $pid ($out/$name-agent.log)"
  # The EngineCore worker is probed at the agent's next worker scan (every 2 s).
  sleep 5
}

detach() {
  local a="${agents[-1]}"
  kill -INT "$a" 2>/dev/null || true
  timeout 30 tail --pid="$a" -f /dev/null || kill -KILL "$a" 2>/dev/null || true
  unset 'agents[-1]'
}

: >"$out/runs.jsonl"
echo "run 1: vLLM without the agent (baseline)" >&2
start_server baseline
drive warmup
drive baseline
echo "run 2: the agent attaches to the running server (launch uprobes, no env var)" >&2
attach uprobe "$server"
drive uprobe
detach
stop_server

echo "run 3: vLLM started with the CUPTI shim, the agent attached as well" >&2
"$bin" gpu --socket "$out/shim.sock" --out "$out/shim-gpu.jsonl" --nvml-interval 500ms \
  2>"$out/shim-gpu-agent.log" &
agents+=($!)
wait_socket "$out/shim.sock" 100 "$out/shim-gpu-agent.log"
start_server shim CUDA_INJECTION64_PATH="$shim" INFERSCOPE_SHIM_SOCKET="$out/shim.sock"
drive warmup-shim
attach shim "$server"
drive shim
detach
stop_server
detach
trap - EXIT
timeout 120 "$py" tests/gpu/launches_table.py "$out"
