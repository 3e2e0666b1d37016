# Shared preamble of the GPU proof scripts (run.sh, launches.sh): sourced, not run. Sets `bin`
# and `shim` (INFERSCOPE_BIN, INFERSCOPE_SHIM_LIB; default target/release/...), defines
# `refuse` (exit 2 with the reason) and the checks each script asks for. Every check is bounded
# in time: a missing piece is refused at once with what to do, never waited on.
# The caller has done `set -euo pipefail` and set `script` (its name, for messages).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin="${INFERSCOPE_BIN:-$PWD/target/release/inferscope}"
shim="${INFERSCOPE_SHIM_LIB:-$PWD/target/release/libinferscope_cupti.so}"

refuse() {
  echo "tests/gpu/$script refuses: $*" >&2
  exit 2
}

# The agent binary and the shim library, built on a build machine and carried here.
need_artefacts() {
  [ -x "$bin" ] || refuse "no agent binary at $bin (cargo build --release -p inferscope, or set INFERSCOPE_BIN)"
  [ -f "$shim" ] || refuse "no shim library at $shim (cargo build --release -p inferscope-cupti, or set INFERSCOPE_SHIM_LIB)"
  if command -v nm >/dev/null; then
    nm -D --defined-only "$shim" | grep -q ' T InitializeInjection' \
      || refuse "InitializeInjection is not exported by $shim (not the shim library?)"
  fi
}

# An NVIDIA driver that lists a GPU (nvidia-smi answers within 60 s).
need_gpu() {
  command -v nvidia-smi >/dev/null || refuse "nvidia-smi is missing: no NVIDIA driver on this machine"
  timeout 60 nvidia-smi -L 2>/dev/null | grep -q GPU || refuse "nvidia-smi lists no GPU (or did not answer in 60 s)"
}

# What the launch-uprobe proof needs besides a GPU: root (the agent loads eBPF programs), curl.
need_launch_tools() {
  [ "$(id -u)" = 0 ] || refuse "the agent loads eBPF programs: run as root"
  command -v curl >/dev/null || refuse "curl is missing (apt-get install curl)"
}

# Python $1 exists and its PyTorch can use a CUDA device.
need_torch_cuda() {
  local py="$1"
  command -v "$py" >/dev/null || refuse "no Python at $py (set PYTHON / VLLM_PYTHON)"
  timeout 300 "$py" -c 'import torch' 2>/dev/null || refuse "PyTorch is not importable from $py"
  timeout 300 "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || refuse "PyTorch in $py cannot use a CUDA device (no GPU, CPU wheels, or a driver too old for them)"
}

# Waits up to $2 tenths of a second for socket $1; refuses naming log $3 if it never appears.
wait_socket() {
  local sock="$1" tenths="$2" log="$3"
  for _ in $(seq "$tenths"); do [ -S "$sock" ] && return 0; sleep 0.1; done
  refuse "the agent did not create $sock ($log)"
}
