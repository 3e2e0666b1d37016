#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, unit tests, the eBPF integration tests
# against the real engine (root required), and a short fuzzing run of every parser.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: the eBPF integration tests need root" >&2
  exit 1
fi

echo "== rustfmt"
cargo fmt --all --check
echo "== clippy"
cargo clippy --all-targets -q -- -D warnings
# --- deploy: kustomize overlays rendered and validated; the container image (issue 14) -------
echo "== deploy manifests (kubectl kustomize + kubernetes-validate)"
scripts/check-manifests.sh
echo "== build"
cargo build --release -q -p inferscope -p inferscope-cupti
export INFERSCOPE_BIN="$PWD/target/release/inferscope"
export INFERSCOPE_SHIM_LIB="$PWD/target/release/libinferscope_cupti.so"
export INFERSCOPE_PYTHON="$PWD/.venv/bin/python3"
echo "== container image (scripts/build-image.sh; tests/tests/container_image.rs runs it)"
INFERSCOPE_SKIP_BUILD=1 scripts/build-image.sh inferscope:test
export INFERSCOPE_IMAGE=inferscope:test
# --- end deploy ------------------------------------------------------------------------------
echo "== llama-server (standalone llama.cpp engine; built once, cached in target/llama-server)"
scripts/build-llama-server.sh
export INFERSCOPE_LLAMA_SERVER="$PWD/target/llama-server"
echo "== tests (unit + eBPF integration against the real engine)"
# One test thread: the integration tests each run an engine and the agent on 2 cores.
cargo test -- --test-threads=1

echo "== fuzz (short run per target)"
scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
