"""The socket edge of the exchange strategies: one TCP connection per pair of roles that talk,
frames of netbench.jobs.exchange on it, and a threaded listener that answers requests.

Nothing here knows an algorithm: `Listener` hands each message to a handler (which may block:
a barrier) and sends back what it returns; `Channel` sends a message and, for a request, reads
the reply. Addresses are the nodes' own (from TF_CONFIG's cluster), so the bytes cross the
shaped links between the two nodes and nothing else.

Safety (docs/guide/exchange-protocol.md): a listener takes a connection only when its first
frame is a hello carrying the run's token (checked from the header, before any array is
read), and only if that header arrives whole within `hello_s` of the connection (one that
sends nothing, or a byte now and then, is closed); at most `max_waiting` connections wait for
their hello at once (the oldest is closed for a newer one), and an accept that fails (out of
file descriptors: EMFILE; a connection reset before it was taken: ECONNABORTED) is retried
with a backoff, closing the oldest waiting connection to free a descriptor: strangers can
neither hold a listener's threads nor stop it from accepting the run's own roles; every frame is bounded by the model's shapes (`exchange.FrameCap`); every socket has
TCP keepalive and TCP_USER_TIMEOUT, so a peer cut off by a partition ends its connection with
an error rather than silence; a connection that ends without a goodbye is reported
(`on_lost`), and a handler's unexpected error is kept in `errors`, answered with an error
frame, and sets `failed` (the role's main thread reads it and fails the run).
"""

from __future__ import annotations

import errno
import hmac
import os
import socket
import threading
import time
from typing import Callable, Mapping

from netbench.jobs import exchange

CONNECT_RETRY_S = 0.2
MAX_WAITING = 64  # connections that have not said hello yet, at once
MAX_NOTED = 100  # refusals kept word for word (`refused`); all are counted (`refused_total`)
ACCEPT_BACKOFF_S = (0.01, 1.0)  # a failing accept's first and longest pause
# accept's errors that mean "out of a resource" (a free descriptor, memory): back off and retry
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# accept's errors that mean the listening socket itself is gone (closed)
_CLOSED = (errno.EBADF, errno.EINVAL, errno.ENOTSOCK)


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
        self.deadline: float | None = None  # monotonic: reads past it fail (a listener's hello)
        self.dropped: str | None = None  # why a listener closed it before its hello
        self._read = exchange.exact_reader(self._recv_into)
        self.lock = threading.Lock()

    def _recv_into(self, view: memoryview) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the deadline passed")
            self.sock.settimeout(left)  # the whole frame's deadline, however the bytes trickle in
        return self.sock.recv_into(view)

    def wait_without_deadline(self) -> None:
        self.deadline = None
        self.sock.settimeout(None)

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

    A connection's first frame must be a hello with `token` whose header arrives within
    `hello_s` (default: limits.hello_s), else it is closed and noted in `refused` (nothing of
    the run is touched); at most `max_waiting` connections wait for their hello (see the
    module docstring; `stalls` counts accepts that failed for want of a resource). `cap` (a FrameCap, or a function giving the
    current one: a server learns its shard's shapes at worker 0's hello) bounds every frame.
    `on_lost(worker, cause)` hears of a connection that ended without a goodbye (the worker
    its hello named); `errors` keeps what broke a connection after its hello, and `failed` is
    set when one broke on an unexpected error (a handler's fault, a bad frame)."""

    def __init__(self, host: str, port: int, handler: Handler, token: str,
                 cap: exchange.FrameCap | CapSource | None = None, limits: exchange.Limits | None = None,
                 on_lost: Callable[[int, str], None] | None = None, hello_s: float | None = None,
                 max_waiting: int = MAX_WAITING) -> None:
        if not token:
            raise ValueError("a listener needs the run's token")
        self.handler, self.token, self.limits, self.on_lost = handler, token, limits or exchange.Limits(), on_lost
        self.hello_s = self.limits.hello_s if hello_s is None else hello_s
        self.max_waiting = max(1, max_waiting)
        self._cap = cap if callable(cap) else (lambda: cap)
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.refused_total = 0
        self.stalls = 0  # accepts that failed for want of a descriptor or memory
        self.failed = threading.Event()
        self._waiting: dict[int, Channel] = {}  # connections before their hello, oldest first
        self._lock = threading.Lock()
        self._closed = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        pause = 0.0
        while not self._closed:
            try:
                conn, peer = self.sock.accept()
            except OSError as exc:
                if self._closed or exc.errno in _CLOSED:
                    return
                if exc.errno in _EXHAUSTED:  # a descriptor is freed by closing the oldest stranger
                    self.stalls += 1
                    self._drop_oldest(f"closed for want of a descriptor ({errno.errorcode.get(exc.errno, exc.errno)})")
                    pause = min(max(2 * pause, ACCEPT_BACKOFF_S[0]), ACCEPT_BACKOFF_S[1])
                    time.sleep(pause)
                continue  # ECONNABORTED, EPROTO, EPERM, ...: that connection only
            pause = 0.0
            try:
                channel = Channel(conn, self.limits, f"{peer[0]}:{peer[1]}")
            except OSError:  # reset before its options could be set
                conn.close()
                continue
            channel.deadline = time.monotonic() + self.hello_s
            with self._lock:
                self._waiting[id(channel)] = channel
                crowded = len(self._waiting) > self.max_waiting
            if crowded:
                self._drop_oldest(f"closed: more than {self.max_waiting} connections waited for their hello")
            threading.Thread(target=self._serve, args=(channel,), daemon=True).start()

    def _drop_oldest(self, why: str) -> None:
        """Close the connection that has waited longest for its hello (its thread notes it)."""
        with self._lock:
            if not self._waiting:
                return
            oldest = self._waiting.pop(next(iter(self._waiting)))
        oldest.dropped = why
        try:
            oldest.sock.shutdown(socket.SHUT_RDWR)  # its reader wakes, fails and closes it
        except OSError:
            pass

    def _refuse(self, channel: Channel, why: str) -> None:
        with self._lock:
            self._waiting.pop(id(channel), None)
            self.refused_total += 1
            if len(self.refused) < MAX_NOTED:
                self.refused.append(f"{channel.name}: {why}")
        channel.close()

    def _admit(self, channel: Channel, op: str, meta: dict) -> None:
        if op != exchange.HELLO:
            raise exchange.ProtocolError(f"a {op!r} frame before the hello")
        if not hmac.compare_digest(str(meta.get("token", "")).encode(), self.token.encode()):
            raise exchange.ProtocolError("a hello without the run's token")
        with self._lock:
            if self._waiting.pop(id(channel), None) is None:
                raise exchange.ProtocolError(channel.dropped or "closed")
        channel.wait_without_deadline()  # one of the run's roles: its arrays take what they take

    def _serve(self, channel: Channel) -> None:
        try:
            channel.cap = self._cap()
            first = channel.receive(lambda op, meta: self._admit(channel, op, meta))
        except TimeoutError:
            self._refuse(channel, f"no hello within {self.hello_s:g}s")
            return
        except (OSError, EOFError, exchange.ProtocolError) as exc:
            self._refuse(channel, channel.dropped or f"{type(exc).__name__}: {exc}")
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
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept (a close alone does not)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
