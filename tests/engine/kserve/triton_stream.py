"""Triton's ModelStreamInfer (KServe v2 over gRPC) for a decoupled, token-streaming model, on a
real gRPC server (grpcio's C core) with messages from Triton's official protocol files, and a
client that counts what it received: the ground truth for the agent's per-call records of a
stream that carries many calls.

  triton_stream.py serve PORT DESCRIPTORS
      prints "ready", then one JSON line per call it answered: id, recv_ns (when the request
      message reached the handler), first_ns and last_ns (when its first and last responses were
      handed to gRPC), responses
  triton_stream.py call PORT DESCRIPTORS STREAMS CALLS
      opens STREAMS ModelStreamInfer streams at once on one channel and sends CALLS requests on
      each, a few milliseconds apart, so that several calls of a stream are in flight at once;
      prints one JSON line per call (id, send_ns, first_ns, last_ns, responses, error), then "done"

DESCRIPTORS is a FileDescriptorSet of tests/engine/kserve/grpc_service.proto and its imports.
The server answers as Triton does (server src/grpc/stream_infer_handler.cc): every response
carries the call's id and the `triton_final_response` parameter, true on the call's last; a
failed call gets one response with `error_message` set; a call that asked for
`triton_enable_empty_final_response` ends with an empty response. Clocks: CLOCK_MONOTONIC, the
agent's.
"""
import json
import queue
import random
import struct
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
FIRST_TOKEN_S = 0.004
TOKEN_GAP_S = 0.003


def messages(descriptors):
    files = descriptor_pb2.FileDescriptorSet.FromString(open(descriptors, "rb").read()).file
    pool = descriptor_pool.DescriptorPool()
    pending = list(files)
    while pending:
        # Dependencies first, whatever order the set lists them in.
        added = [f for f in pending if all(pool_has(pool, d) for d in f.dependency)]
        if not added:
            raise SystemExit(f"unresolvable imports in {descriptors}")
        for f in added:
            pool.Add(f)
            pending.remove(f)

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    return cls("inference.ModelInferRequest"), cls("inference.ModelStreamInferResponse")


def pool_has(pool, name):
    try:
        pool.FindFileByName(name)
        return True
    except KeyError:
        return False


def serve(port, descriptors):
    request_cls, response_cls = messages(descriptors)
    log = threading.Lock()

    def answer(request, out, recv_ns):
        params = request.parameters
        tokens = params["max_tokens"].int64_param if "max_tokens" in params else 8
        empty_final = (
            "triton_enable_empty_final_response" in params
            and params["triton_enable_empty_final_response"].bool_param
        )
        stamps = []

        def send(response):
            stamps.append(time.monotonic_ns())
            out.put(response)

        def base(last):
            r = response_cls()
            ir = r.infer_response
            ir.model_name = request.model_name
            ir.id = request.id
            ir.parameters["triton_final_response"].bool_param = last
            return r

        time.sleep(FIRST_TOKEN_S)
        if request.id.endswith("-bad"):
            # As Triton answers a failed request: the result cleared, the error set.
            r = base(True)
            r.error_message = f"in model '{request.model_name}': unexpected shape for input 'bad'"
            send(r)
        else:
            for i in range(tokens):
                last = i == tokens - 1 and not empty_final
                r = base(last)
                t = r.infer_response.outputs.add()
                t.name, t.datatype = "text_output", "BYTES"
                t.shape.append(1)
                token = f" token{i}".encode()
                r.infer_response.raw_output_contents.append(struct.pack("<I", len(token)) + token)
                send(r)
                if not last:
                    time.sleep(TOKEN_GAP_S)
            if empty_final:
                send(base(True))
        with log:
            print(json.dumps({"id": request.id, "recv_ns": recv_ns, "first_ns": stamps[0],
                              "last_ns": stamps[-1], "responses": len(stamps)}), flush=True)

    def stream_infer(requests, context):
        out = queue.Queue()
        workers = []

        def read():
            for request in requests:
                recv_ns = time.monotonic_ns()
                w = threading.Thread(target=answer, args=(request, out, recv_ns))
                w.start()
                workers.append(w)
            for w in workers:
                w.join()
            out.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (response := out.get()) is not None:
            yield response

    handler = grpc.stream_stream_rpc_method_handler(
        stream_infer,
        request_deserializer=request_cls.FromString,
        response_serializer=response_cls.SerializeToString,
    )

    class Handlers(grpc.GenericRpcHandler):
        def service(self, details):
            return handler if details.method == PATH else None

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    server.add_generic_rpc_handlers((Handlers(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def call(port, descriptors, streams, calls):
    request_cls, response_cls = messages(descriptors)
    results = {}
    lock = threading.Lock()

    def one_stream(channel, s):
        rng = random.Random(s)
        done = threading.Event()
        finals = [0]

        def requests():
            for i in range(calls):
                time.sleep(rng.uniform(0.0, 0.012))
                r = request_cls()
                r.model_name = "ensemble"
                r.id = f"s{s}-c{i}" + ("-bad" if i == 5 else "")
                r.parameters["max_tokens"].int64_param = rng.randint(2, 24)
                if i % 4 == 3:
                    r.parameters["triton_enable_empty_final_response"].bool_param = True
                t = r.inputs.add()
                t.name, t.datatype = "text_input", "BYTES"
                t.shape.append(1)
                # Prompts of a few bytes to several KiB: some messages span many frames.
                text = b"Summarise the incident. " * rng.choice([1, 8, 60, 250])
                r.raw_input_contents.append(struct.pack("<I", len(text)) + text)
                with lock:
                    results[r.id] = {"id": r.id, "responses": 0, "error": False,
                                     "send_ns": time.monotonic_ns()}
                yield r
            # The stream stays open until every call got its last response, as a client that
            # reuses one stream does.
            done.wait(timeout=60)

        stub = channel.stream_stream(
            PATH,
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        for response in stub(requests(), timeout=90):
            now = time.monotonic_ns()
            ir = response.infer_response
            with lock:
                rec = results[ir.id]
                rec["responses"] += 1
                rec.setdefault("first_ns", now)
                rec["last_ns"] = now
                rec["error"] |= bool(response.error_message)
            flag = ir.parameters.get("triton_final_response")
            if flag is not None and flag.bool_param:
                finals[0] += 1
                if finals[0] == calls:
                    done.set()

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        threads = [threading.Thread(target=one_stream, args=(channel, s)) for s in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for rec in results.values():
        print(json.dumps(rec), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        call(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
