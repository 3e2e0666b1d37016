#!/usr/bin/env python3
"""A client of an engine's own gRPC server (smg-grpc-servicer: vLLM's `vllm serve --grpc`, the
VllmEngine service; SGLang's `--grpc-mode`, the SglangScheduler service), the ground truth for
the agent's records of it: streaming `Generate` calls multiplexed over one HTTP/2 connection
per channel, as a router does, each counting what it received. Runs in .venv-vllm (or
.venv-sglang, which sees its packages), where smg-grpc-proto is installed.

    grpc_engine_client.py PORT CALLS CONCURRENCY [--engine vllm|sglang] [--channels N]
        [--tag T] [--cancel-every K] [--prompt-lens 8,40,160,600] [--max-tokens 4,40]
        [--with-text]

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
from smg_grpc_proto import (
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

# The test model's words are token ids 4..31999, word `w<id>` for id `<id>`
# (tests/engine/vllm/inferscope_vllm/model.py).
FIRST_WORD = 4
LAST_WORD = 31999

# Per engine: its messages, its stub, and the name of its output-length field.
ENGINES = {
    "vllm": (vllm_engine_pb2, vllm_engine_pb2_grpc.VllmEngineStub, "max_tokens"),
    "sglang": (
        sglang_scheduler_pb2,
        sglang_scheduler_pb2_grpc.SglangSchedulerStub,
        "max_new_tokens",
    ),
}


def wait_healthy(pb, stub, deadline_s=240.0):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            stub.HealthCheck(pb.HealthCheckRequest(), timeout=30)
            return
        except grpc.RpcError as e:
            if time.monotonic() > deadline:
                sys.exit(f"vLLM's gRPC server never became healthy: {e}")
            time.sleep(0.5)


def one_call(engine, stub, call_id, prompt_len, max_tokens, cancel, rng_seed, with_text):
    pb, _, length_field = ENGINES[engine]
    rng = random.Random(rng_seed)
    ids = [rng.randint(FIRST_WORD, LAST_WORD) for _ in range(prompt_len)]
    request = pb.GenerateRequest(
        request_id=call_id,
        # SGLang's servicer keeps the text beside the ids; vLLM's reads the ids alone, and
        # gets the text only with --with-text (as routers send it: calls of several KiB).
        tokenized=pb.TokenizedInput(
            input_ids=ids,
            original_text=(
                " ".join(f"w{i}" for i in ids) if engine == "sglang" or with_text else ""
            ),
        ),
        sampling_params=pb.SamplingParams(
            temperature=0.0, ignore_eos=True, **{length_field: max_tokens}
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
    p.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--prompt-lens", default="8,40,160,600")
    p.add_argument("--max-tokens", default="4,40", help="the range of output tokens")
    p.add_argument("--tag", default="g")
    p.add_argument("--cancel-every", type=int, default=0)
    p.add_argument(
        "--with-text", action="store_true", help="send the prompt's text beside its ids"
    )
    a = p.parse_args()

    # A subchannel pool per channel: otherwise grpcio shares one connection among channels
    # to one target.
    channels = [
        grpc.insecure_channel(
            f"127.0.0.1:{a.port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(max(1, a.channels))
    ]
    pb, stub_of, _ = ENGINES[a.engine]
    stubs = [stub_of(c) for c in channels]
    for stub in stubs:
        wait_healthy(pb, stub)
    prompt_lens = [int(n) for n in a.prompt_lens.split(",")]
    low, high = (int(n) for n in a.max_tokens.split(","))
    rng = random.Random(7)
    jobs = []
    for i in range(a.calls):
        cancel = a.cancel_every > 0 and i % a.cancel_every == a.cancel_every - 1
        # Prompts from a few tokens to a few hundred (prefill of one step or several) by
        # default, and streams of `--max-tokens`.
        jobs.append((f"{a.tag}-{i}", rng.choice(prompt_lens), rng.randint(low, high), cancel))
    lock = threading.Lock()
    with futures.ThreadPoolExecutor(max_workers=a.concurrency) as pool:
        pending = [
            pool.submit(
                one_call, a.engine, stubs[i % len(stubs)], cid, plen, mt, cancel, i, a.with_text
            )
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
