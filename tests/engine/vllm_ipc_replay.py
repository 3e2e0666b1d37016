#!/usr/bin/env python3
"""Replays the vLLM IPC fixtures (tests/fixtures/vllm/<version>/messages.json) between two real
processes over real pyzmq sockets of vLLM's kinds, behind a small OpenAI-style HTTP front, so the
agent's eBPF capture, ZMTP/msgpack decoding and HTTP join run for real.

    python3 vllm_ipc_replay.py api vllm serve fixture [--port P] --fixtures DIR --transport ipc|tcp
                               --workdir DIR
    (the API-server process; it spawns the engine process itself on GET /start, like vLLM;
    without --port the kernel picks the port, written to WORKDIR/http.port once it listens)

API server (this process): HTTP on 127.0.0.1:P; ZMQ ROUTER (input) and PULL (output), bound.
Engine process (`engine` role): ZMQ DEALER with identity b"\\x00\\x00" and PUSH, connecting; it
sends the fixture's start-up message, then each output message when its time comes.

The fixtures' timestamps are CLOCK_MONOTONIC seconds of the machine that generated them. The
engine shifts every event and step timestamp by one offset (chosen when the first request
arrives, so that the engine's events fall after the HTTP requests that caused them), patching
the float64 values in place, sleeps until each step's shifted time before sending it, and writes
the offset (repr, exact) to WORKDIR/offset. Nothing else in the messages changes.

HTTP: POST /v1/chat/completions with X-Request-Id: fixture-<x> streams SSE chunks whose `id` is
"chatcmpl-fixture-<x>" (vLLM's id), one per output token, ending with finish_reason and [DONE];
no usage (as vLLM streams without stream_options.include_usage). The replay starts when all of
the fixture's requests are waiting. GET /start spawns the engine and answers once its start-up
message arrived; GET /health answers 200.
"""
import argparse
import json
import queue
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import zmq

IDENTITY = (0).to_bytes(2, "little")


def load(fixtures: Path):
    messages = json.loads((fixtures / "messages.json").read_text())
    for m in messages:
        m["frames"] = [bytes.fromhex(f) for f in m["frames"]]
    expected = json.loads((fixtures / "expected.json").read_text())
    return messages, expected


def addresses(transport: str, workdir: Path):
    if transport == "ipc":
        return f"ipc://{workdir}/input.sock", f"ipc://{workdir}/output.sock"
    # Ports the kernel picks at bind (read back from the sockets): a port chosen before it is
    # bound can be taken by another test's process in between.
    return "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"


# ----------------------------------------------------------------------------------- engine --
def engine(args):
    messages, expected = load(Path(args.fixtures))
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, IDENTITY)
    dealer.connect(args.input)
    push = ctx.socket(zmq.PUSH)
    push.connect(args.output)
    stamps = [ts for r in expected["requests"] for _, ts in r["events"]]
    stamps += [s["timestamp"] for s in expected["steps"]]
    earliest = min(stamps)
    offset = None
    for m in messages:
        if m["direction"] == "from_engine_input":
            dealer.send_multipart(m["frames"])
        elif m["direction"] == "to_engine_input":
            got = dealer.recv_multipart()
            assert got == m["frames"], "input differs from the fixture"
            if offset is None:
                offset = time.monotonic() + 0.002 - earliest
                (Path(args.workdir) / "offset").write_text(repr(offset))
        else:
            frame = m["frames"][0]
            step_ts = None
            for ts in stamps:
                old = b"\xcb" + struct.pack(">d", ts)
                if old in frame:
                    frame = frame.replace(old, b"\xcb" + struct.pack(">d", ts + offset))
            for s in expected["steps"]:
                if (b"\xcb" + struct.pack(">d", s["timestamp"] + offset)) in frame:
                    step_ts = s["timestamp"] + offset
            if step_ts is not None:
                delay = step_ts - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            push.send_multipart([frame] + m["frames"][1:])
    time.sleep(0.5)
    dealer.close(linger=500)
    push.close(linger=500)
    ctx.term()


# ------------------------------------------------------------------------------- API server --
class Front:
    def __init__(self, args):
        self.args = args
        self.messages, self.expected = load(Path(args.fixtures))
        self.ctx = zmq.Context()
        workdir = Path(args.workdir)
        input_addr, output_addr = addresses(args.transport, workdir)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.bind(input_addr)
        self.input_addr = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(output_addr)
        self.output_addr = self.pull.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.streams = {}  # external id -> queue of SSE payloads (None ends)
        self.lock = threading.Lock()
        self.all_waiting = threading.Event()
        self.started = False
        self.engine = None
        n = sum(1 for m in self.messages if "add" in m)
        self.n_requests = n

    def start_engine(self):
        with self.lock:
            if self.started:
                return
            self.started = True
        self.engine = subprocess.Popen([
            sys.executable, __file__, "engine", "--fixtures", self.args.fixtures,
            "--workdir", self.args.workdir, "--input", self.input_addr,
            "--output", self.output_addr,
        ])
        identity, *frames = self.router.recv_multipart()
        assert identity == IDENTITY and frames == self.messages[0]["frames"]
        threading.Thread(target=self.replay, daemon=True).start()

    def register(self, external_id):
        q = queue.Queue()
        with self.lock:
            self.streams[external_id] = q
            if len(self.streams) == self.n_requests:
                self.all_waiting.set()
        return q

    def replay(self):
        self.all_waiting.wait()
        time.sleep(0.05)
        for m in self.messages:
            if m["direction"] == "to_engine_input":
                self.router.send_multipart([IDENTITY] + m["frames"])
                for rid in m.get("abort", []):
                    self.stream_of(rid).put(None)
            elif m["direction"] == "from_engine_output":
                self.pull.recv_multipart()
                for rid, n_tokens, finish in m["outputs"]:
                    q = self.stream_of(rid)
                    ext = external(rid)
                    for _ in range(n_tokens):
                        q.put({"id": ext, "object": "chat.completion.chunk", "model": "fixture",
                               "choices": [{"index": 0, "delta": {"content": "tok "},
                                            "finish_reason": None}]})
                    if finish is not None:
                        q.put({"id": ext, "object": "chat.completion.chunk", "model": "fixture",
                               "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                        q.put(None)

    def stream_of(self, request_id):
        return self.streams[external(request_id)]


def external(request_id: str) -> str:
    return request_id.rsplit("-", 1)[0]




def handler_for(front: Front):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def plain(self, status, body=b"ok"):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/start":
                front.start_engine()
                self.plain(200)
            else:
                self.plain(200)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            x_request_id = self.headers.get("X-Request-Id")
            if not x_request_id:
                self.plain(400, b"X-Request-Id required")
                return
            ext = f"chatcmpl-{x_request_id}"
            q = front.register(ext)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                item = q.get()
                if item is None:
                    break
                self.chunk(b"data: " + json.dumps(item).encode() + b"\n\n")
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def chunk(self, data: bytes):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def api(args):
    front = Front(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(front))
    server.daemon_threads = True
    # The port as bound (0 asks the kernel for one), written whole once the server listens.
    port_file = Path(args.workdir) / "http.port"
    port_file.with_suffix(".tmp").write_text(str(server.server_address[1]))
    port_file.with_suffix(".tmp").rename(port_file)
    try:
        server.serve_forever()
    finally:
        if front.engine is not None:
            front.engine.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["api", "engine"])
    ap.add_argument("label", nargs="*", help="ignored: makes the command line read like vLLM's")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--input")
    ap.add_argument("--output")
    args = ap.parse_args()
    if args.role == "api":
        api(args)
    else:
        engine(args)


if __name__ == "__main__":
    main()
