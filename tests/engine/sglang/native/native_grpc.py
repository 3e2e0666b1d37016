"""A client of SGLang's native gRPC server (`--grpc-port`), the ground truth for its records: it
counts what each call received, by its own clock (CLOCK_MONOTONIC, the agent's).

  native_grpc.py PORT DESCRIPTORS CALLS CONCURRENCY
      CALLS streaming calls, CONCURRENCY at once on one channel: every other one `Generate`
      (token ids: prompts of 8 to 200 tokens, so the rid comes after hundreds of bytes), the
      rest `TextGenerate` (prompt text); each names its rid. One JSON line per call (id, path,
      send_ns, first_ns, last_ns, messages, finished), then "done".

DESCRIPTORS: a FileDescriptorSet of tests/engine/sglang/native/sglang.proto.
"""
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "/sglang.runtime.v1.SglangService/"
PROMPT_TOKENS = [8, 40, 120, 200]


def classes(path):
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(open(path, "rb").read()).file:
        pool.Add(f)

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName("sglang.runtime.v1." + name))

    return {n: cls(n) for n in ["GenerateRequest", "GenerateResponse", "TextGenerateRequest",
                               "TextGenerateResponse"]}


def main(port, descriptors, calls, concurrency):
    c = classes(descriptors)
    lock = threading.Lock()

    def one(channel, i):
        tokens = PROMPT_TOKENS[i % len(PROMPT_TOKENS)]
        rid = f"native-{i}"
        if i % 2 == 0:
            method, req_cls, resp_cls = "Generate", c["GenerateRequest"], c["GenerateResponse"]
            request = req_cls(input_ids=[100 + (i * 7 + k) % 200 for k in range(tokens)])
        else:
            method, req_cls, resp_cls = "TextGenerate", c["TextGenerateRequest"], c["TextGenerateResponse"]
            request = req_cls(text=" ".join(["word"] * tokens))
        request.rid = rid
        request.stream = True
        request.sampling_params.max_new_tokens = 4 + i % 5
        request.sampling_params.ignore_eos = True
        call = channel.unary_stream(SERVICE + method, request_serializer=req_cls.SerializeToString,
                                    response_deserializer=resp_cls.FromString)
        stamps, finished, error = [], False, None
        send_ns = time.monotonic_ns()
        try:
            for response in call(request, timeout=120):
                stamps.append(time.monotonic_ns())
                finished |= response.finished
        except grpc.RpcError as e:
            error = f"{e.code()}: {e.details()}"
        out = {"id": rid, "path": SERVICE + method, "send_ns": send_ns, "messages": len(stamps),
               "finished": finished, "prompt_tokens": tokens}
        if stamps:
            out.update(first_ns=stamps[0], last_ns=stamps[-1])
        if error:
            out["error"] = error
        with lock:
            print(json.dumps(out), flush=True)

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda i: one(channel, i), range(calls)))
    print("done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
