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
