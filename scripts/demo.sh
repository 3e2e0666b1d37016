#!/usr/bin/env bash
# One command for a newcomer: install what is needed, build, and run `inferscope demo` on the
# bundled llama.cpp engine. Extra arguments go to `inferscope demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh demo
export PATH="$HOME/.cargo/bin:$PATH"
target_dir=${CARGO_TARGET_DIR:-target}
# The eBPF programs shipped in ebpf/prebuilt when they were built from these sources (CI checks
# them byte for byte against a fresh build): the demo compiles no eBPF. Otherwise setup.sh has
# installed the eBPF toolchain and the build compiles them (INFERSCOPE_EBPF=auto).
if [ -z "${INFERSCOPE_EBPF:-}" ] && scripts/ebpf-prebuilt.sh --matches; then
  export INFERSCOPE_EBPF=prebuilt
fi
if [ ! -x "$target_dir/demo/inferscope" ]; then
  echo "building inferscope (first time: about 2 minutes on 2 cores, BENCHMARKS §34; cargo shows progress)"
fi
# Not -q: a first build takes minutes, and cargo's progress says it is working. The demo profile
# (Cargo.toml) is unoptimised: under half release's CPU to build, and fast enough for the demo.
cargo build --profile demo -p inferscope
exec "$target_dir/demo/inferscope" demo --python .venv/bin/python3 "$@"
