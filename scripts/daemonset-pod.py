#!/usr/bin/env python3
"""The DaemonSet's pod as one node runs it, for `podman kube play`, taken mechanically from
what kustomize renders: the overlay, retargeted at IMAGE with kustomize's own `images:` (the
step users take), is rendered with kubectl; the DaemonSet's pod template becomes a Pod named
after the DaemonSet, next to the ConfigMap it reads. No other field is touched, except the one
podman refuses or passes on unresolved, which are resolved the way the kubelet resolves them:

  env valueFrom.fieldRef spec.nodeName   podman 4.3 refuses the pod ("not supported"); the
                                         kubelet puts the node's name there: NODE_NAME here.
  env value with $(VAR)                  podman 4.3 passes it on literally; the kubelet expands
                                         variables defined earlier in the list.

With API_URL, the env the kubelet adds for the API server (KUBERNETES_SERVICE_HOST/PORT) is
added as INFERSCOPE_KUBE_API=API_URL, for a plain-HTTP stand-in API server.

Fields podman 4.3 accepts but does not honour are kept as rendered and listed on stderr (the
test that plays the pod checks their effect another way).

    scripts/daemonset-pod.py OVERLAY IMAGE NODE_NAME [API_URL] > pod.yaml
    scripts/daemonset-pod.py --rbac OVERLAY   # the service account's RBAC rules, as JSON
"""
import json
import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_HONOURED = {
    "hostPID": "podman < 4.5 ignores it: the pod gets its own PID namespace",
    "readinessProbe": "podman runs only liveness probes (as health checks)",
    "livenessProbe": "podman 4.3 turns httpGet into `sh -c curl -f http://localhost:0/...` (the named port unresolved; the image has neither sh nor curl): the health check cannot pass",
    "serviceAccountName": "no API server: no token is mounted",
    "priorityClassName": "no scheduler",
    "tolerations": "no scheduler",
    "nodeSelector": "no scheduler",
}


def render(overlay, image):
    name, _, tag = image.rpartition(":")
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "target")) as tmp:
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(os.path.join(ROOT, overlay), tmp)],
                    "images": [{"name": "inferscope", "newName": name, "newTag": tag}],
                },
                f,
            )
        rendered = subprocess.run(
            [os.path.join(ROOT, ".venv/bin/kubectl"), "kustomize", tmp],
            check=True, capture_output=True, text=True,
        ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def rbac(overlay):
    """The rules bound to the DaemonSet's service account, as JSON, for the stand-in API."""
    docs = render(overlay, "inferscope:rbac")
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = daemonset["metadata"]["namespace"]
    rules = []
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if not any(s.get("kind") == "ServiceAccount" and s["name"] == account
                   and s.get("namespace", namespace) == namespace for s in binding["subjects"]):
            continue
        role = next(d for d in docs if d["kind"] == binding["roleRef"]["kind"]
                    and d["metadata"]["name"] == binding["roleRef"]["name"])
        rules.extend(role["rules"])
    json.dump({"serviceAccount": f"{namespace}/{account}", "rules": rules}, sys.stdout)


def main():
    if sys.argv[1] == "--rbac":
        rbac(sys.argv[2])
        return
    overlay, image, node = sys.argv[1:4]
    api = sys.argv[4] if len(sys.argv) > 4 else None
    docs = render(overlay, image)
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    template = daemonset["spec"]["template"]
    spec = template["spec"]
    config_names = {v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
    configmaps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] in config_names]
    for container in spec.get("initContainers", []) + spec["containers"]:
        for env in container.get("env", []):
            field = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field == "spec.nodeName":
                del env["valueFrom"]
                env["value"] = node
                print(f"daemonset-pod: {container['name']}: env {env['name']}: fieldRef spec.nodeName resolved to {node!r} (the kubelet's value)", file=sys.stderr)
            elif field is not None:
                sys.exit(f"daemonset-pod: {container['name']}: env {env['name']}: fieldRef {field} is not resolved here")
        # $(VAR) references to variables defined earlier: podman 4.3 passes them on literally.
        defined = {}
        for env in container.get("env", []):
            if "value" in env:
                value = env["value"]
                for var, resolved in defined.items():
                    value = value.replace(f"$({var})", resolved)
                if value != env["value"]:
                    print(f"daemonset-pod: {container['name']}: env {env['name']}: $(...) expanded to {value!r} (as the kubelet does)", file=sys.stderr)
                    env["value"] = value
                defined[env["name"]] = value
        if api and container in spec["containers"]:
            # What the kubelet adds to every container (KUBERNETES_SERVICE_HOST/PORT, https):
            # here the test's plain-HTTP stand-in for the API server.
            container.setdefault("env", []).append({"name": "INFERSCOPE_KUBE_API", "value": api})
            print(f"daemonset-pod: {container['name']}: env INFERSCOPE_KUBE_API={api} added (the kubelet's KUBERNETES_SERVICE_HOST/PORT, for a stand-in API server)", file=sys.stderr)
        for key in ("readinessProbe", "livenessProbe"):
            if key in container:
                print(f"daemonset-pod: {container['name']}: {key}: {NOT_HONOURED[key]}", file=sys.stderr)
    for key, why in NOT_HONOURED.items():
        if key in spec:
            print(f"daemonset-pod: {key}: {why}", file=sys.stderr)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": daemonset["metadata"]["name"],
            "namespace": daemonset["metadata"]["namespace"],
            "labels": template["metadata"].get("labels", {}),
            "annotations": template["metadata"].get("annotations", {}),
        },
        "spec": spec,
    }
    yaml.safe_dump_all(configmaps + [pod], sys.stdout)


if __name__ == "__main__":
    main()
