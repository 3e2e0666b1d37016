"""Prints the one table of tests/gpu/launches.sh from OUT_DIR: per run (no agent, launch uprobes,
uprobes + CUPTI shim) throughput, and launches, graphs and kernels per step, the named share,
the host time before a step's first launch, uprobe vs shim counts, NVML/GPM figures, and the
kernel timeline of three requests. Exit 1 when the uprobe run saw no launch joined to a step."""
import collections
import json
import os
import statistics
import sys

out = sys.argv[1]


def lines(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]


runs = {r["run"]: r for r in lines("runs.jsonl")}


def tput(name):
    r = runs.get(name)
    return r["tokens"] / (r["wall_ns"] / 1e9) if r else float("nan")


rows = []
failures = []
for name in ("uprobe", "shim"):
    launches = lines(f"{name}-launches.jsonl")
    steps = [s for s in lines(f"{name}-steps.jsonl") if s.get("gpu_launches")]
    g = [s["gpu_launches"] for s in steps]
    kernels = sum(l["stands_for"] for l in launches if l["kind"] == "kernel")
    named = sum(l["stands_for"] for l in launches if l["kind"] == "kernel" and l["named"])
    graphs = sum(l["stands_for"] for l in launches if l["kind"] == "graph")
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")
    rows.append((f"{name}: steps with launches", len(steps)))
    rows.append((f"{name}: kernel launches / step", round(mean([x["kernel_launches"] for x in g]), 1)))
    rows.append((f"{name}: graph launches / step", round(mean([x["graph_launches"] for x in g]), 1)))
    rows.append((f"{name}: distinct kernels", len({l["name"] for l in launches if l["kind"] == "kernel"})))
    rows.append((f"{name}: named share of kernel launches", f"{named / kernels:.1%}" if kernels else "-"))
    rows.append((f"{name}: step share before the first launch", f"{mean([x['before_first_launch_share'] for x in g]):.1%}"))
    rows.append((f"{name}: uprobe launches (kernels + graphs)", kernels + graphs))
    if name == "uprobe" and not steps:
        failures.append("no launch joined to a step in the uprobe run")
shim = lines("shim-gpu.jsonl")
shim_kernels = [l for l in shim if l.get("type") == "kernel"]
rows.append(("shim: device kernel records", len(shim_kernels)))
rows.append(("shim: graph-node kernels", sum(1 for k in shim_kernels if k.get("graph_id"))))
gpu = [l for l in shim if l.get("type") == "gpu"]
for key in ("tensor_util_pct", "dram_bw_util_pct", "sm_occupancy_pct", "gpu_util_pct"):
    vals = [l[key] for l in gpu if l.get(key) is not None]
    rows.append((f"NVML/GPM {key} (mean, max)", f"{statistics.mean(vals):.1f}, {max(vals):.1f}" if vals else "not reported"))
base = tput("baseline")
for name in ("baseline", "uprobe", "shim"):
    rows.append((f"throughput {name} (tokens/s)", f"{tput(name):.0f} ({tput(name) / base - 1:+.1%})" if base == base else "-"))

width = max(len(k) for k, _ in rows)
print(f"| {'what'.ljust(width)} | value |")
print(f"| {'-' * width} | --- |")
for k, v in rows:
    print(f"| {k.ljust(width)} | {v} |")

print("\nkernel timeline of three requests (uprobe run, steps in order):")
by_request = collections.defaultdict(list)
for s in lines("uprobe-steps.jsonl"):
    for m in s.get("requests", []):
        by_request[m["request_id"]].append(s)
for rid in list(by_request)[:3]:
    print(f"  request {rid}:")
    for s in by_request[rid][:8]:
        g = s.get("gpu_launches") or {}
        top = ", ".join(f"{c['name'][:40]}x{c['launches']}" for c in (g.get("kernels", [])[:3] + g.get("graphs", [])[:2]))
        print(f"    +{(s['start_mono_ns'] - by_request[rid][0]['start_mono_ns']) / 1e6:8.2f} ms  {s['duration_ms']:6.2f} ms  "
              f"{g.get('kernel_launches', 0)} kernels {g.get('graph_launches', 0)} graphs  {top}")
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
