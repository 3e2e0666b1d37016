#!/usr/bin/env python3
"""Renders deploy/helm/inferscope with Helm's own engine and holds it equal to kustomize.

Helm comes from PyPI's helm-python-sdk: Helm v4's Go packages (helm.sh/helm/v4, chart loader,
template engine, lint) compiled into one shared library, called through ctypes; no helm binary
and no cluster. For each kustomize overlay, the chart is rendered with the values that mean the
same settings, and every object the overlay renders must come out of the chart equal, field for
field, except what only Helm adds: its bookkeeping labels (helm.sh/chart, managed-by, version)
and the pod template's checksum/config annotation (a changed config rolls the agents).
The chart is also linted (strict: warnings fail) under each set of values, and every object it
renders is validated against the Kubernetes schemas.

    .venv/bin/python scripts/check-chart.py          # scripts/check-manifests.sh runs it
"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import tomllib

import helm_python
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "deploy/helm/inferscope")
KUBECTL = os.path.join(ROOT, ".venv/bin/kubectl")
VALIDATE = os.path.join(ROOT, ".venv/bin/kubernetes-validate")
RELEASE = "inferscope"
NAMESPACE = "inferscope"

# Each overlay and the values that select the same settings (the rest are the chart's defaults).
CASES = {
    "minimal": {"namespace": {"create": True}},
    "privileged": {"namespace": {"create": True}, "profile": "privileged"},
    "gpu": {
        "namespace": {"create": True},
        "shim": {"enabled": True},
        "nodeSelector": {"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"},
    },
}
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version")


def fail(msg):
    print(f"check-chart: {msg}", file=sys.stderr)
    sys.exit(1)


def kustomize(overlay):
    out = subprocess.run(
        [KUBECTL, "kustomize", os.path.join(ROOT, "deploy/overlays", overlay)],
        check=True, capture_output=True, text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def helm(values):
    chart = helm_python.Chart.load(CHART)
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def normalise(doc):
    """What both must agree on: Helm's own bookkeeping removed, the config file parsed."""
    doc = copy.deepcopy(doc)
    labels = doc.get("metadata", {}).get("labels", {})
    for key in HELM_ONLY_LABELS:
        labels.pop(key, None)
    template = doc.get("spec", {}).get("template", {}).get("metadata", {})
    template.get("annotations", {}).pop("checksum/config", None)
    if doc.get("kind") == "ConfigMap" and "inferscope.toml" in doc.get("data", {}):
        doc["data"]["inferscope.toml"] = tomllib.loads(doc["data"]["inferscope.toml"])
    return doc


def key(doc):
    return (doc["kind"], doc["metadata"]["name"])


def first_difference(a, b, path=""):
    if type(a) is not type(b):
        return f"{path}: {json.dumps(a)} (kustomize) vs {json.dumps(b)} (helm)"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                side = "helm" if k not in a else "kustomize"
                return f"{path}.{k}: only in {side}: {json.dumps(a.get(k, b.get(k)))}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items (kustomize) vs {len(b)} (helm)"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {json.dumps(a)} (kustomize) vs {json.dumps(b)} (helm)"


def lint(values, label):
    report = helm_python.lint(CHART, values, strict=True, namespace=NAMESPACE)
    # Severity 1 is information (e.g. "icon is recommended"); warnings and errors fail.
    bad = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    if bad or report.get("errors"):
        fail(f"helm lint ({label}): {json.dumps(bad + report.get('errors', []), indent=1)}")


def validate(docs, label):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(docs, f)
        f.flush()
        subprocess.run([VALIDATE, "--strict", "--quiet", f.name], check=True)
    print(f"check-chart: {label}: {len(docs)} objects render and validate")


def main():
    print(f"check-chart: Helm {helm_python.helm_sdk_version()} (helm-python-sdk {helm_python.helm_c_version()})")
    for overlay, values in CASES.items():
        lint(values, overlay)
        ours = {key(d): normalise(d) for d in kustomize(overlay)}
        theirs = {key(d): normalise(d) for d in helm(values)}
        if set(ours) != set(theirs):
            fail(f"{overlay}: kustomize renders {sorted(ours)}, the chart {sorted(theirs)}")
        for k in ours:
            diff = first_difference(ours[k], theirs[k])
            if diff:
                fail(f"{overlay}: {k[0]}/{k[1]} differs at {diff}")
        print(f"check-chart: overlays/{overlay} and the chart with {json.dumps(values)} render the same {len(ours)} objects")

    # Values with no overlay: they render, lint and validate (the ServiceMonitor is a CRD the
    # offline schemas do not know: checked for its shape only).
    extras = {
        "otlp-off, prometheus-off": {"otlp": {"endpoint": ""}, "prometheus": {"enabled": False}},
        "service-monitor, patterns, port": {
            "prometheus": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
            "engines": {"patterns": ["my-llm-server"], "port": 8000},
            "extraConfig": 'nvml-interval = "1s"\n',
        },
    }
    for label, values in extras.items():
        lint(values, label)
        docs = helm(values)
        monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
        validate([d for d in docs if d["kind"] != "ServiceMonitor"], label)
        config = next(d for d in docs if d["kind"] == "ConfigMap")
        settings = tomllib.loads(config["data"]["inferscope.toml"])
        if label.startswith("otlp-off"):
            assert settings["otlp-endpoint"] == "off" and settings["prometheus"] == "off", settings
            daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
            agent = daemonset["spec"]["template"]["spec"]["containers"][0]
            assert "ports" not in agent and "readinessProbe" not in agent and "livenessProbe" not in agent, agent
        else:
            assert settings["patterns"] == ["my-llm-server"] and settings["port"] == 8000, settings
            assert settings["nvml-interval"] == "1s", settings
            assert len(monitors) == 1, [d["kind"] for d in docs]
            assert monitors[0]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
            assert any(d["kind"] == "Service" for d in docs)

    # A profile the chart does not know is refused, not rendered as something else.
    try:
        helm({"profile": "root"})
    except helm_python.HelmError as e:
        if "profile must be minimal or privileged" not in str(e):
            fail(f"an unknown profile failed for another reason: {e}")
    else:
        fail("the chart rendered an unknown profile")
    print("check-chart: the chart lints clean and renders what kustomize renders")


if __name__ == "__main__":
    main()
