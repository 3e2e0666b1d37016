"""HTTPS servers that stream OpenAI-style SSE, and a client that counts what it received: the
ground truth for the agent's TLS probes. Both servers log, per request, the CLOCK_MONOTONIC time
just before each token event was handed to the TLS library, the server's own truth for TTFT.

  tls_sse.py uvicorn PORT CERT KEY LOG   uvicorn on uvloop (ssl.MemoryBIO: the event loop moves
                                         the ciphertext, as under vLLM and SGLang)
  tls_sse.py threaded PORT CERT KEY LOG  http.server threads on ssl.SSLSocket (OpenSSL reads
                                         and writes the socket itself)
  Both print "ready" once the port accepts connections; LOG gets one JSON line per request:
  {"id", "token_ns": [...], "events"}.

  tls_sse.py load PORT CONNS REQS [PAUSE [MODEL]]
      CONNS keep-alive HTTPS connections, REQS requests each (POST /v1/chat/completions, stream,
      max_tokens 8..31, to MODEL, default "tls-test"). One JSON line per request: {"id",
      "events" (those with generated text), "start_ns", "first_ns", "end_ns", "phase"}, then
      "done" ("conn": which of the CONNS connections carried it). With PAUSE > 0, after PAUSE requests per connection prints "paused" and waits for
      a line on stdin (to attach the agent to live TLS connections).
"""
import json
import os
import socket
import ssl
import sys
import threading
import time

DONE = b"data: [DONE]\n\n"
# Pause between token events (ms): a generating engine's pace; 0 for throughput benchmarks.
TOKEN_DELAY_S = float(os.environ.get("TLS_SSE_TOKEN_DELAY_MS", "2")) / 1000


def event(rid, i):
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "tls-test",
        "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


class Log:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.next = 0

    def new_id(self):
        with self.lock:
            self.next += 1
            return f"chatcmpl-tls{self.next}"

    def write(self, rid, token_ns):
        with self.lock:
            self.file.write(json.dumps({"id": rid, "token_ns": token_ns, "events": len(token_ns)}) + "\n")


def tokens_wanted(body):
    try:
        return int(json.loads(body or b"{}").get("max_tokens", 16))
    except (ValueError, AttributeError):
        return 16


def announce_when_listening(port):
    def wait():
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                print("ready", flush=True)
                return
            except OSError:
                time.sleep(0.05)

    threading.Thread(target=wait, daemon=True).start()


def serve_uvicorn(port, cert, key, log_path):
    import asyncio

    import uvicorn

    log = Log(log_path)

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        n = tokens_wanted(body)
        rid = log.new_id()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )
        token_ns = []
        for i in range(n):
            await asyncio.sleep(TOKEN_DELAY_S)
            data = event(rid, i)
            token_ns.append(time.monotonic_ns())
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": DONE, "more_body": False})
        log.write(rid, token_ns)

    announce_when_listening(port)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        ssl_certfile=cert,
        ssl_keyfile=key,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


def serve_threaded(port, cert, key, log_path):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    log = Log(log_path)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            n = tokens_wanted(self.rfile.read(length))
            rid = log.new_id()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            token_ns = []
            for i in range(n):
                time.sleep(TOKEN_DELAY_S)
                data = event(rid, i)
                token_ns.append(time.monotonic_ns())
                # One chunk, one write: one SSL_write per token event.
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE))
            self.wfile.flush()
            log.write(rid, token_ns)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 64

    httpd = Server(("127.0.0.1", port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    announce_when_listening(port)
    httpd.serve_forever()


def has_text(event):
    choices = event.get("choices") or []
    if not choices:
        return False
    choice = choices[0]
    return bool((choice.get("delta") or {}).get("content") or choice.get("text"))


def load(port, conns, reqs, pause, model):
    import http.client

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    lock = threading.Lock()
    paused = threading.Barrier(conns + 1) if pause else None
    go = threading.Event()
    failures = []

    def one(connection, n, phase, k):
        body = json.dumps(
            {
                "model": model,
                "stream": True,
                "max_tokens": n,
                "ignore_eos": True,
                # Words of the vLLM test model's vocabulary: one token each.
                "messages": [{"role": "user", "content": " ".join(f"w{300 + k}" for k in range(12))}],
            }
        )
        if connection.sock is None:
            # The handshake first: `start_ns` is when the request's own bytes were sent.
            connection.connect()
        start = time.monotonic_ns()
        connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        response = connection.getresponse()
        first = None
        events = 0
        rid = None
        while True:
            line = response.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                continue
            parsed = json.loads(line[6:])
            rid = rid or parsed.get("id")
            if not has_text(parsed):
                continue
            if first is None:
                first = time.monotonic_ns()
            events += 1
        end = time.monotonic_ns()
        with lock:
            print(
                json.dumps(
                    {
                        "id": rid,
                        "events": events,
                        "start_ns": start,
                        "first_ns": first,
                        "end_ns": end,
                        "phase": phase,
                        "conn": k,
                    }
                ),
                flush=True,
            )

    def worker(k):
        try:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
            for j in range(reqs):
                if pause and j == pause:
                    paused.wait()
                    go.wait()
                n = 8 + (k * 7 + j * 3) % 24
                one(connection, n, "after" if pause and j >= pause else "before", k)
            connection.close()
        except Exception as e:  # noqa: BLE001 - reported, and the run fails
            with lock:
                failures.append(repr(e))
            if paused is not None:
                paused.abort()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(conns)]
    for t in threads:
        t.start()
    if pause:
        paused.wait()
        print("paused", flush=True)
        sys.stdin.readline()
        go.set()
    for t in threads:
        t.join()
    if failures:
        print(json.dumps({"failures": failures}), flush=True)
        sys.exit(1)
    print("done", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "uvicorn":
        serve_uvicorn(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    elif mode == "threaded":
        serve_threaded(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    elif mode == "load":
        load(
            int(sys.argv[2]),
            int(sys.argv[3]),
            int(sys.argv[4]),
            int(sys.argv[5]) if len(sys.argv) > 5 else 0,
            sys.argv[6] if len(sys.argv) > 6 else "tls-test",
        )
    else:
        sys.exit(f"unknown mode {mode}")
