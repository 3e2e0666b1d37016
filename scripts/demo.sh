#!/usr/bin/env bash
# One command for a newcomer: install what is needed, build, and run `inferscope demo` on the
# bundled llama.cpp engine. Extra arguments go to `inferscope demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh demo
export PATH="$HOME/.cargo/bin:$PATH"
if [ ! -x target/release/inferscope ]; then
  echo "building inferscope (first time: several minutes on a small machine; cargo shows progress)"
fi
# Not -q: a first build takes minutes, and cargo's progress says it is working.
cargo build --release -p inferscope
exec ./target/release/inferscope demo --python .venv/bin/python3 "$@"
