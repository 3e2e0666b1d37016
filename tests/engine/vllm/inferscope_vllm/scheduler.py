"""vLLM's Scheduler, unchanged, writing what it does as JSON lines: the tests' ground truth.

Every line has `ev` and CLOCK_MONOTONIC seconds (time.monotonic(), the clock of vLLM's own
events and of eBPF):
- `add`: a request reached the scheduler (`id` engine id, `external`, `prompt_tokens`).
- `queued` / `scheduled` / `preempted`: vLLM's own QUEUED / SCHEDULED / PREEMPTED events (`t` = their timestamp,
  the value vLLM sends over IPC), one line each.
- `finish`: requests finished from outside (client aborts; `status`).
- `step`: one per schedule() + update_from_output(): `start` (schedule() entered), `end` (the
  EngineCoreOutputs timestamp), `ids` (scheduled engine ids), `tokens`, `running`, `waiting`,
  `kv_cache_usage` as sent in the message's scheduler stats.
With the test KV connector (connector.py) the worker adds `kv_load` (the scheduler started a
remote-KV load, `id`, `t`) and `kv_received` (the worker reported it received).
The file is $INFERSCOPE_VLLM_TRUTH (nothing is written when it is unset).
"""
import json
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType


class GroundTruthScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get("INFERSCOPE_VLLM_TRUTH")
        self._truth = open(path, "a", buffering=1) if path else None
        self._step_start = None
        # (request id, event kind, timestamp) already written
        self._written: set = set()

    def _log(self, **fields):
        if self._truth is not None:
            self._truth.write(json.dumps(fields, separators=(",", ":")) + "\n")

    def _log_events(self, request):
        for ev in request.events or ():
            kind = {
                EngineCoreEventType.QUEUED: "queued",
                EngineCoreEventType.SCHEDULED: "scheduled",
                EngineCoreEventType.PREEMPTED: "preempted",
            }.get(ev.type)
            key = (request.request_id, kind, ev.timestamp)
            if kind is None or key in self._written:
                continue
            self._written.add(key)
            self._log(ev=kind, id=request.request_id, t=ev.timestamp)

    def add_request(self, request) -> None:
        super().add_request(request)
        self._log(
            ev="add",
            id=request.request_id,
            external=getattr(request, "external_req_id", None),
            prompt_tokens=request.num_prompt_tokens,
            t=time.monotonic(),
        )

    def schedule(self, *args, **kwargs):
        self._step_start = time.monotonic()
        out = super().schedule(*args, **kwargs)
        # Events stay on the request until update_from_output takes them: every request that
        # moved this step (admitted, resumed, preempted) still holds its new ones here.
        for request in self.requests.values():
            self._log_events(request)
        return out

    def finish_requests(self, request_ids, finished_status):
        finished = super().finish_requests(request_ids, finished_status)
        if finished:
            self._log(
                ev="finish",
                ids=[r.request_id for r in finished],
                status=str(finished_status),
                t=time.monotonic(),
            )
        return finished

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        for eco in outputs.values():
            stats = eco.scheduler_stats
            self._log(
                ev="step",
                start=self._step_start,
                end=eco.timestamp,
                ids=list(scheduler_output.num_scheduled_tokens.keys()),
                tokens=scheduler_output.total_num_scheduled_tokens,
                outputs=[o.request_id for o in eco.outputs],
                running=stats.num_running_reqs if stats else None,
                waiting=stats.num_waiting_reqs if stats else None,
                kv_cache_usage=stats.kv_cache_usage if stats else None,
            )
        # Forget written events of requests that are gone.
        if len(self._written) > 100_000:
            live = set(self.requests)
            self._written = {k for k in self._written if k[0] in live}
        return outputs
