#!/usr/bin/env bash
# One command for a newcomer: install what is needed, build, and run `inferscope demo` on the
# bundled llama.cpp engine. Extra arguments go to `inferscope demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p inferscope
exec ./target/release/inferscope demo --python .venv/bin/python3 "$@"
