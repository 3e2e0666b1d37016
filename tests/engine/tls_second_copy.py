"""An HTTPS server that serves through a second copy of OpenSSL, loaded after start-up: the
ground truth for the agent probing every copy a process maps, not only those it saw at attach.

  tls_second_copy.py PORT CERT KEY LOG COPY
      imports Python's ssl (the system's libssl is mapped), prints "ready", and waits for a
      line on stdin (the agent attaches meanwhile). Then copies the system's libssl to COPY (a
      wheel's bundled copy has a path of its own), loads it, and serves HTTPS through it with
      ctypes: one request per connection, answered with N server-sent events (N: the
      request body's `max_tokens`), 2 ms apart. Prints "serving" once the copy is loaded. LOG
      gets one JSON line per request: {"events", "token_ns": [...]} (CLOCK_MONOTONIC, just
      before each event was handed to the copy's SSL_write).
"""
import ctypes
import json
import re
import shutil
import socket
import ssl  # noqa: F401  (maps the system's libssl before the agent attaches)
import sys
import time

SYSTEM_LIBSSL = "/usr/lib/x86_64-linux-gnu/libssl.so.3"
SSL_FILETYPE_PEM = 1


def load(copy):
    shutil.copyfile(SYSTEM_LIBSSL, copy)
    lib = ctypes.CDLL(copy, mode=ctypes.RTLD_LOCAL)
    p, i = ctypes.c_void_p, ctypes.c_int
    for name, args, res in [
        ("TLS_server_method", [], p),
        ("SSL_CTX_new", [p], p),
        ("SSL_CTX_use_certificate_chain_file", [p, ctypes.c_char_p], i),
        ("SSL_CTX_use_PrivateKey_file", [p, ctypes.c_char_p, i], i),
        ("SSL_new", [p], p),
        ("SSL_set_fd", [p, i], i),
        ("SSL_accept", [p], i),
        ("SSL_read", [p, ctypes.c_char_p, i], i),
        ("SSL_write", [p, ctypes.c_char_p, i], i),
        ("SSL_shutdown", [p], i),
        ("SSL_free", [p], None),
    ]:
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


def serve(port, cert, key, log_path, copy):
    listener = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    sys.stdin.readline()
    lib = load(copy)
    ctx = lib.SSL_CTX_new(lib.TLS_server_method())
    assert lib.SSL_CTX_use_certificate_chain_file(ctx, cert.encode()) == 1
    assert lib.SSL_CTX_use_PrivateKey_file(ctx, key.encode(), SSL_FILETYPE_PEM) == 1
    print("serving", flush=True)
    log = open(log_path, "a", buffering=1)
    buf = ctypes.create_string_buffer(65536)
    while True:
        conn, _ = listener.accept()
        s = lib.SSL_new(ctx)
        lib.SSL_set_fd(s, conn.fileno())
        if lib.SSL_accept(s) != 1:
            lib.SSL_free(s)
            conn.close()
            continue
        request = b""
        while b"\r\n\r\n" not in request or len(request) < body_end(request):
            n = lib.SSL_read(s, buf, len(buf))
            if n <= 0:
                break
            request += buf.raw[:n]
        m = re.search(rb'"max_tokens":\s*(\d+)', request)
        n_events = int(m.group(1)) if m else 4
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        lib.SSL_write(s, head, len(head))
        stamps = []
        for k in range(n_events):
            time.sleep(0.002)
            data = b'data: {"choices":[{"delta":{"content":"tok%d "}}]}\n\n' % k
            chunk = b"%x\r\n%s\r\n" % (len(data), data)
            stamps.append(time.monotonic_ns())
            lib.SSL_write(s, chunk, len(chunk))
        done = b"data: [DONE]\n\n"
        tail = b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)
        lib.SSL_write(s, tail, len(tail))
        log.write(json.dumps({"events": n_events, "token_ns": stamps}) + "\n")
        lib.SSL_shutdown(s)
        lib.SSL_free(s)
        conn.close()


def body_end(request):
    head, _, _ = request.partition(b"\r\n\r\n")
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    return len(head) + 4 + (int(m.group(1)) if m else 0)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
