"""A raw-socket HTTP/1.1 receiver on 127.0.0.1 for the webhook transport's
tests (tests/unit/test_webhook_keepalive.py, test_webhook_transport_edges.py):
each accepted connection, plain or TLS, is handed to a script that reads
requests and writes whatever bytes it likes, so a test can answer late, cut
an answer short, close or reset a kept connection."""

from __future__ import annotations

import socket
import ssl
import threading


class ConnReceiver:
    """Each accepted connection is handed to ``script(number, sock, rx)``
    (plain or TLS). ``rx.requests`` counts requests read with ``read``."""

    def __init__(self, script, tls_ctx=None, host="127.0.0.1"):
        self.script = script
        self.tls_ctx = tls_ctx
        self.connections = 0
        self.requests: list[tuple[int, int]] = []
        self.listener = socket.create_server((host, 0), backlog=128)
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, scheme="http", host="127.0.0.1"):
        return f"{scheme}://{host}:{self.listener.getsockname()[1]}/hook"

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._run, args=(sock, self.connections), daemon=True).start()

    def _run(self, sock, number):
        if self.tls_ctx is not None:
            try:
                sock = self.tls_ctx.wrap_socket(sock, server_side=True)
            except (OSError, ssl.SSLError):
                return
        try:
            self.script(number, sock, self)
        except OSError:
            pass

    @staticmethod
    def read_head(sock, buf=b""):
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                return None, buf
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        return head, rest

    def read(self, sock, number, buf=b""):
        head, rest = self.read_head(sock, buf)
        if head is None:
            return None, b""
        length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                       if x.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            data = sock.recv(1 << 20)
            if not data:
                return None, b""
            rest += data
        self.requests.append((number, sum(1 for n, _ in self.requests if n == number) + 1))
        return head, rest[length:]

    def close(self):
        self.listener.close()
