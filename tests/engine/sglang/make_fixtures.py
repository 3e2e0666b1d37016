#!/usr/bin/env python3
"""Writes the SGLang IPC fixtures (tests/fixtures/sglang/<version>/) with SGLang's own classes,
pickled exactly as its sockets do (`send_pyobj(obj, protocol=pickle.HIGHEST_PROTOCOL)`), and
the values the agent must read from them (expected.json).

    .venv-sglang/bin/python3 tests/engine/sglang/make_fixtures.py tests/fixtures/sglang/0.5.23
"""
import importlib.metadata
import json
import pickle
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))
import ipc_engine  # noqa: E402
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402


def dump(path: Path, obj):
    path.write_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    req = TokenizedGenerateReqInput(
        rid="6f1c0e5a9b7d4c2e8a1b3c5d7e9f0a12",
        input_text="the prompt text never leaves the agent",
        input_ids=array("l", range(37)),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=16),
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=True,
    )
    dump(out / "request.pickle", req)

    # Two requests in one decode step, the first finished; times in SGLang's own stats objects.
    reqs = []
    for rid, prompt, n, retracted, cached, t in [
        ("a" * 32, 37, 16, 2, 4, 100.25),
        ("b" * 32, 5, 3, 0, 0, 100.5),
    ]:
        msg = SimpleNamespace(
            rid=rid, input_ids=array("l", range(prompt)), sampling_params=SamplingParams(max_new_tokens=16)
        )
        r = ipc_engine.Req(msg)
        r.out, r.retractions, r.cached = n, retracted, cached
        r.stats.wait_queue_entry_time = t
        r.stats.forward_entry_time = t + 0.125
        r.stats.prefill_finished_time = t + 0.25
        reqs.append(r)
    dump(out / "output.pickle", ipc_engine.build_output(reqs, reqs[:1]))
    # Without --enable-metrics SGLang ships its stats objects empty.
    for r in reqs:
        r.stats.has_timing_data = False
    dump(out / "output_no_timing.pickle", ipc_engine.build_output(reqs, []))

    expected = {
        "sglang_version": importlib.metadata.version("sglang"),
        "request": {"rid": req.rid, "prompt_tokens": 37},
        "output": {
            "rids": [r.rid for r in reqs],
            "finished": ["length", None],
            "prompt_tokens": [37, 5],
            "completion_tokens": [16, 3],
            "cached_tokens": [4, 0],
            "retractions": [2, 0],
            "wait_queue_entry_time": [100.25, 100.5],
            "forward_entry_time": [100.375, 100.625],
        },
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
