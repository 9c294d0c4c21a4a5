"""The socket edge of the exchange strategies: one TCP connection per pair of roles that talk,
frames of netbench.jobs.exchange on it, and a threaded listener that answers requests.

Nothing here knows an algorithm: `Listener` hands each message to a handler (which may block:
a barrier) and sends back what it returns; `Channel` sends a message and, for a request, reads
the reply. Addresses are the nodes' own (from TF_CONFIG's cluster), so the bytes cross the
shaped links between the two nodes and nothing else.

Safety (docs/guide/exchange-protocol.md): a listener takes a connection only when its first
frame is a hello carrying the run's token (checked from the header, before any array is
read); every frame is bounded by the model's shapes (`exchange.FrameCap`); every socket has
TCP keepalive and TCP_USER_TIMEOUT, so a peer cut off by a partition ends its connection with
an error rather than silence; a connection that ends without a goodbye is reported
(`on_lost`), and a handler's unexpected error is kept in `errors`, answered with an error
frame, and sets `failed` (the role's main thread reads it and fails the run).
"""

from __future__ import annotations

import hmac
import os
import socket
import threading
import time
from typing import Callable, Mapping

from netbench.jobs import exchange

CONNECT_RETRY_S = 0.2


class RemoteError(ConnectionError):
    """The other side answered with an error frame (the message names it and says why)."""


def run_token(environ: Mapping[str, str] = os.environ) -> str:
    """The run's token from the controller (exchange.TOKEN_ENV); refuses to start without one."""
    token = environ.get(exchange.TOKEN_ENV, "")
    if not token:
        raise RuntimeError(f"{exchange.TOKEN_ENV} is not set: the exchange's roles take the run's token "
                           "from the controller (netbench sweep / run start them)")
    return token


def run_limits(environ: Mapping[str, str] = os.environ) -> exchange.Limits:
    """The exchange's limits from the controller's step timeout (exchange.TIMEOUT_ENV)."""
    try:
        step_s = float(environ.get(exchange.TIMEOUT_ENV, "") or exchange.DEFAULT_STEP_TIMEOUT_S)
    except ValueError:
        step_s = exchange.DEFAULT_STEP_TIMEOUT_S
    return exchange.Limits(step_s if step_s > 0 else exchange.DEFAULT_STEP_TIMEOUT_S)


def _tune(sock: socket.socket, limits: exchange.Limits) -> None:
    # each message is a whole request: no Nagle delay behind its last segment
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # a peer that stops acknowledging (cut off, its host gone) ends the connection with an
    # error within liveness_s, idle or not; a live peer that is merely slow never does
    live = limits.liveness_s
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", max(1, int(live / 3))), ("TCP_KEEPINTVL", max(1, int(live / 6))),
                        ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", int(live * 1000))):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class Channel:
    """A connection to one server or peer; one request at a time (callers serialise).
    `cap` bounds the frames it reads (the model's or a shard's shapes; None: only
    exchange.MAX_FRAME_BYTES); an error frame raises ConnectionError naming `name`."""

    def __init__(self, sock: socket.socket, limits: exchange.Limits | None = None, name: str = "") -> None:
        _tune(sock, limits or exchange.Limits())
        self.sock = sock
        self.name = name or "peer"
        self.cap: exchange.FrameCap | None = None
        self._read = exchange.exact_reader(sock.recv_into)
        self.lock = threading.Lock()

    @classmethod
    def connect(cls, address: str, timeout_s: float, limits: exchange.Limits | None = None) -> "Channel":
        """Connect to "host:port", retrying until `timeout_s` (the other side may be starting)."""
        host, port = address.rsplit(":", 1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(socket.create_connection((host, int(port)), timeout=None), limits, address)
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing listens at {address} after {timeout_s:g}s") from None
                time.sleep(CONNECT_RETRY_S)

    def send(self, message: exchange.Message) -> None:
        self.sock.sendall(exchange.encode(message))

    def receive(self, admit: Callable[[str, dict], None] | None = None) -> exchange.Message:
        message = exchange.decode(self._read, self.cap, admit)
        if message.op == exchange.ERROR:
            raise RemoteError(f"{self.name}: {message.meta.get('message', 'an error without a message')}")
        return message

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
CapSource = Callable[[], "exchange.FrameCap | None"]


class Listener:
    """Accepts connections on host:port; a thread per connection reads messages and sends back
    the handler's reply (None: no reply).

    A connection's first frame must be a hello with `token` (else it is closed, and noted in
    `refused`: nothing of the run is touched). `cap` (a FrameCap, or a function giving the
    current one: a server learns its shard's shapes at worker 0's hello) bounds every frame.
    `on_lost(worker, cause)` hears of a connection that ended without a goodbye (the worker
    its hello named); `errors` keeps what broke a connection after its hello, and `failed` is
    set when one broke on an unexpected error (a handler's fault, a bad frame)."""

    def __init__(self, host: str, port: int, handler: Handler, token: str,
                 cap: exchange.FrameCap | CapSource | None = None, limits: exchange.Limits | None = None,
                 on_lost: Callable[[int, str], None] | None = None) -> None:
        if not token:
            raise ValueError("a listener needs the run's token")
        self.handler, self.token, self.limits, self.on_lost = handler, token, limits or exchange.Limits(), on_lost
        self._cap = cap if callable(cap) else (lambda: cap)
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.failed = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return  # closed
            channel = Channel(conn, self.limits, f"{peer[0]}:{peer[1]}")
            threading.Thread(target=self._serve, args=(channel,), daemon=True).start()

    def _admit(self, op: str, meta: dict) -> None:
        if op != exchange.HELLO:
            raise exchange.ProtocolError(f"a {op!r} frame before the hello")
        if not hmac.compare_digest(str(meta.get("token", "")).encode(), self.token.encode()):
            raise exchange.ProtocolError("a hello without the run's token")

    def _serve(self, channel: Channel) -> None:
        try:
            channel.cap = self._cap()
            first = channel.receive(self._admit)
        except (OSError, EOFError, exchange.ProtocolError) as exc:
            self.refused.append(f"{channel.name}: {type(exc).__name__}: {exc}")
            channel.close()
            return
        who = int(first.meta.get("worker", -1)) if str(first.meta.get("worker", "")).lstrip("-").isdigit() else -1
        name = f"worker {who} ({channel.name})"
        said_bye, lost = False, ""
        message: exchange.Message | None = first
        try:
            while True:
                if message is None:
                    channel.cap = self._cap()
                    try:
                        message = channel.receive()
                    except EOFError:
                        lost = "" if said_bye else "its connection ended without a goodbye"
                        return
                said_bye = said_bye or message.op == exchange.BYE
                reply = self.handler(message)
                message = None
                if reply is not None:
                    channel.send(reply)
        except OSError as exc:  # reset, or cut off (keepalive, TCP_USER_TIMEOUT)
            lost = "" if said_bye else f"its connection failed ({type(exc).__name__}: {exc})"
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bad frame or a handler's fault: reported, never silent
            lost = f"its connection broke ({type(exc).__name__}: {exc})"
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            self.failed.set()
            try:
                channel.send(exchange.Message(exchange.ERROR, {"message": f"{type(exc).__name__}: {exc}"}))
            except (OSError, ValueError):
                pass
        finally:
            channel.close()
            if lost and self.on_lost is not None:
                self.on_lost(who, f"{name}: {lost}")

    def failure(self) -> str | None:
        """The first unexpected error of a connection, once one broke (None: none did)."""
        return self.errors[0] if self.failed.is_set() and self.errors else None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
