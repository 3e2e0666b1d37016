#!/usr/bin/env bash
# Renders every kustomize overlay and example under deploy/ the way users apply them and
# validates the result against the Kubernetes schemas (offline), plus the standalone examples.
set -euo pipefail
cd "$(dirname "$0")/.."
# kubectl 1.37 from .venv (scripts/setup.sh); a system kubectl of 1.21 or later works too.
kubectl=kubectl
[ -x .venv/bin/kubectl ] && kubectl=.venv/bin/kubectl
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for dir in deploy/base deploy/overlays/* deploy/examples/*; do
  name=$(echo "$dir" | tr / -)
  "$kubectl" kustomize "$dir" >"$out/$name.yaml"
  .venv/bin/kubernetes-validate --strict --quiet "$out/$name.yaml"
  echo "check-manifests: $dir renders and validates ($(grep -c '^kind:' "$out/$name.yaml") objects)"
done
.venv/bin/kubernetes-validate --strict --quiet deploy/otel-collector.yaml
# The README's install step 2, on a copy: the images: block points the DaemonSet (and the gpu
# overlay's init container) at the pushed image.
copy="$out/deploy"
cp -r deploy "$copy"
for overlay in minimal gpu; do
  cat >>"$copy/overlays/$overlay/kustomization.yaml" <<'YAML'
images:
  - name: inferscope
    newName: registry.example.com/inferscope
    newTag: 0.1.0
YAML
  rendered=$("$kubectl" kustomize "$copy/overlays/$overlay")
  if echo "$rendered" | grep 'image:' | grep -qv 'registry.example.com/inferscope:0.1.0'; then
    echo "check-manifests: overlays/$overlay still names an image other than the pushed one" >&2
    exit 1
  fi
done
echo "check-manifests: the README's images: step retargets every inferscope image"
# The Helm chart (deploy/helm/inferscope), rendered and linted by Helm's own engine, renders the
# same objects as each overlay.
.venv/bin/python3 scripts/check-chart.py
