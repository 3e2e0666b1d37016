#!/usr/bin/env bash
# Builds llama.cpp's standalone `llama-server` (CPU only) from the llama.cpp source vendored in the
# xllamacpp sdist of exactly the version scripts/setup.sh pins: the same source as the library the
# other tests load, so symbols compare. Shared libraries, as distro packages ship it.
#
# Output (a cache: a second run with all three present does nothing), each with RUNPATH $ORIGIN:
#   target/llama-server/                  as built: a small llama-server executable, the server in
#                                         libllama-server-impl.so, libllama.so, libggml*.so, ...
#   target/llama-server/stripped/         what a distro package looks like: the server linked into
#                                         the executable (as llama.cpp shipped it before the
#                                         libllama-server-impl split) and everything
#                                         `strip --strip-all`ed: the server's C++ functions are
#                                         gone, the libraries' exported C API (llama_decode) stays
#   target/llama-server/stripped-shared/  the as-built layout stripped: libllama-server-impl.so
#                                         still exports the server's functions in .dynsym
# OUT=DIR overrides the output directory. KEEP_BUILD=1 keeps the source and build tree.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1mbuild-llama-server:\033[0m %s\n' "$*" >&2; }

version=$(grep -o 'xllamacpp==[0-9.]*' scripts/setup.sh | head -n1 | cut -d= -f3)
[ -n "$version" ] || { log "no xllamacpp==VERSION pin in scripts/setup.sh"; exit 1; }
out=${OUT:-$PWD/target/llama-server}
stamp="$out/BUILT_FROM"
# Portable code, not -march=native: a VM may advertise instructions its hypervisor does not let
# a process run (AMX tiles here: ggml's AMX kernels died of SIGILL at the first matrix product),
# and a CI machine need not have this one's CPU. AVX2/FMA/F16C is what every x86-64 CI host has.
isa="x86-64 + AVX2/FMA/F16C/BMI2"
portable="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
built_from="xllamacpp-$version ($isa)"

if [ -x "$out/llama-server" ] && [ -x "$out/stripped/llama-server" ] \
   && [ -x "$out/stripped-shared/llama-server" ] \
   && [ "$(cat "$stamp" 2>/dev/null)" = "$built_from" ]; then
  log "up to date: $out (llama.cpp from xllamacpp $version)"
  exit 0
fi

for tool in cmake curl python3 strip; do
  command -v "$tool" >/dev/null || { log "$tool missing (run scripts/setup.sh)"; exit 1; }
done

start=$(date +%s)
work="$out/.work"
rm -rf "$work" "$out/stripped" "$out/stripped-shared"
mkdir -p "$work"

# --- Source: the sdist from PyPI. `pip download --no-binary` would build its metadata (Cython);
# the simple index gives the file's URL and hash directly.
sdist="xllamacpp-$version.tar.gz"
log "fetching $sdist from PyPI"
read -r url sha < <(curl -sSf -H 'Accept: application/vnd.pypi.simple.v1+json' \
    https://pypi.org/simple/xllamacpp/ \
  | python3 -c '
import json, sys
name = sys.argv[1]
for f in json.load(sys.stdin)["files"]:
    if f["filename"] == name:
        print(f["url"], f["hashes"]["sha256"])
        break
else:
    sys.exit(f"{name} not on PyPI")
' "$sdist")
curl -sSfL -o "$work/$sdist" "$url"
echo "$sha  $work/$sdist" | sha256sum -c --quiet -
tar -xzf "$work/$sdist" -C "$work" "xllamacpp-$version/thirdparty/llama.cpp"
rm "$work/$sdist"
src="$work/xllamacpp-$version/thirdparty/llama.cpp"
[ -f "$src/tools/server/server-queue.cpp" ] || { log "the sdist carries no tools/server"; exit 1; }

# --- Build: only the llama-server target. UI assets off (they would come from Hugging Face or
# npm; the server then serves no web page, which the API does not need). No OpenSSL: plain HTTP.
# LLAMA_CURL is gone from this llama.cpp (deprecated option; downloads use cpp-httplib).
# ccache, when installed, is picked up by ggml (GGML_CCACHE) and makes a rebuild take seconds.
log "configuring (llama.cpp from xllamacpp $version, Release, shared libraries, CPU: $isa)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_NUMBER=0 $portable >"$work/configure.log" 2>&1 \
  || { tail -n 40 "$work/configure.log" >&2; exit 1; }
log "building llama-server with $(nproc) jobs"
cmake --build "$work/build" --target llama-server -j"$(nproc)" >"$work/build.log" 2>&1 \
  || { tail -n 60 "$work/build.log" >&2; exit 1; }

# --- Install: the executable and every shared library it loads from the build tree.
bin="$work/build/bin"
mkdir -p "$out"
rm -f "$out"/llama-server "$out"/lib*.so*
cp -a "$bin/llama-server" "$bin"/lib*.so* "$out/"
mkdir -p "$out/stripped-shared"
cp -a "$out/llama-server" "$out"/lib*.so* "$out/stripped-shared/"

# The distro layout: the same objects, but the server (main.cpp + llama-server-impl's objects +
# the server-context archive) linked into the executable, next to the shared libllama/ggml.
# An executable exports only what shared libraries reference, so stripping it removes the server.
mkdir -p "$out/stripped"
server="$work/build/tools/server"
c++ -O3 -DNDEBUG -o "$out/stripped/llama-server" \
  "$server/CMakeFiles/llama-server.dir/main.cpp.o" \
  "$server"/CMakeFiles/llama-server-impl.dir/{server,server-http,server-models}.cpp.o \
  -Wl,-rpath,'$ORIGIN' "$server/libserver-context.a" "$work/build/tools/ui/libllama-ui.a" \
  "$work/build/vendor/cpp-httplib/libcpp-httplib.a" "$work/build/common/libllama-common-base.a" \
  -L"$bin" -lllama-common -lmtmd -lllama -lggml -lggml-cpu -lggml-base -pthread
cp -a "$out"/lib*.so* "$out/stripped/"
rm "$out"/stripped/libllama-server-impl.so
for f in "$out"/stripped*/llama-server "$out"/stripped*/lib*.so*; do
  [ -L "$f" ] || strip --strip-all "$f"
done
if nm -D --defined-only -C "$out/stripped/llama-server" | grep 'server_queue::' >/dev/null; then
  log "the stripped executable still exports the server's functions"
  exit 1
fi
# Every copy must start from where it is, each with its own libraries.
for dir in "$out" "$out/stripped" "$out/stripped-shared"; do
  if ldd "$dir/llama-server" | grep -q 'not found'; then
    ldd "$dir/llama-server" >&2
    log "$dir/llama-server misses libraries"
    exit 1
  fi
done
[ "${KEEP_BUILD:-0}" = 1 ] || rm -rf "$work"
echo "$built_from" >"$stamp"
log "built $out/llama-server, $out/stripped/ and $out/stripped-shared/ in $(( $(date +%s) - start )) s"
