#!/usr/bin/env python3
"""Benchmarks on the real engine (root): kernel-side cost per captured syscall (bpf_stats), the
agent's CPU time and peak RSS per 1,000 requests, and engine throughput with the agent attached
divided by without it, over alternating A/B pairs. Results go to stdout as Markdown rows.

Two throughput ratios per pair: wall-clock (the fixed load's duration) and engine time (the sum
of the engine's own `timings.prompt_ms + predicted_ms` over the load's requests, which the
uprobes on its scheduler thread lengthen directly and client-side jitter does not).
With --pin, the engine runs on the last CPU and the client and agent on the others.

    python3 scripts/bench.py --pairs 10 --requests 8
"""
import argparse, json, os, random, socket, statistics, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv/bin/python3")
BIN = os.environ.get("INFERSCOPE_BIN", os.path.join(ROOT, "target/release/inferscope"))


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def wait_ready(port):
    for _ in range(600):
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=2)
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if c.recv(100).startswith(b"HTTP/1.1 200"):
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("engine not ready")


def stream(port, prompt, max_tokens):
    # The same work every time a prompt is sent: greedy sampling, exactly max_tokens tokens, and
    # no reuse of a slot's cached prefix.
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "stream": True,
                       "max_tokens": max_tokens, "stream_options": {"include_usage": True},
                       "temperature": 0, "ignore_eos": True, "cache_prompt": False})
    c = socket.create_connection(("127.0.0.1", port), timeout=120)
    c.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        d = c.recv(65536)
        if not d:
            break
        data += d
    c.close()
    # The engine's own prefill + decode time, from the final chunk's timings.
    engine_ms = 0.0
    for line in data.split(b"\n"):
        if line.startswith(b"data: {") and b'"timings"' in line:
            try:
                t = json.loads(line[6:])["timings"]
                engine_ms = t.get("prompt_ms", 0.0) + t.get("predicted_ms", 0.0)
            except (ValueError, KeyError):
                pass
    return engine_ms


def load(port, requests, concurrency, max_tokens, tag):
    """Wall time of a fixed load (`requests` streams, `concurrency` at a time) and the engine's
    own time for it (s)."""
    todo = list(range(requests)); lock = threading.Lock(); engine_ms = []
    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            ms = stream(port, f"({tag}-{i}) Describe a city in two sentences.", max_tokens)
            with lock:
                engine_ms.append(ms)
    t0 = time.monotonic()
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    [t.start() for t in ts]; [t.join() for t in ts]
    return time.monotonic() - t0, sum(engine_ms) / 1000


def proc_cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def proc_hwm_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def start_agent(port, out, cpus=None):
    pin = ["taskset", "-c", cpus] if cpus else []
    p = subprocess.Popen(pin + [BIN, "record", "--port", str(port), "--out", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        # The agent's own line, once every probe is in place ("scheduler hook attached" lines
        # come before the last hook is).
        if ": attached pid=" in line:
            break
    threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
    return p


def bpf_prog_stats():
    progs = json.loads(subprocess.check_output(["bpftool", "prog", "show", "--json"]))
    return {p["name"]: (p.get("run_time_ns", 0), p.get("run_cnt", 0)) for p in progs
            if p.get("name", "").startswith(("enter_", "exit_", "tcp_probe", "llamacpp_"))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--pin", action="store_true",
                    help="engine on the last CPU, client and agent on the others")
    ap.add_argument("--skip-cost", action="store_true", help="only the throughput pairs")
    ap.add_argument("--baseline", action="store_true",
                    help="a third variant per round: the bpftrace baseline (scripts/bench/baseline.bt)")
    args = ap.parse_args()
    port = free_port()
    ncpu = os.cpu_count() or 1
    engine_pin = ["taskset", "-c", str(ncpu - 1)] if args.pin and ncpu > 1 else []
    others = f"0-{ncpu - 2}" if args.pin and ncpu > 1 else None
    if others:
        os.sched_setaffinity(0, set(range(ncpu - 1)))
    engine = subprocess.Popen(engine_pin + [PY, os.path.join(ROOT, "tests/engine/llamacpp_server.py"),
                               "--port", str(port), "--slots", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port)
        load(port, 2, 2, 8, "warm")
        if args.skip_cost:
            run_pairs(args, port, others, engine.pid)
            return
        # Kernel cost and agent cost, with bpf_stats on.
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"], check=True)
        agent = start_agent(port, "/tmp/inferscope-bench.jsonl")
        cpu0 = proc_cpu_s(agent.pid)
        n = 40
        load(port, n, args.concurrency, args.max_tokens, "cost")
        time.sleep(0.5)
        stats = bpf_prog_stats()
        cpu = proc_cpu_s(agent.pid) - cpu0
        hwm = proc_hwm_kb(agent.pid)
        agent.send_signal(2); agent.wait()
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"], check=True)
        print("| program | invocations | ns per invocation |\n| --- | --- | --- |")
        for name, (ns, cnt) in sorted(stats.items()):
            if cnt:
                print(f"| {name} | {cnt} | {ns / cnt:.0f} |")
        print(f"\nagent CPU: {cpu:.3f} s for {n} requests ({cpu / n * 1000:.2f} s per 1,000 requests); peak RSS {hwm / 1024:.1f} MiB")
        run_pairs(args, port, others, engine.pid)
    finally:
        engine.terminate(); engine.wait()


def summary(name, ratios):
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    mean = statistics.fmean(ratios)
    sem = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
    print(f"{name} ratio (traced / untraced): median {statistics.median(ratios):.4f}, "
          f"IQR {q[0]:.4f}–{q[2]:.4f}, mean {mean:.4f} ± {1.96 * sem:.4f} (95 % CI), n={len(ratios)}")


def start_baseline(pid, cpus=None):
    """The bpftrace baseline on the engine's pid, once its probes are attached. bpftrace 0.17
    has stalled half-way through attaching here (scripts/bench/bpftrace.sh): a start that has
    not attached within 30 s is killed and tried again, three times."""
    pin = ["taskset", "-c", cpus] if cpus else []
    path = "/tmp/inferscope-bench-bpftrace.txt"
    for attempt in range(1, 4):
        out = open(path, "w")
        p = subprocess.Popen(pin + ["bpftrace", os.path.join(ROOT, "scripts/bench/baseline.bt"), str(pid)],
                             stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "Attaching" not in open(path).read():
            if time.monotonic() > deadline or p.poll() is not None:
                break
            time.sleep(0.1)
        else:
            time.sleep(1)
            return p
        p.kill()
        p.wait()
        print(f"bpftrace did not attach within 30 s (attempt {attempt} of 3)", file=sys.stderr)
    raise RuntimeError(f"bpftrace did not attach (see {path})")


def run_pairs(args, port, agent_cpus, engine_pid):
    """Throughput ratios over alternating rounds (agent off, on, and with --baseline the bpftrace
    baseline), the order rotated each round; every variant of a round sends the same prompts
    (identical work: see `stream`)."""
    modes = ["off", "on"] + (["bpftrace"] if args.baseline else [])
    wall = {m: [] for m in modes[1:]}
    engine_time = {m: [] for m in modes[1:]}
    for i in range(args.pairs):
        order = modes[i % len(modes):] + modes[:i % len(modes)]
        t = {}
        for mode in order:
            tracer = None
            if mode == "on":
                tracer = start_agent(port, "/tmp/inferscope-bench.jsonl", agent_cpus)
            elif mode == "bpftrace":
                tracer = start_baseline(engine_pid, agent_cpus)
            t[mode] = load(port, args.requests, args.concurrency, args.max_tokens, f"ab{i}")
            if tracer:
                tracer.send_signal(2); tracer.wait()
        line = f"round {i}: off {t['off'][0]:.3f} s (engine {t['off'][1]:.3f} s)"
        for mode in modes[1:]:
            wall[mode].append(t["off"][0] / t[mode][0])
            if t["off"][1] and t[mode][1]:
                engine_time[mode].append(t["off"][1] / t[mode][1])
            line += f", {mode} {t[mode][0]:.3f} s: wall ratio {wall[mode][-1]:.4f}"
        print(line, flush=True)
    print()
    for mode in modes[1:]:
        label = "inferscope" if mode == "on" else mode
        summary(f"{label}: wall-clock throughput", wall[mode])
        if engine_time[mode]:
            summary(f"{label}: engine-time throughput", engine_time[mode])


if __name__ == "__main__":
    main()
