#!/usr/bin/env bash
# Runs every cargo-fuzz target for N seconds (default 30). Needs a nightly toolchain (rustup).
# Targets (fuzz/fuzz_targets/): http_decoder (HTTP/1.1, chunked, SSE, JSON fields), prometheus_text
# (the exposition-format parser), shim_frames (the CUPTI shim's length-delimited frames), vllm_ipc
# (ZMTP 3.x framing, msgpack, vLLM V1 IPC messages and request state), probe_spec (the
# user-defined probe spec parser), pod_identity (cgroup paths, Kubernetes watch lines and pods),
# connection_tracker (the per-connection tracker under dropped records, truncated captures and
# stray bytes), pickle_reader (the inert pickle reader and SGLang's IPC decoder), http2_decoder
# (HTTP/2 framing, HPACK and gRPC messages per stream, fresh and mid-connection; the protobuf
# reader of engines' gRPC request ids), kernel_btf (the kernel BTF reader behind the accept's
# socket walk).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
export PATH="$HOME/.cargo/bin:$PATH"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: no nightly toolchain; cargo-fuzz needs one" >&2
  exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install -q --locked cargo-fuzz || cargo install -q cargo-fuzz
# Targets that drive a later stage than the decoders name `required-features = ["stages"]` in
# fuzz/Cargo.toml; the rest build against inferscope-model and inferscope-decode alone.
needs_stages() {
  python3 -c 'import sys, tomllib
bins = tomllib.load(open("fuzz/Cargo.toml", "rb"))["bin"]
sys.exit(0 if any(b["name"] == sys.argv[1] and "stages" in b.get("required-features", []) for b in bins) else 1)' "$1"
}
for target in $(cargo +nightly fuzz list); do
  features=()
  needs_stages "$target" && features=(--features stages)
  echo "fuzzing $target for ${seconds}s ${features[*]}"
  # Committed seeds (fuzz/seeds/TARGET) start each run from valid inputs; new finds go to the
  # gitignored fuzz/corpus/TARGET.
  mkdir -p "fuzz/corpus/$target"
  seeds=()
  [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
  cargo +nightly fuzz run "${features[@]}" "$target" "fuzz/corpus/$target" "${seeds[@]}" -- -max_total_time="$seconds" -rss_limit_mb=2048
done
