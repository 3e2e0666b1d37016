#!/usr/bin/env python3
"""A simulated fleet for the `diagnose --prometheus` benchmark: one HTTP endpoint serving the
agents' request histograms and counters for PODS pods (the `pod` label names each, as the
agents' pod identity does), in the agents' own metric names and buckets. Every scrape advances
each pod by one second of traffic: 4 requests, TTFT around 200 ms (pod 7 around 900 ms once
`--slow-after` seconds have passed), TPOT around 20 ms, E2E around 600 ms.

  fleet_exporter.py PORT PODS [--slow-after SECONDS]   prints "ready" once listening
"""
import argparse
import http.server
import threading
import time

TTFT = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5,
        0.75, 1.0, 1.5, 2.0, 2.5, 3.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0]
TPOT = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15,
        0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
E2E = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
PER_SCRAPE = 4


class Fleet:
    def __init__(self, pods, slow_after):
        self.pods = pods
        self.slow_after = slow_after
        self.start = time.monotonic()
        self.lock = threading.Lock()
        # pod -> metric -> per-bucket counts (cumulative at render), plus count and sum.
        self.state = [{"ttft": [0] * len(TTFT), "tpot": [0] * len(TPOT), "e2e": [0] * len(E2E),
                       "n": 0, "sums": [0.0, 0.0, 0.0]} for _ in range(pods)]

    def advance(self):
        slow = self.slow_after is not None and time.monotonic() - self.start > self.slow_after
        for i, s in enumerate(self.state):
            for k in range(PER_SCRAPE):
                ttft = (0.9 if slow and i == 7 else 0.2) * (0.8 + 0.1 * k)
                for name, bounds, v, j in (("ttft", TTFT, ttft, 0), ("tpot", TPOT, 0.02, 1),
                                           ("e2e", E2E, ttft + 0.4, 2)):
                    b = next((x for x, le in enumerate(bounds) if v <= le), len(bounds))
                    if b < len(bounds):
                        s[name][b] += 1
                    s["sums"][j] += v
                s["n"] += 1

    def render(self):
        out = []
        for name, metric, bounds, j in (
                ("ttft", "gen_ai_server_time_to_first_token_seconds", TTFT, 0),
                ("tpot", "gen_ai_server_time_per_output_token_seconds", TPOT, 1),
                ("e2e", "gen_ai_server_request_duration_seconds", E2E, 2)):
            out.append(f"# TYPE {metric} histogram")
            for i, s in enumerate(self.state):
                labels = f'engine="vllm",model="m",pod="pod-{i}"'
                acc = 0
                for le, c in zip(bounds, s[name]):
                    acc += c
                    out.append(f'{metric}_bucket{{{labels},le="{le}"}} {acc}')
                out.append(f'{metric}_bucket{{{labels},le="+Inf"}} {s["n"]}')
                out.append(f"{metric}_count{{{labels}}} {s['n']}")
                out.append(f"{metric}_sum{{{labels}}} {s['sums'][j]:.3f}")
        out.append("# TYPE inferscope_requests_total counter")
        for i, s in enumerate(self.state):
            out.append(f'inferscope_requests_total{{engine="vllm",model="m",pod="pod-{i}",outcome="ok"}} {s["n"]}')
        return ("\n".join(out) + "\n").encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("pods", type=int)
    parser.add_argument("--slow-after", type=float)
    args = parser.parse_args()
    fleet = Fleet(args.pods, args.slow_after)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with fleet.lock:
                fleet.advance()
                body = fleet.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
