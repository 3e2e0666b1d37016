#!/usr/bin/env python3
"""SGLang's IPC between two real processes, with SGLang 0.5.23's own message classes and its own
socket code (the fallback issue 18 allows: SGLang's real Scheduler is not run here).

    .venv-sglang/bin/python3 ipc_engine.py api sglang serve --port P --workdir DIR
        [--pool TOKENS] [--prefill-ms MS] [--decode-ms MS]

API process (this one; SGLang's TokenizerManager + HTTP server role): HTTP on 127.0.0.1:P;
GET /start spawns the scheduler process, GET anything answers "ok".
POST /v1/chat/completions (stream) takes `rid` from the body or makes one (uuid4().hex, as
SGLang's GenerateReqInput does); SSE chunks carry `id` = rid, as SGLang's OpenAI server does.
The prompt is "tokenized" as one token per whitespace-separated word. It builds SGLang's
`TokenizedGenerateReqInput` (with SGLang's `SamplingParams`) and sends it with SGLang's
`io_struct.sock_send` (pickle, protocol HIGHEST) over ZMQ PUSH on ipc://DIR/sched.sock.

Scheduler process (`scheduler` role; titles itself `sglang::scheduler` as SGLang does): ZMQ PULL
from the API, PUSH of `BatchTokenIDOutput` back (SGLang's --skip-tokenizer-init path: no
detokenizer). It schedules like SGLang's: FCFS admission while the KV pool (--pool tokens) holds
the prompt, a prefill batch for newly admitted requests, then decode steps; when the pool cannot
hold one more token per running request it retracts the newest request (frees its tokens, back to
the front of the queue; its retraction count grows). Per-request times are SGLang's own
`SchedulerReqTimeStats` (perf_counter = CLOCK_MONOTONIC), set through its own methods and
shipped in `time_stats` with `has_timing_data` (what --enable-metrics ships). Every output is
one step: each request in the batch gets one token.

A client that leaves mid-stream: the front sends SGLang's `AbortReq(rid)` to the scheduler, which
drops the request if it is queued (answering with an `AbortReq` carrying the abort reason, as
SGLang's scheduler does) or, if it runs, finishes it with an "abort" reason in its next step
(SGLang's `to_finish`); either way one JSON line goes to DIR/aborted.jsonl: rid, where
("queued" or "running"), retractions.

Ground truth: the scheduler appends one JSON line per finished request to DIR/truth.jsonl:
rid, prompt_tokens, completion_tokens, retractions, forward_entry_time (repr, exact),
wait_queue_entry_time; and one line per step to DIR/steps.jsonl (mode, rids; for a prefill batch
with first prefills also those rids and the step's start and end on SGLang's clock).
"""
import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import zmq

from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenIDOutput,
    TokenizedGenerateReqInput,
    sock_send,
    sock_recv,
)
from sglang.srt.observability.req_time_stats import SchedulerReqTimeStats
from sglang.srt.sampling.sampling_params import SamplingParams


def addresses(workdir: Path):
    return f"ipc://{workdir}/sched.sock", f"ipc://{workdir}/out.sock"


# -------------------------------------------------------------------------------- scheduler --
def build_output(batch, finished):
    """SGLang's BatchTokenIDOutput for one step: each request in `batch` got one token."""
    return BatchTokenIDOutput(
        rids=[r.rid for r in batch],
        finished_reasons=[
            (
                ({"type": "abort", "message": "client left"} if r.abort else {"type": "length", "length": r.out})
                if r in finished
                else None
            )
            for r in batch
        ],
        decoded_texts=["" for _ in batch],
        decode_ids=[array("l", [7]) for _ in batch],
        read_offsets=[0 for _ in batch],
        output_ids=None,
        skip_special_tokens=[True for _ in batch],
        spaces_between_special_tokens=[True for _ in batch],
        no_stop_trim=[False for _ in batch],
        prompt_tokens=[r.prompt for r in batch],
        reasoning_tokens=[0 for _ in batch],
        completion_tokens=[r.out for r in batch],
        cached_tokens=[getattr(r, "cached", 0) for r in batch],
        input_token_logprobs_val=[],
        input_token_logprobs_idx=[],
        output_token_logprobs_val=[],
        output_token_logprobs_idx=[],
        input_top_logprobs_val=[],
        input_top_logprobs_idx=[],
        output_top_logprobs_val=[],
        output_top_logprobs_idx=[],
        input_token_ids_logprobs_val=[],
        input_token_ids_logprobs_idx=[],
        output_token_ids_logprobs_val=[],
        output_token_ids_logprobs_idx=[],
        output_token_entropy_val=None,
        output_token_sampling_mask=None,
        output_hidden_states=[],
        routed_experts=None,
        indexer_topk=None,
        placeholder_tokens_idx=None,
        placeholder_tokens_val=None,
        retraction_counts=[r.retractions for r in batch],
        time_stats=[r.stats for r in batch],
    )


class Req:
    def __init__(self, msg: TokenizedGenerateReqInput):
        self.rid = msg.rid
        self.prompt = len(msg.input_ids)
        self.max_new = msg.sampling_params.max_new_tokens
        self.out = 0
        self.retractions = 0
        self.first_prefill = True
        self.abort = False
        self.stats = SchedulerReqTimeStats()
        self.stats.has_timing_data = True
        self.stats.set_scheduler_recv_time()
        self.stats.set_wait_queue_entry_time()

    def kv(self):
        return self.prompt + self.out


def scheduler(args):
    import setproctitle

    setproctitle.setproctitle("sglang::scheduler")
    parent = os.getppid()

    def orphaned():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    workdir = Path(args.workdir)
    in_addr, out_addr = addresses(workdir)
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(in_addr)
    push = ctx.socket(zmq.PUSH)
    push.connect(out_addr)
    truth = open(workdir / "truth.jsonl", "a", buffering=1)
    aborted = open(workdir / "aborted.jsonl", "a", buffering=1)
    steps = open(workdir / "steps.jsonl", "a", buffering=1)
    waiting, running = [], []

    def used():
        return sum(r.kv() for r in running)

    def send(batch, finished, mode):
        sock_send(push, build_output(batch, finished))
        line = {"time": repr(time.perf_counter()), "mode": mode, "rids": [r.rid for r in batch]}
        # A batch's first prefills: SGLang's own bounds of that step (first forward entry to
        # last prefill end), what the agent reports as the step.
        first = [r for r in batch if mode == "prefill" and r.first_prefill]
        if first:
            line["first"] = [r.rid for r in first]
            line["start"] = repr(min(r.stats.forward_entry_time for r in first))
            line["end"] = repr(max(r.stats.prefill_finished_time for r in first))
        for r in first:
            r.first_prefill = False
        steps.write(json.dumps(line) + "\n")

    while True:
        # Block only when idle.
        while True:
            try:
                msg = sock_recv(pull, flags=0 if not (waiting or running) else zmq.NOBLOCK)
            except zmq.Again:
                break
            if msg is None:
                return
            if isinstance(msg, AbortReq):
                abort(msg.rid, waiting, running, push, aborted)
                continue
            waiting.append(Req(msg))
        # Admission: FCFS while the pool holds the prompt (+1 for the first token).
        admitted = []
        while waiting and used() + sum(r.kv() for r in admitted) + waiting[0].kv() + 1 <= args.pool:
            r = waiting.pop(0)
            r.stats.set_forward_entry_time()
            admitted.append(r)
        if admitted:
            time.sleep(args.prefill_ms / 1000)
            for r in admitted:
                r.out += 1
                r.stats.set_prefill_finished_time()
            running.extend(admitted)
            finish(admitted, running, send, truth, "prefill", aborted)
            continue
        if not running:
            continue
        # Decode: one more token each; retract the newest while the pool cannot hold it.
        while running and used() + len(running) > args.pool:
            r = running.pop()
            r.retractions += 1
            r.stats.set_retract_time()
            waiting.insert(0, r)
        if not running:
            continue
        time.sleep(args.decode_ms / 1000)
        for r in running:
            r.out += 1
        finish(list(running), running, send, truth, "decode", aborted)


def abort(rid, waiting, running, push, aborted):
    """SGLang's Scheduler.abort_request: a queued request is dropped and answered with an
    AbortReq; a running one finishes with an abort reason in its next step."""
    for r in waiting:
        if r.rid == rid:
            waiting.remove(r)
            sock_send(push, AbortReq(rid=rid, finished_reason={"type": "abort", "message": "client left"}))
            line = {"rid": rid, "where": "queued", "retractions": r.retractions}
            aborted.write(json.dumps(line) + "\n")
            return
    for r in running:
        if r.rid == rid:
            r.abort = True


def finish(batch, running, send, truth, mode, aborted=None):
    done = [r for r in batch if r.out >= r.max_new or r.abort]
    send(batch, done, mode)
    for r in done:
        running.remove(r)
        if r.abort:
            line = {"rid": r.rid, "where": "running", "retractions": r.retractions}
            aborted.write(json.dumps(line) + "\n")
            continue
        truth.write(
            json.dumps(
                {
                    "rid": r.rid,
                    "prompt_tokens": r.prompt,
                    "completion_tokens": r.out,
                    "retractions": r.retractions,
                    "forward_entry_time": repr(r.stats.forward_entry_time),
                    "wait_queue_entry_time": repr(r.stats.wait_queue_entry_time),
                }
            )
            + "\n"
        )


# -------------------------------------------------------------------------------------- api --
class Front:
    def __init__(self, workdir: Path):
        in_addr, out_addr = addresses(workdir)
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.bind(in_addr)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(out_addr)
        self.lock = threading.Lock()
        self.streams = {}
        threading.Thread(target=self.reader, daemon=True).start()

    def reader(self):
        while True:
            out = sock_recv(self.pull)
            if isinstance(out, AbortReq):
                q = self.streams.get(out.rid)
                if q is not None:
                    q.put(out.finished_reason)
                continue
            for i, rid in enumerate(out.rids):
                q = self.streams.get(rid)
                if q is not None:
                    q.put(out.finished_reasons[i])

    def submit(self, rid, prompt_tokens, max_new):
        q = queue.Queue()
        self.streams[rid] = q
        msg = TokenizedGenerateReqInput(
            rid=rid,
            input_text=None,
            input_ids=array("l", range(prompt_tokens)),
            input_embeds=None,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=SamplingParams(max_new_tokens=max_new),
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=True,
        )
        with self.lock:
            sock_send(self.push, msg)
        return q

    def abort(self, rid):
        """The client left: SGLang's TokenizerManager.abort_request."""
        self.streams.pop(rid, None)
        with self.lock:
            sock_send(self.push, AbortReq(rid=rid))


def api(args):
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    front = Front(workdir)
    children = []

    def start():
        # Started on demand, so that an agent attached to this process sees the scheduler
        # connect (its ZMTP greeting) as for an engine started under the agent.
        if not children:
            children.append(
                subprocess.Popen(
                    [sys.executable, __file__, "scheduler", "--workdir", str(workdir)]
                    + ["--pool", str(args.pool), "--prefill-ms", str(args.prefill_ms)]
                    + ["--decode-ms", str(args.decode_ms)]
                )
            )

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path == "/start":
                start()
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            req = json.loads(self.rfile.read(n))
            rid = req.get("rid") or uuid.uuid4().hex
            text = " ".join(m["content"] for m in req["messages"])
            q = front.submit(rid, len(text.split()), int(req.get("max_tokens", 8)))
            try:
                self.stream(rid, q)
            except (BrokenPipeError, ConnectionResetError):
                front.abort(rid)
                self.close_connection = True

        def stream(self, rid, q):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                reason = q.get()
                chunk = {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": "x"},
                            "finish_reason": reason["type"] if reason else None,
                        }
                    ],
                }
                self.chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if reason:
                    break
            front.streams.pop(rid, None)
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def chunk(self, data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        for child in children:
            child.terminate()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["api", "scheduler"])
    p.add_argument("rest", nargs="*")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--workdir", required=True)
    p.add_argument("--pool", type=int, default=256)
    p.add_argument("--prefill-ms", type=float, default=20)
    p.add_argument("--decode-ms", type=float, default=5)
    args = p.parse_args()
    (api if args.role == "api" else scheduler)(args)


if __name__ == "__main__":
    main()
