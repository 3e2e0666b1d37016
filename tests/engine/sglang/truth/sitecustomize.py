"""Ground truth from SGLang's own scheduler, for tests/tests/sglang_engine.rs.

Put this directory on PYTHONPATH of `python -m sglang.launch_server` and set
INFERSCOPE_SGLANG_TRUTH=FILE: in the scheduler process (spawned; sitecustomize runs in every
interpreter), once SGLang's scheduler module is imported, its `set_time_batch` (which stamps
`forward_entry_time`, SGLang's admission) and `Req.reset_for_retract` (a retraction) are wrapped
to append JSON lines to FILE: {"event": "admit", "rid", "forward_entry_time" (repr of SGLang's
own perf_counter value), "input_len"} the first time a request enters a forward batch, and
{"event": "retract", "rid", "retraction_count"} per retraction. SGLang itself is unchanged.
"""
import importlib.abc
import importlib.util
import json
import os
import sys

TRUTH = os.environ.get("INFERSCOPE_SGLANG_TRUTH")
TARGET = "sglang.srt.managers.scheduler"


def _write(line):
    with open(TRUTH, "a") as f:
        f.write(json.dumps(line) + "\n")


def _patch(scheduler_module):
    from sglang.srt.managers.schedule_batch import Req

    original = scheduler_module.set_time_batch
    seen = set()

    def set_time_batch(reqs, set_func, *args, **kwargs):
        result = original(reqs, set_func, *args, **kwargs)
        if set_func == "set_forward_entry_time" and reqs:
            for r in reqs:
                if r.rid not in seen and r.time_stats.forward_entry_time > 0:
                    seen.add(r.rid)
                    _write(
                        {
                            "event": "admit",
                            "rid": r.rid,
                            "forward_entry_time": repr(r.time_stats.forward_entry_time),
                            "input_len": len(r.origin_input_ids),
                        }
                    )
        return result

    scheduler_module.set_time_batch = set_time_batch
    reset = Req.reset_for_retract

    def reset_for_retract(self, *args, **kwargs):
        result = reset(self, *args, **kwargs)
        _write({"event": "retract", "rid": self.rid, "retraction_count": self.retraction_count})
        return result

    Req.reset_for_retract = reset_for_retract


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if TRUTH:
    sys.meta_path.insert(0, _Finder())
