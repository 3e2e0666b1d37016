#!/usr/bin/env bash
# Builds the inferscope container image from scratch layers (no base image, nothing pulled): the
# release agent, the shared libraries it links (from ldd), the CUPTI shim and the CA
# certificates. No shell, no package manager; the agent runs from a read-only root filesystem.
#
#   scripts/build-image.sh [NAME:TAG]        # default inferscope:<workspace version>
#   INFERSCOPE_SKIP_BUILD=1 scripts/build-image.sh   # reuse target/release as built
#
# The image lands in the local containers storage (podman/buildah). To push it:
#   podman tag inferscope:0.1.0 registry.example.com/inferscope:0.1.0
#   podman push registry.example.com/inferscope:0.1.0
# or write an archive for `docker load` / `ctr images import` on an air-gapped node:
#   podman save --format docker-archive -o inferscope.tar inferscope:0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image=${1:-inferscope:$version}
start=$(date +%s)

if [ -z "${INFERSCOPE_SKIP_BUILD:-}" ]; then
  cargo build --release -p inferscope -p inferscope-cupti
fi
agent=target/release/inferscope
shim=target/release/libinferscope_cupti.so
for f in "$agent" "$shim"; do
  [ -f "$f" ] || { echo "build-image: $f is missing (cargo build --release -p inferscope -p inferscope-cupti)" >&2; exit 1; }
done

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
install -D -m 0755 "$agent" "$rootfs/usr/bin/inferscope"
strip --strip-debug "$rootfs/usr/bin/inferscope" 2>/dev/null || true
install -D -m 0644 "$shim" "$rootfs/usr/lib/inferscope/libinferscope_cupti.so"

# Every library the two link, at the path the loader looks for it (the shim's CUDA libraries
# are not linked: it loads them from the engine's process at run time).
copy_libs() {
  ldd "$1" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' | while read -r lib; do
    [ -e "$rootfs$lib" ] && continue
    install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
  done
}
copy_libs "$agent"
copy_libs "$shim"
# OTLP and gRPC over TLS verify against the system's roots as well as the built-in ones.
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
# Mount points: the config, the shared socket directory, the shim's host path, a scratch dir.
mkdir -p "$rootfs/etc/inferscope" "$rootfs/run/inferscope" "$rootfs/opt/inferscope" "$rootfs/tmp" \
  "$rootfs/sys" "$rootfs/proc"
chmod 1777 "$rootfs/tmp"
printf 'root:x:0:0:root:/:/usr/bin/inferscope\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"

ctr=$(buildah from scratch)
trap 'rm -rf "$rootfs"; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah copy --quiet "$ctr" "$rootfs" / >/dev/null
buildah config \
  --entrypoint '["/usr/bin/inferscope"]' \
  --cmd '["run"]' \
  --env INFERSCOPE_LOG=info \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --label org.opencontainers.image.title=inferscope \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.description="Profiles LLM inference servers from outside" \
  --port 9464/tcp \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$image" >/dev/null
trap 'rm -rf "$rootfs"' EXIT

size=$(podman image inspect "$image" --format '{{.Size}}')
echo "build-image: $image, $((size / 1024 / 1024)) MiB, $(($(date +%s) - start)) s"
