#!/usr/bin/env bash
# Builds the eBPF programs from the sources here and ships them in ebpf/prebuilt, where a build
# without the eBPF toolchain (bpf-linker, the core library's source) takes them: a newcomer's
# first `scripts/demo.sh` then compiles no LLVM and no bpf-linker.
#
#   scripts/ebpf-prebuilt.sh           rebuild ebpf/prebuilt/*.bpf.o and ebpf/prebuilt/MANIFEST
#   scripts/ebpf-prebuilt.sh --check   build afresh and fail unless ebpf/prebuilt is byte-identical
#                                      (CI: scripts/test.sh)
#   scripts/ebpf-prebuilt.sh --matches exit 0 when ebpf/prebuilt was built from the sources here,
#                                      as agent/build/prebuilt.rs checks (no toolchain needed:
#                                      scripts/setup.sh and scripts/demo.sh ask)
#
# The objects come from the agent's own build script (INFERSCOPE_EBPF=build, `cargo check`), so
# they are byte for byte what a build from source embeds; the build trims paths (cargo's
# trim-paths), which makes them the same from any checkout directory, user and target
# directory. The manifest lists the sha256 of every file under ebpf/common and ebpf/probes, the
# crates the programs are compiled from (as Cargo.lock has them) and the objects; agent/build.rs
# refuses the objects when a source differs from it.
#
# Needs the eBPF toolchain: scripts/setup.sh ebpf.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

# Whether ebpf/prebuilt's objects were built from the eBPF sources in this checkout: the same
# check as agent/build/prebuilt.rs (every file listed in ebpf/prebuilt/MANIFEST unchanged, no
# source file added, every crate at the version listed).
prebuilt_matches() {
  local manifest=ebpf/prebuilt/MANIFEST name version
  [ -f "$manifest" ] || return 1
  grep -E '^[0-9a-f]{64}  ' "$manifest" | sha256sum --check --status 2>/dev/null || return 1
  diff -q <(source_files) \
    <(grep -E '^[0-9a-f]{64}  ebpf/(common|probes)/' "$manifest" | cut -c67- | LC_ALL=C sort) \
    >/dev/null || return 1
  while read -r _ name version; do
    grep -A1 -Fx "name = \"$name\"" Cargo.lock | grep -qFx "version = \"$version\"" || return 1
  done < <(grep '^crate ' "$manifest")
}
# Every file the programs are built from (agent/build/prebuilt.rs walks the same: no `target`
# directory, no dot-file).
source_files() {
  find ebpf/common ebpf/probes \( -name target -o -name '.*' \) -prune -o -type f -print |
    LC_ALL=C sort
}

check=0
case "${1:-}" in
  --check) check=1 ;;
  --matches) prebuilt_matches && exit 0 || exit 1 ;;
  "") ;;
  *)
    echo "usage: scripts/ebpf-prebuilt.sh [--check | --matches]" >&2
    exit 2
    ;;
esac

if ! command -v bpf-linker >/dev/null; then
  echo "ebpf-prebuilt.sh: bpf-linker is not on PATH: install the eBPF toolchain with" \
    "scripts/setup.sh ebpf" >&2
  exit 1
fi
toolchain=${INFERSCOPE_BPF_TOOLCHAIN:-bpf}

# The agent's build script compiles both builds into its OUT_DIR; cargo names that directory in
# its build-script-executed message.
echo "ebpf-prebuilt: building the eBPF programs (INFERSCOPE_EBPF=build cargo check -p inferscope)" >&2
out_dir=$(INFERSCOPE_EBPF=build cargo check -q -p inferscope --message-format=json |
  python3 -c '
import json, sys
dirs = [m["out_dir"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "build-script-executed" and "/agent#inferscope@" in m["package_id"]]
if len(dirs) != 1:
    sys.exit(f"expected one build-script-executed message for the agent, got {len(dirs)}")
print(dirs[0])
')
built=("$out_dir/inferscope" "$out_dir/legacy/inferscope")
shipped=(ebpf/prebuilt/inferscope.bpf.o ebpf/prebuilt/inferscope-legacy.bpf.o)

# The manifest for these sources and objects (agent/build/prebuilt.rs reads it).
manifest() {
  echo "# The sources ebpf/prebuilt's objects were built from, and the objects: written by"
  echo "# scripts/ebpf-prebuilt.sh (do not edit). sha256sum's format; crate lines: Cargo.lock."
  echo "# toolchain: $(rustup run "$toolchain" rustc --version); $(bpf-linker --version)"
  source_files | xargs sha256sum
  cargo tree -q --offline -p inferscope-ebpf --target bpfel-unknown-none -e normal --prefix none \
    -f '{p}' | grep -v ' (/' | sed -e 's/ (proc-macro)//' -e 's/ (\*)$//' -e 's/ v/ /' |
    LC_ALL=C sort -u | sed 's/^/crate /'
  local i
  for i in 0 1; do
    echo "$(sha256sum <"${built[$i]}" | cut -d' ' -f1)  ${shipped[$i]}"
  done
}
new_manifest=$(manifest)

if ((check)); then
  failed=0
  for i in 0 1; do
    if ! cmp -s "${built[$i]}" "${shipped[$i]}"; then
      echo "ebpf-prebuilt: ${shipped[$i]} differs from a fresh build (${built[$i]})" >&2
      failed=1
    fi
  done
  if ! diff -u ebpf/prebuilt/MANIFEST <(echo "$new_manifest") >&2; then
    echo "ebpf-prebuilt: ebpf/prebuilt/MANIFEST differs from the sources (diff above)" >&2
    failed=1
  fi
  if ((failed)); then
    echo "ebpf-prebuilt: ebpf/prebuilt is stale: run scripts/ebpf-prebuilt.sh and commit" \
      "ebpf/prebuilt" >&2
    exit 1
  fi
  echo "ebpf-prebuilt: ebpf/prebuilt matches a fresh build ($(wc -c <"${shipped[0]}") and" \
    "$(wc -c <"${shipped[1]}") bytes)" >&2
else
  for i in 0 1; do
    cp "${built[$i]}" "${shipped[$i]}"
  done
  echo "$new_manifest" >ebpf/prebuilt/MANIFEST
  echo "ebpf-prebuilt: wrote ${shipped[*]} and ebpf/prebuilt/MANIFEST" >&2
fi
