"""An OpenAI-style streaming server on HTTP/2 (hypercorn: h2c with prior knowledge on a plain
port, ALPN h2 over TLS) and a client that multiplexes many streams on each connection (httpx with
h2): the ground truth for SSE and NDJSON token streams inside HTTP/2 DATA frames.

  h2_sse.py serve PORT LOG [CERT KEY]
      prints "ready" once the port accepts connections. Routes:
        POST /v1/chat/completions   SSE: a role event, max_tokens content events TOKEN_DELAY_MS
                                    apart, a finish event with usage, then [DONE]
        POST /api/generate          NDJSON (Ollama's shape): max_tokens {"response": ...} lines,
                                    then {"done": true, "prompt_eval_count", "eval_count"}
        GET  /health                a small JSON body
      LOG gets one JSON line per completion: {"id", "path", "entry_ns", "token_ns": [...]}
      (CLOCK_MONOTONIC when the app was handed the request, after the server read its head, and
      just before each event with generated text was handed to the server; the id is the
      completion id, or the x-request-id for NDJSON).

  h2_sse.py granian PORT LOG [CERT KEY]
      the same app under granian (hyper's HTTP/2), one worker process.

  h2_sse.py client URL CONNS STREAMS [ROUTE [PAUSE]]
      CONNS HTTP/2 connections, STREAMS concurrent streaming requests on each (interleaved on the
      connection, max_tokens 6..17), ROUTE "chat" (default) or "generate". One JSON line per
      request: {"id" (the completion id, or the x-request-id sent for NDJSON), "x_request_id",
      "conn", "start_ns", "first_ns", "chunks", "end_ns"}, then "done". With PAUSE: after the
      first round on every connection prints "paused" and waits for a line on stdin, then sends
      a second round on the same connections (to attach the agent to live connections).
Clocks: CLOCK_MONOTONIC, the agent's.
"""
import asyncio
import json
import os
import sys
import time

TOKEN_DELAY_S = float(os.environ.get("TOKEN_DELAY_MS", "3")) / 1000


def now():
    return time.monotonic_ns()


class Log:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1)
        self.next = 0

    def new_id(self):
        self.next += 1
        return f"chatcmpl-h2sse{self.next}"

    def write(self, rid, path, entry_ns, token_ns):
        self.file.write(json.dumps({"id": rid, "path": path, "entry_ns": entry_ns,
                                    "token_ns": token_ns}) + "\n")


def chat_event(rid, delta, finish=None, usage=None):
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "model": "h2-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def make_app(log):
    async def read_body(receive):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                return body

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        entry_ns = now()
        path = scope["path"]
        if path == "/health":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
            return
        body = await read_body(receive)
        try:
            wanted = int(json.loads(body).get("max_tokens", 8))
        except (ValueError, AttributeError):
            wanted = 8
        headers = dict(scope["headers"])
        rid = log.new_id()
        token_ns = []
        if path == "/api/generate":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/x-ndjson")]})
            for i in range(wanted):
                await asyncio.sleep(TOKEN_DELAY_S)
                line = json.dumps({"model": "h2-test", "response": f"tok{i} ", "done": False})
                token_ns.append(now())
                await send({"type": "http.response.body", "body": line.encode() + b"\n",
                            "more_body": True})
            last = {"model": "h2-test", "response": "", "done": True,
                    "prompt_eval_count": 5, "eval_count": wanted}
            await send({"type": "http.response.body", "body": json.dumps(last).encode() + b"\n"})
            log.write(headers.get(b"x-request-id", b"").decode(), path, entry_ns, token_ns)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache")]})
        token_ns.append(now())
        await send({"type": "http.response.body", "more_body": True,
                    "body": chat_event(rid, {"role": "assistant", "content": "tok0 "})})
        for i in range(1, wanted):
            await asyncio.sleep(TOKEN_DELAY_S)
            token_ns.append(now())
            await send({"type": "http.response.body", "more_body": True,
                        "body": chat_event(rid, {"content": f"tok{i} "})})
        usage = {"prompt_tokens": 5, "completion_tokens": wanted, "total_tokens": wanted + 5}
        await send({"type": "http.response.body", "more_body": True,
                    "body": chat_event(rid, {}, finish="length", usage=usage)})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        log.write(rid, path, entry_ns, token_ns)

    return app


# The app as granian imports it (`h2_sse:app`), logging where the serving process was told.
app = make_app(Log(os.environ["H2_SSE_LOG"])) if "H2_SSE_LOG" in os.environ else None


def serve_granian(port, log_path, cert=None, key=None):
    """granian (Rust's hyper under the ASGI app): one worker, HTTP/2 only."""
    args = [os.path.join(os.path.dirname(sys.executable), "granian"), "--interface", "asgi",
            "--http", "2", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--no-ws", "--log-level", "warning"]
    if cert:
        args += ["--ssl-certificate", cert, "--ssl-keyfile", key]
    env = dict(os.environ, H2_SSE_LOG=log_path,
               PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    import subprocess
    import socket
    child = subprocess.Popen(args + ["h2_sse:app"], env=env)
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    print("ready", flush=True)
    try:
        child.wait()
    finally:
        child.terminate()


def serve(port, log_path, cert=None, key=None):
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.keep_alive_timeout = 3600
    config.h2_max_concurrent_streams = 256
    config.accesslog = None
    config.errorlog = "-"
    if cert:
        config.certfile, config.keyfile = cert, key
        config.alpn_protocols = ["h2"]
    app = make_app(Log(log_path))

    async def main():
        task = asyncio.ensure_future(hypercorn_serve(app, config))
        for _ in range(200):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        print("ready", flush=True)
        await task

    asyncio.run(main())


async def one_request(client, url, route, conn, n, seq):
    rid_sent = f"{route}-{conn}-{seq}"
    tokens = 6 + (seq * 7 + conn) % 12
    if route == "generate":
        target, body = url + "/api/generate", {"model": "h2-test", "prompt": "p" * 40,
                                               "max_tokens": tokens, "stream": True}
    else:
        target, body = url + "/v1/chat/completions", {
            "model": "h2-test", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hello " * 10}]}
    start = now()
    first = None
    chunks = 0
    rid = rid_sent
    async with client.stream("POST", target, json=body,
                             headers={"x-request-id": rid_sent}) as response:
        async for line in response.aiter_lines():
            if not line:
                continue
            if route == "generate":
                doc = json.loads(line)
                if doc.get("response"):
                    chunks += 1
                    first = first or now()
                continue
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            rid = doc.get("id", rid)
            if any((c.get("delta") or {}).get("content") for c in doc.get("choices", [])):
                chunks += 1
                first = first or now()
    end = now()
    print(json.dumps({"id": rid, "x_request_id": rid_sent, "conn": conn, "start_ns": start,
                      "first_ns": first, "chunks": chunks, "end_ns": end}), flush=True)


async def client_main(url, conns, streams, route, pause):
    import httpx

    clients = [httpx.AsyncClient(http1=False, http2=True, verify=False,
                                 timeout=60, limits=httpx.Limits(max_connections=1))
               for _ in range(conns)]
    rounds = 2 if pause else 1
    seq = 0
    for r in range(rounds):
        if r == 1:
            print("paused", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await asyncio.gather(*(one_request(c, url, route, i, streams, seq + k)
                               for i, c in enumerate(clients) for k in range(streams)))
        seq += streams
    for c in clients:
        await c.aclose()
    print("done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "granian":
        serve_granian(int(sys.argv[2]), sys.argv[3], *(sys.argv[4:6] if len(sys.argv) > 5 else []))
    elif sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3], *(sys.argv[4:6] if len(sys.argv) > 5 else []))
    else:
        url, conns, streams = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        route = sys.argv[5] if len(sys.argv) > 5 else "chat"
        pause = len(sys.argv) > 6 and sys.argv[6] != "0"
        asyncio.run(client_main(url, conns, streams, route, pause))
