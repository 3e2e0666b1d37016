#!/usr/bin/env python3
"""The disaggregated prefill/decode proxy of vLLM's example
(examples/online_serving/disaggregated_serving/toy_proxy_server.py), with the standard library:
for each /v1/completions or /v1/chat/completions request it
1. sends the request to the prefill server with `kv_transfer_params: {"do_remote_decode": true,
   "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null,
   "remote_host": null, "remote_port": null}`, `stream: false`, `max_tokens: 1` (and
   `max_completion_tokens: 1`), and an `X-Request-Id` it makes (the same for both legs);
2. takes the response's `kv_transfer_params`;
3. sends the original request with them to the decode server and streams its answer back.

    python3 disagg_proxy.py --port N --prefill HOST:PORT --decode HOST:PORT [--truth FILE]

With --truth it writes one JSON line per request: `x_request_id`, and CLOCK_MONOTONIC seconds
`arrival` (its body read), `prefill_sent`, `prefill_answered`, `decode_sent`, `first_byte`
(the decode server's first body bytes relayed), `end`: the client's view, from the proxy.
"""
import argparse
import http.client
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prefill", required=True)
    p.add_argument("--decode", required=True)
    p.add_argument("--truth")
    a = p.parse_args()
    truth = open(a.truth, "a", buffering=1) if a.truth else None
    lock = threading.Lock()

    def hostport(s):
        host, port = s.rsplit(":", 1)
        return host, int(port)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            stamps = {"arrival": time.monotonic()}
            req = json.loads(body)
            request_id = str(uuid.uuid4())
            headers = {"Content-Type": "application/json", "X-Request-Id": request_id}

            prefill = dict(req)
            prefill["kv_transfer_params"] = {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            }
            prefill["stream"] = False
            prefill["max_tokens"] = 1
            if "max_completion_tokens" in prefill:
                prefill["max_completion_tokens"] = 1
            prefill.pop("stream_options", None)
            c = http.client.HTTPConnection(*hostport(a.prefill), timeout=120)
            stamps["prefill_sent"] = time.monotonic()
            c.request("POST", self.path, json.dumps(prefill), headers)
            r = c.getresponse()
            answer = json.loads(r.read())
            stamps["prefill_answered"] = time.monotonic()
            c.close()

            decode = dict(req)
            kv = answer.get("kv_transfer_params")
            if kv:
                decode["kv_transfer_params"] = kv
            d = http.client.HTTPConnection(*hostport(a.decode), timeout=120)
            stamps["decode_sent"] = time.monotonic()
            d.request("POST", self.path, json.dumps(decode), headers)
            r = d.getresponse()
            self.send_response(r.status)
            self.send_header("Content-Type", r.getheader("Content-Type", "application/json"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    break
                stamps.setdefault("first_byte", time.monotonic())
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            d.close()
            stamps["end"] = time.monotonic()
            if truth is not None:
                with lock:
                    truth.write(json.dumps({"x_request_id": request_id, **stamps}) + "\n")

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
