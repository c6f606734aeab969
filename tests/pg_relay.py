"""A TCP relay to the test's Postgres that can go silent (issue 25: "the
wake-up connection can die silently").

``BlackholeRelay(url)`` listens on 127.0.0.1 (an ephemeral port; ``url`` is
the address to give a client) and relays each connection to ``url``'s
server, bytes as they come. ``blackhole(marker)`` turns every connection
open now whose startup packet contains ``marker`` (e.g. the listener's
``application_name``, ``b"vpay-listener"``) into a black hole: both sockets
stay open and are still read (the kernel acknowledges everything, as a NAT
that dropped its mapping or a stuck proxy would let it), but nothing is
forwarded either way, and no FIN or RST is ever sent. Connections made
afterwards are relayed normally, so a client that gives up on a dead one
can replace it. The upstream may be TCP or a Unix socket (pgserver's).
"""

from __future__ import annotations

import socket
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket):
        self.client = client
        self.server = server
        self.startup = b""
        self.silent = threading.Event()


class BlackholeRelay:
    """See the module docstring. ``close()`` closes every socket."""

    def __init__(self, url: str):
        parts = conninfo_to_dict(url)
        host = parts.get("host") or "/tmp"
        port = int(parts.get("port") or 5432)
        self._target = ((socket.AF_UNIX, f"{host}/.s.PGSQL.{port}") if host.startswith("/")
                        else (socket.AF_INET, (host, port)))
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = make_conninfo(url, host="127.0.0.1", port=self._sock.getsockname()[1],
                                 sslmode="disable", gssencmode="disable")
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self.silenced = 0
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def blackhole(self, marker: bytes) -> int:
        """Silence every open connection whose startup packet contains
        ``marker``; answers how many."""
        n = 0
        with self._lock:
            for pair in self._pairs:
                if marker in pair.startup and not pair.silent.is_set():
                    pair.silent.set()
                    n += 1
        self.silenced += n
        return n

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            server = socket.socket(self._target[0], socket.SOCK_STREAM)
            try:
                server.connect(self._target[1])
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, server, client, False), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_client and len(pair.startup) < 4096:
                    pair.startup += data  # SSL refusal aside, the first bytes name the client
                if pair.silent.is_set():
                    continue  # read and dropped: the peer's kernel keeps acknowledging
                dst.sendall(data)
        except OSError:
            pass
        if pair.silent.is_set():
            return  # a black hole never closes: no FIN, no RST
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in (pair.client, pair.server):
                try:
                    s.close()
                except OSError:
                    pass
