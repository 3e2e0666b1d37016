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
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_ABORT  # noqa: E402
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
    req_rid = req.rid

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

    # Four steps of one scheduler without --enable-metrics (no times), as SGLang's
    # stream_output sends them: each lists the requests that got tokens in that step.
    def untimed(rid, prompt, cached):
        msg = SimpleNamespace(
            rid=rid, input_ids=array("l", range(prompt)), sampling_params=SamplingParams(max_new_tokens=16)
        )
        r = ipc_engine.Req(msg)
        r.cached = cached
        r.stats.has_timing_data = False
        return r

    d, e, f = untimed("d" * 32, 12, 2), untimed("e" * 32, 7, 0), untimed("f" * 32, 5, 0)
    # 1: d and e prefilled (one token each).
    d.out = e.out = 1
    dump(out / "steps_1_prefill.pickle", ipc_engine.build_output([d, e], []))
    # 2: both decode.
    d.out = e.out = 2
    dump(out / "steps_2_decode.pickle", ipc_engine.build_output([d, e], []))
    # 3: e retracted (KV full), f prefilled beside d's decode (a mixed batch).
    e.retractions = 1
    d.out, f.out = 3, 1
    dump(out / "steps_3_mixed.pickle", ipc_engine.build_output([d, f], []))
    # 4: e re-prefilled (its next token), d and f decode.
    d.out, e.out, f.out = 4, 3, 2
    dump(out / "steps_4_reprefill.pickle", ipc_engine.build_output([d, e, f], []))
    # The client of e leaves: TokenizerManager -> Scheduler.
    dump(out / "abort_running.pickle", AbortReq(rid=e.rid))
    # The tokenized request above aborted while queued: Scheduler -> TokenizerManager
    # (scheduler.abort_request -> send_abort_output, with the initiator's reason).
    dump(
        out / "abort_queued.pickle",
        AbortReq(rid=req_rid, finished_reason=FINISH_ABORT("client left").to_json()),
    )

    expected = {
        "sglang_version": importlib.metadata.version("sglang"),
        "request": {"rid": req_rid, "prompt_tokens": 37},
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
        # Per step: members (rid, phase), prefilling, the batch's tokens (uncached prompt of
        # a first prefill, tokens gained since the previous output for the others; None
        # with a re-prefill, whose recomputed length is not in the IPC).
        "steps": [
            {"members": [[d.rid, "prefill"], [e.rid, "prefill"]], "prefilling": 2, "tokens": 17},
            {"members": [[d.rid, "decode"], [e.rid, "decode"]], "prefilling": 0, "tokens": 2},
            {"members": [[d.rid, "decode"], [f.rid, "prefill"]], "prefilling": 1, "tokens": 6},
            {
                "members": [[d.rid, "decode"], [e.rid, "prefill"], [f.rid, "decode"]],
                "prefilling": 1,
                "tokens": None,
            },
        ],
        "abort_running": {"rid": e.rid, "retractions": 1},
        "abort_queued": {"rid": req_rid},
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
