"""A Postgres wire-protocol proxy that counts round trips (bench and tests).

A client waits for the server once per *synchronisation point*: a ``Sync``
message (``S``, the end of an extended-protocol batch: Parse/Bind/Execute)
or a simple ``Query`` (``Q``). Each one is answered by exactly one
``ReadyForQuery``, so counting them on the way in counts the round trips a
client made, whatever its driver (psycopg, libpq in pgbench). Nothing else is
altered: bytes are relayed as they come.

    proxy = CountingProxy(upstream_url).start()
    url = proxy.url            # point the client here (sslmode=disable)
    before = proxy.total()
    ...                        # run the client
    per_job = (proxy.total() - before) / jobs

``proxy.by_statement()`` attributes each round trip to the last statement of
its batch (first line, 60 characters), so a report can say *which* round
trips a job costs (a pool's liveness check is the empty query ``''``).

TLS is refused on the proxy (``SSLRequest`` answered ``N``), so the stream
stays readable; the upstream may be TCP or a Unix socket (pgserver's).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter

from psycopg.conninfo import conninfo_to_dict, make_conninfo

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104
_CANCEL_REQUEST = 80877102


def _upstream_address(url: str) -> tuple[int, object]:
    parts = conninfo_to_dict(url)
    host = parts.get("host") or "/var/run/postgresql"
    port = int(parts.get("port") or 5432)
    if host.startswith("/"):
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    return socket.AF_INET, (host, port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


class CountingProxy:
    """Listens on 127.0.0.1 (an ephemeral port) and relays each client to
    ``upstream_url``'s server, counting the client's ``Sync`` and ``Query``
    messages. Thread-safe counters; ``stop()`` closes the listener (open
    relays end when their peers close)."""

    def __init__(self, upstream_url: str):
        self.upstream_url = upstream_url
        self._family, self._address = _upstream_address(upstream_url)
        self._lock = threading.Lock()
        self._total = 0
        self._statements: Counter[str] = Counter()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        """``upstream_url`` rewritten to reach the server through the proxy."""
        parts = conninfo_to_dict(self.upstream_url)
        parts.update(host="127.0.0.1", port=str(self.port), sslmode="disable")
        parts.pop("hostaddr", None)
        return make_conninfo(**parts)

    def start(self) -> "CountingProxy":
        self._listener.listen(64)
        threading.Thread(target=self._accept, name="pgcount-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.close()
        except OSError:
            pass

    def total(self) -> int:
        """Round trips counted so far, over every client connection."""
        with self._lock:
            return self._total

    def by_statement(self) -> Counter[str]:
        """Round trips so far by the last statement of each batch."""
        with self._lock:
            return Counter(self._statements)

    # ---- relay ---------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="pgcount-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            # Startup phase: refuse TLS/GSS so the stream stays plain.
            while True:
                length = struct.unpack("!i", _recv_exact(client, 4))[0]
                body = _recv_exact(client, length - 4)
                code = struct.unpack("!i", body[:4])[0]
                if code in (_SSL_REQUEST, _GSS_REQUEST):
                    client.sendall(b"N")
                    continue
                break
            upstream = socket.socket(self._family, socket.SOCK_STREAM)
            upstream.connect(self._address)
            upstream.sendall(struct.pack("!i", length) + body)
            if code == _CANCEL_REQUEST:
                upstream.close()
                client.close()
                return
        except (OSError, ConnectionError, struct.error):
            client.close()
            return
        threading.Thread(target=self._pipe, args=(upstream, client), name="pgcount-down",
                         daemon=True).start()
        self._count_up(client, upstream)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _count_up(self, src: socket.socket, dst: socket.socket) -> None:
        buf = b""
        names: dict[bytes, str] = {}   # prepared statement name -> text
        last = ""
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
                buf += chunk
                while len(buf) >= 5:
                    kind = buf[:1]
                    length = struct.unpack("!i", buf[1:5])[0]
                    if len(buf) < 1 + length:
                        break
                    body, buf = buf[5:1 + length], buf[1 + length:]
                    if kind == b"P":
                        name, rest = body.split(b"\0", 1)
                        text = rest.split(b"\0", 1)[0].decode(errors="replace")
                        names[name] = text
                        last = text
                    elif kind == b"B":
                        _portal, stmt, _ = body.split(b"\0", 2)
                        last = names.get(stmt, last)
                    elif kind == b"Q":
                        self._add(body.rstrip(b"\0").decode(errors="replace"))
                    elif kind == b"S":
                        self._add(last)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _add(self, statement: str) -> None:
        key = " ".join(statement.split())[:60]
        with self._lock:
            self._total += 1
            self._statements[key] += 1
