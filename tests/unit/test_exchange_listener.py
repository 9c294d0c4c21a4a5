"""The exchange listener before the hello (jobs/harness/peers.py, jobs/exchange.py): what a
stranger who can reach a parameter server's or a gossip peer's port can do to it. Real
sockets on loopback only; the file-descriptor test runs its listener in a child process whose
descriptor limit is low, so this process's own limit is never touched."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from netbench import proc
from netbench.jobs import exchange
from netbench.jobs.harness.peers import Channel, Listener

TOKEN = "the-runs-token"


def _echo(message: exchange.Message) -> exchange.Message | None:
    return None if message.op == exchange.HELLO else exchange.Message(exchange.REPLY, {}, message.arrays)


def _wait(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def _closed(sock: socket.socket) -> bool:
    """Whether the other end closed `sock` (within its timeout)."""
    try:
        return sock.recv(16) == b""
    except ConnectionResetError:  # closed with bytes of ours unread
        return True


def _served(address: str) -> np.ndarray:
    """One of the run's own roles: its hello, then a request answered."""
    own = Channel.connect(address, 10)
    try:
        own.send(exchange.Message(exchange.HELLO, {"worker": 0, "token": TOKEN}))
        return own.request(exchange.Message(exchange.PUSH, {"worker": 0}, (np.arange(3, dtype=np.float32),))).arrays[0]
    finally:
        own.close()


def test_a_header_of_nested_brackets_is_a_protocol_error_not_a_recursion_error():
    header = b"[" * 200_000
    frame = len(header).to_bytes(4, "big") + header
    stream = iter([frame[:4], frame[4:]])
    with pytest.raises(exchange.ProtocolError, match="nested"):
        exchange.decode(lambda n: next(stream))
    nested = json.dumps({"op": exchange.HELLO, "meta": {"token": TOKEN, "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
                         "arrays": []}).encode()
    parts = iter([len(nested).to_bytes(4, "big"), nested])
    with pytest.raises(exchange.ProtocolError, match="nested"):
        exchange.decode(lambda n: next(parts))  # deeper than any frame of the protocol
    plain = exchange.encode(exchange.Message(exchange.HELLO, {"token": TOKEN, "worker": 1, "shape": [[1, 2], [3]]}))
    pieces = iter([plain[:4], plain[4:]])
    assert exchange.decode(lambda n: next(pieces)).meta["worker"] == 1


def test_a_connection_that_sends_nothing_is_closed_at_the_hello_deadline_and_one_that_trickles_too():
    listener = Listener("127.0.0.1", 0, _echo, TOKEN, hello_s=0.3)
    port = listener.sock.getsockname()[1]
    try:
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
        began = time.monotonic()
        header = json.dumps({"op": exchange.HELLO, "meta": {"token": TOKEN}, "arrays": []}).encode()
        trickle.sendall(len(header).to_bytes(4, "big"))
        for byte in header[:20]:  # a byte now and then: each read is quick, the hello never whole
            try:
                trickle.sendall(bytes([byte]))
            except OSError:  # closed meanwhile
                break
            time.sleep(0.1)
        assert _closed(silent) and _closed(trickle)  # by the listener
        assert time.monotonic() - began < 3.0
        assert _wait(lambda: len(listener.refused) == 2), listener.refused
        assert all("no hello within 0.3s" in line for line in listener.refused), listener.refused
        silent.close()
        trickle.close()
        np.testing.assert_array_equal(_served(f"127.0.0.1:{port}"), np.arange(3))  # a role's hello is in time
        assert not listener.failed.is_set()
    finally:
        listener.close()


def test_connections_waiting_for_their_hello_are_bounded_the_oldest_closed_first():
    listener = Listener("127.0.0.1", 0, _echo, TOKEN, hello_s=30, max_waiting=8)
    port = listener.sock.getsockname()[1]
    idle = []
    try:
        for _ in range(20):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        assert _wait(lambda: listener.refused_total >= 12), listener.refused_total
        assert _closed(idle[0]) and _closed(idle[11])  # the oldest went first
        idle[19].settimeout(0.2)
        with pytest.raises(socket.timeout):
            idle[19].recv(16)  # the newest still waits for its hello
        np.testing.assert_array_equal(_served(f"127.0.0.1:{port}"), np.arange(3))
        assert "more than 8 connections waited for their hello" in listener.refused[0]
    finally:
        for sock in idle:
            sock.close()
        listener.close()


# a listener in a process of its own, allowed few file descriptors; it prints its port, then
# serves until its stdin closes, then prints what it refused and how often accept stalled
_CHILD = """
import json, resource, sys
from netbench.jobs import exchange
from netbench.jobs.harness.peers import Listener
resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
def echo(message):
    return None if message.op == exchange.HELLO else exchange.Message(exchange.REPLY, {}, message.arrays)
listener = Listener("127.0.0.1", 0, echo, sys.argv[1], hello_s=60, max_waiting=1000)
print(listener.sock.getsockname()[1], flush=True)
sys.stdin.read()
print(json.dumps({"refused": listener.refused_total, "stalls": listener.stalls}), flush=True)
"""


def test_a_listener_out_of_file_descriptors_keeps_accepting_and_serves_its_own_roles():
    """Strangers' idle connections use up the listener's descriptors (EMFILE): accept backs
    off and closes the oldest connection that has not said hello; the run's own role, which
    comes last, is still served (the loop used to return on the first OSError, for good)."""
    child = proc.spawn([sys.executable, "-c", _CHILD, TOKEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       env={**os.environ, "PYTHONPATH": proc.child_pythonpath()})
    idle = []
    try:
        port = int(child.stdout.readline())
        for _ in range(60):  # more than the 48 descriptors it may hold
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        np.testing.assert_array_equal(_served(f"127.0.0.1:{port}"), np.arange(3))
        child.stdin.close()
        said = json.loads(child.stdout.readline())
        assert said["stalls"] >= 1 and said["refused"] >= 1, said
    finally:
        for sock in idle:
            sock.close()
        proc.stop(child, grace=1.0)
