#!/usr/bin/env python3
"""A client of vLLM's gRPC server (`vllm serve --grpc`, smg-grpc-servicer's VllmEngine), the
ground truth for the agent's records of it: streaming `Generate` calls multiplexed over one
HTTP/2 connection per channel, as a router does, each counting what it received.

    grpc_client.py PORT CALLS CONCURRENCY [--channels N] [--tag T] [--cancel-every K]

Waits until the server answers its health check, then runs CALLS calls, CONCURRENCY at once,
spread over N channels (connections). Every K-th call (0: none) is cancelled after its second
message. Prints one JSON line per call, then "done":

    {"id", "send_ns", "first_ns", "last_ns", "messages", "chunks", "prompt_tokens",
     "completion_tokens", "finish_reason", "cancelled"}

Times are CLOCK_MONOTONIC ns, the agent's clock: `send_ns` is taken before the call is handed
to grpcio, `first_ns`/`last_ns` when the first/last response message reached this process.
"""
import argparse
import json
import random
import sys
import threading
import time
from concurrent import futures

import grpc
from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

# The test model's words are token ids 4..31999 (tests/engine/vllm/inferscope_vllm/model.py).
FIRST_WORD = 4
LAST_WORD = 31999


def wait_healthy(stub, deadline_s=120.0):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=5)
            return
        except grpc.RpcError as e:
            if time.monotonic() > deadline:
                sys.exit(f"vLLM's gRPC server never became healthy: {e}")
            time.sleep(0.5)


def one_call(stub, call_id, prompt_len, max_tokens, cancel, rng_seed):
    rng = random.Random(rng_seed)
    request = vllm_engine_pb2.GenerateRequest(
        request_id=call_id,
        tokenized=vllm_engine_pb2.TokenizedInput(
            input_ids=[rng.randint(FIRST_WORD, LAST_WORD) for _ in range(prompt_len)]
        ),
        sampling_params=vllm_engine_pb2.SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True
        ),
        stream=True,
    )
    out = {
        "id": call_id,
        "prompt_len": prompt_len,
        "max_tokens": max_tokens,
        "messages": 0,
        "chunks": 0,
        "first_ns": None,
        "last_ns": None,
        "prompt_tokens": None,
        "completion_tokens": 0,
        "finish_reason": None,
        "cancelled": False,
    }
    out["send_ns"] = time.monotonic_ns()
    responses = stub.Generate(request, timeout=120)
    try:
        for response in responses:
            now = time.monotonic_ns()
            if out["first_ns"] is None:
                out["first_ns"] = now
            out["last_ns"] = now
            out["messages"] += 1
            kind = response.WhichOneof("response")
            if kind == "chunk":
                out["chunks"] += 1
                out["completion_tokens"] += len(response.chunk.token_ids)
                out["prompt_tokens"] = response.chunk.prompt_tokens
            elif kind == "complete":
                out["finish_reason"] = response.complete.finish_reason
                out["prompt_tokens"] = response.complete.prompt_tokens
            if cancel and out["messages"] == 2:
                out["cancelled"] = True
                responses.cancel()
                break
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED or not out["cancelled"]:
            out["error"] = str(e.code())
    out["end_ns"] = time.monotonic_ns()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("calls", type=int)
    p.add_argument("concurrency", type=int)
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--tag", default="g")
    p.add_argument("--cancel-every", type=int, default=0)
    a = p.parse_args()

    # A subchannel pool per channel: otherwise grpcio shares one connection among channels
    # to one target.
    channels = [
        grpc.insecure_channel(
            f"127.0.0.1:{a.port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(max(1, a.channels))
    ]
    stubs = [vllm_engine_pb2_grpc.VllmEngineStub(c) for c in channels]
    for stub in stubs:
        wait_healthy(stub)
    rng = random.Random(7)
    jobs = []
    for i in range(a.calls):
        cancel = a.cancel_every > 0 and i % a.cancel_every == a.cancel_every - 1
        # Prompts from a few tokens to a few hundred (prefill of one step or several), and
        # streams from 4 to 40 tokens.
        jobs.append((f"{a.tag}-{i}", rng.choice([8, 40, 160, 600]), rng.randint(4, 40), cancel))
    lock = threading.Lock()
    with futures.ThreadPoolExecutor(max_workers=a.concurrency) as pool:
        pending = [
            pool.submit(one_call, stubs[i % len(stubs)], cid, plen, mt, cancel, i)
            for i, (cid, plen, mt, cancel) in enumerate(jobs)
        ]
        for f in futures.as_completed(pending):
            result = f.result()
            with lock:
                print(json.dumps(result), flush=True)
    for c in channels:
        c.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
