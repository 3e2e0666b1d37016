"""A real gRPC server and client over h2c (HTTP/2 with prior knowledge, grpcio's C core), the
ground truth for the agent's HTTP/2 and gRPC decoding: the client counts what it received.

  grpc_h2c.py serve PORT          prints "ready" once listening
  grpc_h2c.py call PORT CALLS     runs CALLS calls (a third in parallel on one channel),
                                  prints one JSON line per call, then "done"
  grpc_h2c.py call PORT CALLS K   the same, but after K calls prints "paused" and waits for a
                                  line on stdin (to attach the agent to a live connection);
                                  the calls after the pause use /inferscope.test.Gen/Late on
                                  every other call, a path the connection had not used before

/inferscope.test.Gen/Stream  server-streaming: the request's first byte is how many messages
                             to send (each of 20 + 7*i bytes, 2 ms apart)
/inferscope.test.Gen/Late    the same as Stream, under another name
/inferscope.test.Gen/Fail    unary: fails with INVALID_ARGUMENT, nothing sent back
Messages are raw bytes (no protobuf), which gRPC carries the same way.
"""
import json
import sys
import threading
import time
from concurrent import futures

import grpc

STREAM = "/inferscope.test.Gen/Stream"
FAIL = "/inferscope.test.Gen/Fail"
LATE = "/inferscope.test.Gen/Late"


def stream(request, context):
    for i in range(request[0]):
        time.sleep(0.002)
        yield bytes([i % 256]) * (20 + 7 * i)


def fail(request, context):
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused")


class Handlers(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method in (STREAM, LATE):
            return grpc.unary_stream_rpc_method_handler(stream)
        if details.method == FAIL:
            return grpc.unary_unary_rpc_method_handler(fail)
        return None


def serve(port):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((Handlers(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def call(port, calls, pause_after):
    lock = threading.Lock()

    def one(channel, i):
        # CLOCK_MONOTONIC, the agent's clock: the call's start, its first and last message.
        start = time.monotonic_ns()
        if i % 5 == 4:
            request = b"x" * (10 + i)
            try:
                channel.unary_unary(FAIL)(request, timeout=10)
                code = 0
            except grpc.RpcError as e:
                code = e.code().value[0]
            result = {"path": FAIL, "request_bytes": len(request), "messages": 0, "bytes": 0,
                      "grpc_status": code, "start_ns": start}
        else:
            n = 3 + i % 6
            request = bytes([n]) + b"p" * (30 + i)
            path = LATE if pause_after is not None and i >= pause_after and i % 2 else STREAM
            got, stamps = [], []
            for m in channel.unary_stream(path)(request, timeout=10):
                stamps.append(time.monotonic_ns())
                got.append(m)
            result = {"path": path, "request_bytes": len(request), "messages": len(got),
                      "bytes": sum(len(m) for m in got), "grpc_status": 0, "start_ns": start,
                      "first_ns": stamps[0], "last_ns": stamps[-1]}
        with lock:
            print(json.dumps(result), flush=True)

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        serial = calls - calls // 3
        for i in range(serial):
            if i == pause_after:
                print("paused", flush=True)
                sys.stdin.readline()
            one(channel, i)
        threads = [threading.Thread(target=one, args=(channel, i)) for i in range(serial, calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print("done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        pause_after = int(sys.argv[4]) if len(sys.argv) > 4 else None
        call(int(sys.argv[2]), int(sys.argv[3]), pause_after)
