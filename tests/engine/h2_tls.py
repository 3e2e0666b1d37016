"""A gRPC-style HTTP/2 server over TLS (ALPN h2, Python's ssl on OpenSSL): the ground truth for
h2 over TLS. Each stream is answered as a server-streaming call whatever its path: HEADERS
(:status 200, content-type application/grpc), then N length-prefixed messages 2 ms apart
(N = 4 + (stream id // 2) % 20, each of 20 + 7*i bytes), then trailers (grpc-status 0). One frame,
one write. A call whose request body reached LARGE_REQUEST bytes is answered instead with one
message of LARGE_ANSWER bytes, its DATA frames (16 KiB each) written at once (one SSL_write
larger than any capture record). The server does not decode HPACK: the client's headers are the
agent's to read.

  h2_tls.py PORT CERT KEY LOG   prints "ready" once listening; LOG gets one JSON line per
                                stream: {"stream_id", "messages", "message_ns": [...],
                                "headers_ns"} (headers_ns: when its HEADERS frame was read whole)
  h2_tls.py client PORT CALLS GAP_MS
                                one connection (ALPN h2), CALLS calls GAP_MS apart, each sent
                                in one write; prints one JSON line per call {"stream_id",
                                "send_ns", "first_ns"} (before the write; the first message
                                read), then "done"
Clocks: CLOCK_MONOTONIC, the agent's.
"""
import json
import socket
import ssl
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name, value):
    """HPACK literal header field without indexing, new name, no Huffman."""
    name, value = name.encode(), value.encode()
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


RESPONSE_HEADERS = b"\x88" + literal("content-type", "application/grpc")  # :status 200
TRAILERS = literal("grpc-status", "0")


LARGE_REQUEST = 30_000
LARGE_ANSWER = 100_000
MAX_FRAME = 16_384


class Connection:
    def __init__(self, sock, log):
        self.sock = sock
        self.log = log
        self.lock = threading.Lock()
        self.bodies = {}
        self.headers_ns = {}

    def send(self, data, times=None):
        with self.lock:
            if times is not None:
                # Stamped once this thread holds the connection: the hand-off to TLS is next.
                times.append(time.monotonic_ns())
            self.sock.sendall(data)

    def read_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def answer(self, stream):
        if self.bodies.get(stream, 0) >= LARGE_REQUEST:
            return self.answer_large(stream)
        messages = 4 + (stream // 2) % 20
        times = []
        self.send(frame(HEADERS, END_HEADERS, stream, RESPONSE_HEADERS))
        for i in range(messages):
            time.sleep(0.002)
            body = bytes([i % 256]) * (20 + 7 * i)
            self.send(frame(DATA, 0, stream, b"\x00" + struct.pack(">I", len(body)) + body), times)
        self.send(frame(HEADERS, END_HEADERS | END_STREAM, stream, TRAILERS))
        self.log.write(stream, times, self.headers_ns.get(stream))

    def answer_large(self, stream):
        times = []
        self.send(frame(HEADERS, END_HEADERS, stream, RESPONSE_HEADERS))
        body = bytes(i % 251 for i in range(LARGE_ANSWER))
        message = b"\x00" + struct.pack(">I", len(body)) + body
        frames = b"".join(
            frame(DATA, 0, stream, message[at : at + MAX_FRAME])
            for at in range(0, len(message), MAX_FRAME)
        )
        self.send(frames, times)
        self.send(frame(HEADERS, END_HEADERS | END_STREAM, stream, TRAILERS))
        self.log.write(stream, times, self.headers_ns.get(stream))

    def serve(self):
        try:
            if self.read_exact(len(PREFACE)) != PREFACE:
                return
            self.send(frame(SETTINGS, 0, 0))
            while True:
                head = self.read_exact(9)
                length = struct.unpack(">I", b"\x00" + head[:3])[0]
                kind, flags = head[3], head[4]
                stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
                payload = self.read_exact(length) if length else b""
                if kind == HEADERS:
                    self.headers_ns[stream] = time.monotonic_ns()
                if kind == DATA:
                    self.bodies[stream] = self.bodies.get(stream, 0) + len(payload)
                if kind == SETTINGS and not flags & ACK:
                    self.send(frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    self.send(frame(PING, ACK, 0, payload))
                elif kind == GOAWAY:
                    return
                elif kind in (HEADERS, DATA) and flags & END_STREAM:
                    threading.Thread(target=self.answer, args=(stream,), daemon=True).start()
                elif kind == DATA and payload:
                    # Give the client its window back: bodies are small, this keeps it open.
                    self.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload))))
        except (EOFError, OSError, ssl.SSLError):
            pass
        finally:
            self.sock.close()


class Log:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, stream, times, headers_ns):
        with self.lock:
            self.file.write(json.dumps({"stream_id": stream, "messages": len(times), "message_ns": times,
                                        "headers_ns": headers_ns}) + "\n")


def main(port, cert, key, log_path):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", port))
    log = Log(log_path)
    print("ready", flush=True)
    while True:
        raw, _ = listener.accept()
        try:
            sock = context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            continue
        threading.Thread(target=Connection(sock, log).serve, daemon=True).start()


def client(port, calls, gap_ms):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port)))
    assert sock.selected_alpn_protocol() == "h2"
    lock = threading.Lock()
    first = {}
    ended = threading.Event()

    def send(data):
        with lock:
            sock.sendall(data)

    def read_exact(n):
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def reader():
        done = 0
        try:
            while done < calls:
                head = read_exact(9)
                length = struct.unpack(">I", b"\x00" + head[:3])[0]
                kind, flags = head[3], head[4]
                stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
                payload = read_exact(length) if length else b""
                if kind == SETTINGS and not flags & ACK:
                    send(frame(SETTINGS, ACK, 0))
                elif kind == DATA and payload:
                    first.setdefault(stream, time.monotonic_ns())
                    send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload))))
                elif kind == HEADERS and flags & END_STREAM:
                    done += 1
        finally:
            ended.set()

    send(PREFACE + frame(SETTINGS, 0, 0))
    threading.Thread(target=reader, daemon=True).start()
    sent = {}
    block = b"".join(literal(n, v) for n, v in [
        (":method", "POST"), (":scheme", "https"), (":path", "/inferscope.test.Gen/Stream"),
        (":authority", "127.0.0.1"), ("content-type", "application/grpc"), ("te", "trailers")])
    for i in range(calls):
        time.sleep(gap_ms / 1000)
        stream = 1 + 2 * i
        message = b"\x00" + struct.pack(">I", 1) + b"\x05"
        data = frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, message)
        with lock:
            # Stamped once the connection is this thread's: the write is next.
            sent[stream] = time.monotonic_ns()
            sock.sendall(data)
    ended.wait(timeout=60)
    send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
    sock.close()
    for stream, send_ns in sent.items():
        print(json.dumps({"stream_id": stream, "send_ns": send_ns, "first_ns": first.get(stream)}), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
