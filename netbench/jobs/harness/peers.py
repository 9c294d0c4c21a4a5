"""The socket edge of the exchange strategies: one TCP connection per pair of roles that talk,
frames of netbench.jobs.exchange on it, and a threaded listener that answers requests.

Nothing here knows an algorithm: `Listener` hands each message to a handler (which may block:
a barrier) and sends back what it returns; `Channel` sends a message and, for a request, reads
the reply. Addresses are the nodes' own (from TF_CONFIG's cluster), so the bytes cross the
shaped links between the two nodes and nothing else.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from netbench.jobs import exchange

CONNECT_RETRY_S = 0.2


def _tune(sock: socket.socket) -> None:
    # each message is a whole request: no Nagle delay behind its last segment
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Channel:
    """A connection to one server or peer; one request at a time (callers serialise)."""

    def __init__(self, sock: socket.socket) -> None:
        _tune(sock)
        self.sock = sock
        self._read = exchange.exact_reader(sock.recv_into)
        self.lock = threading.Lock()

    @classmethod
    def connect(cls, address: str, timeout_s: float) -> "Channel":
        """Connect to "host:port", retrying until `timeout_s` (the other side may be starting)."""
        host, port = address.rsplit(":", 1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(socket.create_connection((host, int(port)), timeout=None))
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing listens at {address} after {timeout_s:g}s") from None
                time.sleep(CONNECT_RETRY_S)

    def send(self, message: exchange.Message) -> None:
        self.sock.sendall(exchange.encode(message))

    def receive(self) -> exchange.Message:
        return exchange.decode(self._read)

    def request(self, message: exchange.Message) -> exchange.Message:
        with self.lock:
            self.send(message)
            return self.receive()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


Handler = Callable[[exchange.Message], "exchange.Message | None"]


class Listener:
    """Accepts connections on host:port; a thread per connection reads messages and sends back
    the handler's reply (None: no reply). `errors` keeps what broke a connection."""

    def __init__(self, host: str, port: int, handler: Handler) -> None:
        self.handler = handler
        self.errors: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(Channel(conn),), daemon=True).start()

    def _serve(self, channel: Channel) -> None:
        try:
            while True:
                try:
                    message = channel.receive()
                except EOFError:
                    return
                reply = self.handler(message)
                if reply is not None:
                    channel.send(reply)
        except (OSError, exchange.ProtocolError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            channel.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
