"""A small randomly initialised Llama (transformers) decoding on the GPU, eager or through a CUDA
graph. Needs torch + transformers, no network (nothing is downloaded). Prints one JSON line:
pid, mode, per-step decode times, and CLOCK_MONOTONIC bounds of the decode loop (time.monotonic_ns
is CLOCK_MONOTONIC on Linux, the clock the shim puts GPU times on).

    python3 workload.py eager|graphs [STEPS]
"""
import json
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

MODE = sys.argv[1] if len(sys.argv) > 1 else "eager"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 64
PROMPT = 64
DEV = "cuda"
DTYPE = torch.bfloat16

cfg = LlamaConfig(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=4096,
)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(DEV, dtype=DTYPE).eval()
prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), device=DEV)


def static_cache(max_len):
    """transformers' StaticCache; its constructor changed across releases."""
    from transformers import StaticCache

    attempts = [
        dict(config=cfg, max_batch_size=1, max_cache_len=max_len, device=DEV, dtype=DTYPE),
        dict(config=cfg, max_cache_len=max_len),
        dict(config=cfg, batch_size=1, max_cache_len=max_len, device=DEV, dtype=DTYPE),
    ]
    last = None
    for kw in attempts:
        try:
            return StaticCache(**kw)
        except TypeError as e:
            last = e
    raise last


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter_ns() - t0


@torch.inference_mode()
def run_eager():
    # Warm-up (cuBLAS handles, allocator), then generate() with a dynamic cache. Per-step time is
    # the difference between a long and a short generation, so prefill cancels out.
    model.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    short = timed(lambda: model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False))
    t_start = time.monotonic_ns()
    long = timed(
        lambda: model.generate(prompt, max_new_tokens=STEPS + 4, min_new_tokens=STEPS + 4, do_sample=False)
    )
    t_end = time.monotonic_ns()
    return [(long - short) / STEPS], t_start, t_end, "generate"


def run_graphs():
    # Some transformers releases do a host-side check in the SDPA mask path, which CUDA graph
    # capture rejects; the eager attention path captures everywhere.
    global model
    try:
        return capture_and_decode("sdpa")
    except Exception as e:  # noqa: BLE001 - report and retry with the other attention path
        print(f"graph capture with SDPA attention failed ({e}); retrying with eager attention", file=sys.stderr)
    torch.cuda.synchronize()
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(DEV, dtype=DTYPE).eval()
    return capture_and_decode("eager")


@torch.inference_mode()
def capture_and_decode(attention):
    cache = static_cache(PROMPT + STEPS + 8)
    pos = torch.arange(PROMPT, device=DEV)
    out = model(input_ids=prompt, past_key_values=cache, cache_position=pos, use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)
    static_tok = tok.clone()
    static_pos = torch.tensor([PROMPT], device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(input_ids=static_tok, past_key_values=cache, cache_position=static_pos, use_cache=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = model(
            input_ids=static_tok, past_key_values=cache, cache_position=static_pos, use_cache=True
        ).logits
    steps = []
    torch.cuda.synchronize()
    t_start = time.monotonic_ns()
    for i in range(STEPS):
        static_pos.fill_(PROMPT + 1 + i)
        t0 = time.perf_counter_ns()
        graph.replay()
        static_tok.copy_(logits[:, -1:].argmax(-1))
        torch.cuda.synchronize()
        steps.append(time.perf_counter_ns() - t0)
    t_end = time.monotonic_ns()
    return steps, t_start, t_end, f"cuda_graph_static_cache_{attention}"


steps, t_start, t_end, how = run_graphs() if MODE == "graphs" else run_eager()
steps_sorted = sorted(steps)
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "mode": MODE,
            "how": how,
            "decode_step_ns_median": steps_sorted[len(steps_sorted) // 2],
            "decode_steps": len(steps),
            "loop_start_mono_ns": t_start,
            "loop_end_mono_ns": t_end,
            "injected": bool(os.environ.get("CUDA_INJECTION64_PATH")),
        }
    ),
    flush=True,
)
