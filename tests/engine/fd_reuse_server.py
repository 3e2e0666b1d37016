"""A small real HTTP server whose file descriptors are reused the ways that used to confuse a
profiler that classified fds after the fact. One thread, one connection at a time, each answered
with an OpenAI-style SSE stream and closed, so the next accept gets the lowest free fd number.

Connection i runs scenario SCENARIOS[i // PER]:
  file-before-accept  reads a small file just before accept (the fd number the accept then gets)
  late-accept         accepts 20 ms after the client's bytes arrived
  file-after-close    opens and reads a file right after every close (the connection's number)
  server-closes-first writes two events, then closes mid-stream
Usage: fd_reuse_server.py PORT PER [mptcp]
  mptcp: listen with IPPROTO_MPTCP, as Go 1.24's listeners do where the kernel allows it (a
  plain TCP client's connection is then accepted as plain TCP).
"""
import os
import select
import socket
import sys
import time

SCENARIOS = ["file-before-accept", "late-accept", "file-after-close", "server-closes-first"]


def read_small_file():
    fd = os.open("/proc/self/stat", os.O_RDONLY)
    os.read(fd, 4096)
    os.close(fd)


def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head


def chunk(payload):
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(rid, text):
    return chunk(b'data: {"id":"%s","choices":[{"delta":{"content":"%s"}}]}\n\n' % (rid, text))


def main():
    port, per = int(sys.argv[1]), int(sys.argv[2])
    protocol = 262 if sys.argv[3:] == ["mptcp"] else 0  # IPPROTO_MPTCP (Python 3.10+ names it)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, protocol)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    print("ready", flush=True)
    i = 0
    while True:
        scenario = SCENARIOS[(i // per) % len(SCENARIOS)]
        if scenario == "file-before-accept":
            read_small_file()
        if scenario == "late-accept":
            # Wait for the client's connection (its request follows at once), then 20 ms more
            # with the request queued on the not-yet-accepted connection: counted from the
            # connection, not from the previous response (the client's next connect can come
            # several ms after it on a loaded machine).
            select.select([listener], [], [])
            time.sleep(0.02)
        conn, _ = listener.accept()
        rid = b"chatcmpl-%s-%d" % (scenario.encode(), i)
        i += 1
        if read_request(conn) is None:
            conn.close()
            continue
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        time.sleep(0.002)
        conn.sendall(event(rid, b"Hello"))
        time.sleep(0.002)
        conn.sendall(event(rid, b" world"))
        if scenario == "server-closes-first":
            conn.close()
            continue
        time.sleep(0.002)
        conn.sendall(event(rid, b"!"))
        conn.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        conn.close()
        if scenario == "file-after-close":
            read_small_file()


if __name__ == "__main__":
    main()
