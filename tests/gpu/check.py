"""Checks what tests/gpu/run.sh collected (OUT_DIR/gpu.jsonl from `inferscope gpu`, and
OUT_DIR/runs.jsonl from the workloads) and prints the figures for BENCHMARKS.md.
Exit status 1 when a correctness check fails; the overhead ratio is reported, not enforced."""
import collections
import json
import statistics
import sys

out = sys.argv[1]
lines = [json.loads(l) for l in open(f"{out}/gpu.jsonl") if l.strip()]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl") if l.strip()]
kernels = collections.defaultdict(list)
for l in lines:
    if l.get("type") == "kernel":
        kernels[l["pid"]].append(l)
gpus = [l for l in lines if l.get("type") == "gpu"]
shims = [l for l in lines if l.get("type") == "shim"]
counters = next((l["counters"] for l in lines if l.get("type") == "counters"), {})

failures = []


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


injected = [r for r in runs if r["injected"]]
check(len(shims) == len(injected), f"{len(shims)} shims connected for {len(injected)} injected runs")
check(all(s["clock_source"] == "timestamp_callback" for s in shims),
      "clock: " + ", ".join(sorted({s["clock_source"] for s in shims})))
latencies = []
for r in injected:
    ks = kernels.get(r["pid"], [])
    check(len(ks) > 0, f"pid {r['pid']} ({r['mode']}): {len(ks)} kernel records")
    if not ks:
        continue
    graph = [k for k in ks if k["graph_id"] != 0]
    if r["mode"] == "graphs":
        nodes = {(k["graph_id"], k["graph_node_id"]) for k in graph}
        check(len(graph) > 0, f"pid {r['pid']}: {len(graph)} graph-node kernels, {len(nodes)} distinct nodes")
    joined = [k for k in ks if k["launch_mono_ns"] > 0]
    check(len(joined) >= 0.99 * len(ks), f"pid {r['pid']}: {len(joined)}/{len(ks)} joined with their launch call")
    bad = [k for k in joined if not (k["launch_mono_ns"] < k["start_mono_ns"] <= k["end_mono_ns"])]
    check(not bad, f"pid {r['pid']}: every kernel starts after its launch call ({len(bad)} do not)")
    # Kernels launched inside the timed decode loop must run inside it (both clocks are MONOTONIC).
    loop = [k for k in joined if r["loop_start_mono_ns"] <= k["launch_mono_ns"] <= r["loop_end_mono_ns"]]
    outside = [k for k in loop if not (r["loop_start_mono_ns"] <= k["start_mono_ns"] <= r["loop_end_mono_ns"])]
    check(len(loop) > 0 and not outside,
          f"pid {r['pid']}: {len(loop)} decode-loop kernels, {len(outside)} with GPU start outside the loop's host window")
    eager_lat = [k["start_mono_ns"] - k["launch_mono_ns"] for k in loop if k["graph_id"] == 0]
    latencies += eager_lat
    tc = sum(1 for k in ks if k["tensor_core"])
    print(f"     tensor-core kernels: {tc}/{len(ks)}; e.g. "
          + ", ".join(sorted({k['name'][:60] for k in ks if k['tensor_core']})[:3]))
if latencies:
    latencies.sort()
    p50 = latencies[len(latencies) // 2] / 1e3
    p99 = latencies[int(len(latencies) * 0.99)] / 1e3
    within = sum(1 for x in latencies if x < 5_000_000) / len(latencies)
    check(within >= 0.95, f"launch→GPU start: p50 {p50:.1f} µs, p99 {p99:.1f} µs, {within:.1%} within 5 ms")
gpm = [g for g in gpus if g.get("tensor_util_pct") is not None]
check(len(gpus) > 0, f"{len(gpus)} NVML samples")
check(len(gpm) > 0, f"{len(gpm)} samples with GPM metrics (tensor {max((g['tensor_util_pct'] for g in gpm), default=0):.1f}% max, "
      f"DRAM BW {max((g['dram_bw_util_pct'] or 0 for g in gpm), default=0):.1f}% max, "
      f"SM occupancy {max((g['sm_occupancy_pct'] or 0 for g in gpm), default=0):.1f}% max)")
print("counters:", json.dumps(counters))

for mode in ("eager", "graphs"):
    base = [r["decode_step_ns_median"] for r in runs if r["mode"] == mode and not r["injected"]]
    shim = [r["decode_step_ns_median"] for r in runs if r["mode"] == mode and r["injected"]]
    if base and shim:
        b, s = statistics.median(base), statistics.median(shim)
        print(f"decode step ({mode}): {b / 1e3:.1f} µs without, {s / 1e3:.1f} µs with the shim, "
              f"ratio {s / b:.3f} (goal ≤ 1.02)")
sys.exit(1 if failures else 0)
