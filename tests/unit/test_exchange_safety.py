"""The exchange protocol's safety: replies that never mix two versions, frames bounded by the
model's shapes and accepted only from the run's own roles, peers that said goodbye, vanished
peers named within the step timeout, and labels that bound the class count."""

from __future__ import annotations

import threading

import numpy as np

from netbench.jobs import algorithms, exchange
from netbench.jobs.harness import param_server


TOKEN = "the-runs-token"


def _handler(mode: str, workers: int = 2):
    """A server's handler called in one thread: every worker but 0 counts as greeted already
    (a hello is answered once all came), so worker 0's hello is answered at once."""
    state = algorithms.ServerState(mode=mode, workers=workers, learning_rate=1.0)
    for worker in range(1, workers):
        state.greet(worker)
    return state, param_server.make_handler(state, threading.Condition())


def test_a_servers_reply_is_a_copy_taken_under_the_lock_never_the_live_weights():
    """A reply is encoded after the lock is released: a later push must not change it."""
    state, handle = _handler(algorithms.ASYNC)
    handle(exchange.Message(exchange.HELLO, {"worker": 0}, (np.zeros(3, np.float32),)))
    reply = handle(exchange.Message(exchange.PUSH, {"worker": 0, "version": 0}, (np.ones(3, np.float32),)))
    assert reply.meta["version"] == 1
    hello = handle(exchange.Message(exchange.HELLO, {"worker": 1}))
    handle(exchange.Message(exchange.PUSH, {"worker": 1, "version": 1}, (np.ones(3, np.float32),)))
    np.testing.assert_array_equal(reply.arrays[0], [-1.0] * 3)  # version 1's weights, as it says
    np.testing.assert_array_equal(hello.arrays[0], [-1.0] * 3)
    assert state.version == 2 and state.weights[0][0] == -2.0


def test_easgds_centre_read_is_a_copy_too():
    state, handle = _handler(algorithms.ELASTIC_MODE)
    state.alpha = 0.5
    handle(exchange.Message(exchange.HELLO, {"worker": 0}, (np.zeros(2, np.float32),)))
    centre = handle(exchange.Message(exchange.CENTRE, {"worker": 0}))
    handle(exchange.Message(exchange.ELASTIC, {"worker": 1}, (np.full(2, 4.0, np.float32),)))
    np.testing.assert_array_equal(centre.arrays[0], [0.0, 0.0])
    np.testing.assert_array_equal(state.weights[0], [2.0, 2.0])


def test_one_stray_label_is_refused_naming_the_file_and_the_label(tmp_path):
    """The class count is the largest label + 1: one label 2^31-1 must not build a layer of
    two billion outputs, in an .npz and in an IDX folder's labels file alike."""
    import pytest

    from netbench.jobs.harness import data as datasets
    from netbench.jobs.harness import idx

    stray = 2**31 - 1
    archive = tmp_path / "stray.npz"
    np.savez(archive, x_train=np.zeros((4, 2, 2), np.uint8), y_train=np.array([0, 1, stray, 2], np.int32))
    with pytest.raises(datasets.DataError, match=rf"stray.npz: label {stray} is beyond the 100,000 classes"):
        datasets.load_npz(str(archive))
    folder = tmp_path / "idx"
    folder.mkdir()
    (folder / idx.TRAIN_IMAGES).write_bytes(bytes([0, 0, 0x08, 3]) + b"".join(
        n.to_bytes(4, "big") for n in (4, 2, 2)) + bytes(16))
    labels = np.array([0, 1, 2, stray], ">i4")
    (folder / idx.TRAIN_LABELS).write_bytes(bytes([0, 0, 0x0C, 1]) + (4).to_bytes(4, "big") + labels.tobytes())
    # worker 0's shard (every second example) lacks the stray label: the whole file is checked
    with pytest.raises(datasets.DataError, match=rf"{idx.TRAIN_LABELS}: label {stray} is beyond"):
        idx.load_idx_folder(str(folder), 0, 2)
    labels[3] = 99_999  # the largest allowed: 100,000 classes, the same on every worker
    (folder / idx.TRAIN_LABELS).write_bytes(bytes([0, 0, 0x0C, 1]) + (4).to_bytes(4, "big") + labels.tobytes())
    assert {idx.load_idx_folder(str(folder), i, 2).classes for i in (0, 1)} == {100_000}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_peer_is_drawn_from_those_that_have_not_said_goodbye():
    import random

    assert {algorithms.choose_peer(random.Random(s), 0, 4, {2}) for s in range(200)} == {1, 3}
    assert algorithms.choose_peer(random.Random(0), 1, 3, {0, 2}) is None
    # with none gone, the draws are those of the runs before (a seed trains as it did)
    assert [algorithms.choose_peer(random.Random(7), 1, 4) for _ in range(1)] == [
        (lambda o: o if o < 1 else o + 1)(random.Random(7).randrange(3))]


def test_a_peer_that_said_goodbye_is_never_chosen_again_and_the_last_one_trains_alone():
    """gosgd/adpsgd: worker 1 finished and said goodbye (then stopped answering); worker 0,
    far behind, never chooses it again: its steps go on alone and its own goodbye ends."""
    import argparse
    import io
    import time

    from netbench.jobs.harness.exchange_loop import _Worker
    from netbench.jobs.harness.peers import Channel, Listener

    for strategy in ("adpsgd", "gosgd"):
        args = argparse.Namespace(strategy=strategy, seed=0, startup_timeout=2, gossip_p=1.0)
        cluster = {"worker": ["127.0.0.1:0", f"127.0.0.1:{_free_port()}"]}  # nothing listens for worker 1
        worker = _Worker(args, io.StringIO(), 0, cluster, token=TOKEN)
        worker.weights = [np.zeros(3, np.float32)]
        listener = Listener("127.0.0.1", 0, worker._peer_handler, TOKEN)
        try:
            other = Channel.connect(f"127.0.0.1:{listener.sock.getsockname()[1]}", 5)
            other.send(exchange.Message(exchange.HELLO, {"worker": 1, "token": TOKEN}))
            other.send(exchange.Message(exchange.BYE, {"worker": 1}))
            time.sleep(0.3)  # the goodbye is read
            started = time.monotonic()
            for step in range(3):
                worker._exchange(step, [np.ones(3, np.float32)])
            worker._goodbye()
            assert time.monotonic() - started < 1.5, strategy  # no connection to the finished peer
            assert worker.gone == {1} and listener.errors == []
            np.testing.assert_array_equal(worker.weights[0], np.zeros(3))
            other.close()
        finally:
            listener.close()


# -- frames bounded and authenticated ------------------------------------------------------

def _frame(op: str, meta: dict, specs: list) -> bytes:
    import json

    header = json.dumps({"op": op, "meta": meta, "arrays": specs}).encode()
    return len(header).to_bytes(4, "big") + header


class _Reads:
    """A stream's `read` that records the sizes asked for."""

    def __init__(self, data: bytes) -> None:
        import io

        self.stream, self.asked = io.BytesIO(data), []

    def __call__(self, n: int) -> bytes:
        self.asked.append(n)
        return self.stream.read(n)


def test_a_frame_declaring_more_than_the_model_allows_is_refused_before_anything_is_allocated():
    import pytest

    huge = _frame(exchange.PUSH, {"worker": 0}, [["float32", [25 * 10**9]]])  # 100 GB in a short frame
    assert len(huge) < 100
    reads = _Reads(huge + b"\0" * 64)
    with pytest.raises(exchange.ProtocolError, match="more than"):
        exchange.decode(reads)  # no cap yet: the ceiling
    assert max(reads.asked) < len(huge)  # the header only: no array was read or allocated
    model = exchange.FrameCap.of([np.zeros((4, 4), np.float32), np.zeros(4, np.float32)])
    assert model == exchange.FrameCap(80, 2)
    for specs in ([["float32", [21]]], [["float64", [4, 4]]], [["float32", [1]]] * 3):
        with pytest.raises(exchange.ProtocolError):
            exchange.decode(_Reads(_frame(exchange.PUSH, {}, specs) + b"\0" * 200), model)
    ok = exchange.decode(_Reads(_frame(exchange.PUSH, {}, [["float32", [4, 4]], ["float32", [4]]]) + b"\0" * 80), model)
    assert [a.shape for a in ok.arrays] == [(4, 4), (4,)] and ok.arrays[0].flags.writeable


def test_dimensions_whose_product_overflows_are_a_protocol_error_not_a_crash():
    import pytest

    for shape in ([2**62, 4], [2**40, 2**40, 2**40], [2**63], [1] * 40, ["x"]):
        with pytest.raises(exchange.ProtocolError):
            exchange.decode(_Reads(_frame(exchange.PUSH, {}, [["float32", shape]]) + b"\0" * 64),
                            exchange.FrameCap(1 << 30, 4))


def test_arrays_are_read_in_chunks_as_the_bytes_arrive():
    import pytest

    size = 3 * exchange.CHUNK_BYTES + 5
    message = exchange.Message(exchange.PUSH, {}, (np.arange(size // 4, dtype=np.float32),))
    frame = exchange.encode(message)
    reads = _Reads(frame)
    back = exchange.decode(reads, exchange.FrameCap.of(message.arrays))
    np.testing.assert_array_equal(back.arrays[0], message.arrays[0])
    assert max(reads.asked) <= exchange.CHUNK_BYTES
    cut = _Reads(frame[: len(frame) // 2])
    with pytest.raises(EOFError):
        exchange.decode(cut, exchange.FrameCap.of(message.arrays))
    assert max(cut.asked) <= exchange.CHUNK_BYTES


def _serving(handler=None, cap=None, **kwargs):
    from netbench.jobs.harness.peers import Listener

    seen: list = []

    def record(message):
        seen.append(message)
        if message.op == exchange.HELLO:
            return None
        return exchange.Message(exchange.REPLY, {}, message.arrays)

    listener = Listener("127.0.0.1", 0, handler or record, TOKEN, cap=cap, **kwargs)
    return listener, f"127.0.0.1:{listener.sock.getsockname()[1]}", seen


def _wait(condition, seconds: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_listener_takes_connections_only_from_the_runs_own_roles():
    """No token, a wrong one, or a frame before the hello: the connection is closed, noted in
    `refused`, and nothing reaches the handler (not even the declared arrays are read)."""
    import socket

    from netbench.jobs.harness.peers import Channel

    listener, address, seen = _serving(cap=exchange.FrameCap(12, 1))
    host, port = address.rsplit(":", 1)
    try:
        strangers = [
            _frame(exchange.HELLO, {"worker": 0}, [["float32", [25 * 10**9]]]),
            _frame(exchange.HELLO, {"worker": 0, "token": "guessed"}, []),
            _frame(exchange.PUSH, {"worker": 0, "token": TOKEN}, [["float32", [3]]]) + b"\0" * 12,
        ]
        for frame in strangers:
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(frame)
                try:
                    assert sock.recv(16) == b""  # closed without a reply
                except ConnectionResetError:  # closed with bytes of ours unread
                    pass
        assert _wait(lambda: len(listener.refused) == 3), listener.refused
        assert seen == [] and listener.errors == [] and not listener.failed.is_set()
        assert "without the run's token" in listener.refused[1] and "before the hello" in listener.refused[2]
        own = Channel.connect(address, 5)
        own.send(exchange.Message(exchange.HELLO, {"worker": 0, "token": TOKEN}))
        echo = own.request(exchange.Message(exchange.PUSH, {"worker": 0}, (np.ones(3, np.float32),)))
        np.testing.assert_array_equal(echo.arrays[0], np.ones(3))
        own.close()
    finally:
        listener.close()


def test_a_server_caps_frames_at_its_shards_shapes_once_the_first_hello_brought_them():
    from netbench.jobs.harness.peers import Channel, Listener

    state, handle = _handler(algorithms.ASYNC)
    listener = Listener("127.0.0.1", 0, handle, TOKEN, cap=state.cap)
    address = f"127.0.0.1:{listener.sock.getsockname()[1]}"
    try:
        assert state.cap() is None
        first = Channel.connect(address, 5)
        first.request(exchange.Message(exchange.HELLO, {"worker": 0, "token": TOKEN}, (np.zeros(3, np.float32),)))
        assert state.cap() == exchange.FrameCap(12, 1)
        first.send(exchange.Message(exchange.PUSH, {"worker": 0, "version": 0}, (np.ones(4, np.float32),)))
        try:
            first.receive()
            raise AssertionError("an oversized push was answered")
        except ConnectionError as exc:  # the server's error frame says why
            assert "more than the 12" in str(exc)
        assert listener.failed.is_set() and "ProtocolError" in listener.failure()
        assert state.version == 0  # nothing of it was applied
    finally:
        listener.close()


# -- timeouts, vanished peers, reported errors -----------------------------------------------

def test_exchange_sockets_drop_a_peer_that_stops_acknowledging():
    import socket

    from netbench.jobs.harness.peers import Channel

    listener, address, _ = _serving()
    try:
        channel = Channel.connect(address, 5, exchange.Limits(step_s=20))
        sock = channel.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 3
        channel.close()
    finally:
        listener.close()
    limits = exchange.Limits(step_s=60)  # each side names the culprit before the controller's 60 s
    assert limits.liveness_s < limits.barrier_s < limits.reply_s < 60 - 2


def _sync_server(step_s: float = 60.0):
    from netbench.jobs.harness.peers import Channel, Listener

    state = algorithms.ServerState(mode=algorithms.SYNC, workers=2, learning_rate=1.0)
    condition = threading.Condition()

    def lost(worker: int, cause: str) -> None:
        with condition:
            state.lose(worker, cause)
            condition.notify_all()

    limits = exchange.Limits(step_s=step_s)
    listener = Listener("127.0.0.1", 0, param_server.make_handler(state, condition, limits, first_s=0.0), TOKEN,
                        cap=state.cap, limits=limits, on_lost=lost)
    address = f"127.0.0.1:{listener.sock.getsockname()[1]}"
    first, second = Channel.connect(address, 5), Channel.connect(address, 5)
    first.send(exchange.Message(exchange.HELLO, {"worker": 0, "token": TOKEN}, (np.zeros(3, np.float32),)))
    second.send(exchange.Message(exchange.HELLO, {"worker": 1, "token": TOKEN}))  # the start waits for both
    first.receive(), second.receive()
    return listener, first, second


def test_a_worker_that_vanishes_without_a_goodbye_fails_the_barrier_naming_it():
    """ps-sync: worker 1's connection ends with no bye while worker 0 waits at the barrier:
    worker 0's reply is an error that names worker 1 and the cause, at once."""
    import pytest
    import time

    listener, first, second = _sync_server()
    try:
        first.send(exchange.Message(exchange.PUSH, {"worker": 0, "version": 0}, (np.ones(3, np.float32),)))
        time.sleep(0.2)
        started = time.monotonic()
        second.close()  # vanished: no bye
        first.sock.settimeout(10)
        with pytest.raises(ConnectionError, match=r"worker 1 \(127.0.0.1:\d+\): its connection ended without a goodbye"):
            first.receive()
        assert time.monotonic() - started < 3
    finally:
        listener.close()


def test_a_worker_that_stops_pushing_fails_the_barrier_within_the_limit():
    """A partition or a frozen worker (no end of stream): the barrier gives up after barrier_s."""
    import pytest
    import time

    listener, first, second = _sync_server(step_s=2.0)
    try:
        started = time.monotonic()
        first.send(exchange.Message(exchange.PUSH, {"worker": 0, "version": 0}, (np.ones(3, np.float32),)))
        first.sock.settimeout(10)
        with pytest.raises(ConnectionError, match=r"no push from worker 1 within 1.4s \(the barrier waits for it\)"):
            first.receive()
        assert 1.3 < time.monotonic() - started < 4
    finally:
        second.close()
        listener.close()


def test_a_handlers_unexpected_error_is_answered_reported_and_fails_the_role():
    import pytest

    from netbench.jobs.harness.peers import Channel

    def broken(message):
        if message.op == exchange.HELLO:
            return None
        raise KeyError("weight")

    listener, address, _ = _serving(handler=broken)
    try:
        channel = Channel.connect(address, 5)
        channel.send(exchange.Message(exchange.HELLO, {"worker": 3, "token": TOKEN}))
        with pytest.raises(ConnectionError, match="KeyError"):
            channel.request(exchange.Message(exchange.GOSSIP, {}))
        assert _wait(listener.failed.is_set)
        assert listener.failure().startswith("worker 3 (127.0.0.1:") and "KeyError" in listener.failure()
    finally:
        listener.close()


def test_a_worker_names_a_server_whose_reply_does_not_come():
    """A server cut off without an end of stream: the worker gives up after reply_s, naming it."""
    import argparse
    import io
    import pytest
    import time

    from netbench.jobs.harness.exchange_loop import _Worker

    def silent(message):
        if message.op == exchange.HELLO:
            return exchange.Message(exchange.REPLY, {"version": 0})
        time.sleep(30)  # never answers in time

    listener, address, _ = _serving(handler=silent)
    try:
        args = argparse.Namespace(strategy="ps-sync", staleness=0, seed=0, startup_timeout=0)
        worker = _Worker(args, io.StringIO(), 0, {"worker": ["a:1"], "ps": [address]}, token=TOKEN,
                         limits=exchange.Limits(step_s=1.0))
        worker.weights = [np.zeros(3, np.float32)]
        worker._hello()
        worker._read_replies()
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"no reply from parameter server {address} within 1.5s"):
            worker._push(0.0, [np.ones(3, np.float32)])
        assert time.monotonic() - started < 3
    finally:
        listener.close()


# -- ps-async: the studies' ASP, and the pipelined form as an explicit setting --------------

def test_ps_asyncs_pipeline_is_a_setting_of_its_own_from_flag_playbook_and_factor_to_the_worker():
    import pytest
    from click.testing import CliRunner

    from netbench.cli.app import main
    from netbench.jobs import worker
    from netbench.model import algorithm_keys
    from netbench.model.job import JobSpec, algorithm_settings, check_job, describe_algorithm, worker_argv

    asp, pipelined = JobSpec(strategy="ps-async"), JobSpec(strategy="ps-async", pipeline=16)
    assert "--pipeline" not in worker_argv(asp) and algorithm_settings(asp, 2) == {"pipeline": 0}
    argv = worker_argv(pipelined)
    assert argv[argv.index("--pipeline") + 1] == "16" and algorithm_settings(pipelined, 2) == {"pipeline": 16}
    assert worker.parse_args(list(argv[3:])).pipeline == 16 and worker.parse_args(list(worker_argv(asp)[3:])).pipeline == 0
    assert "waits for its own push's reply" in describe_algorithm(asp, 2)[0]
    assert "up to 16 of its own pushes unanswered" in describe_algorithm(pipelined, 2)[0]
    with pytest.raises(ValueError, match="^pipeline:"):
        check_job(JobSpec(strategy="ps-async", pipeline=-1), 2)
    assert dict(algorithm_keys.job_extra({"algorithm": {"pipeline": 16}}, warmup=1)) == {"pipeline": 16}
    with pytest.raises(algorithm_keys.BadKey):
        algorithm_keys.job_extra({"algorithm": {"pipeline": 1.5}}, warmup=1)
    shown = CliRunner().invoke(main, ["sweep", "--dry-run", "--strategy", "ps-async", "--pipeline", "16"],
                               catch_exceptions=False)
    assert shown.exit_code == 0 and "ASP, pipelined 16" in shown.output, shown.output
    bad = CliRunner().invoke(main, ["sweep", "--dry-run", "--strategy", "ps-async", "--pipeline", "-2"])
    assert bad.exit_code != 0 and "--pipeline" in bad.output


def test_a_playbook_varies_ps_asyncs_pipeline_as_a_factor():
    from netbench.model.design import expand
    from netbench.model.playbook import playbook_from_mapping

    book = playbook_from_mapping({"seed": 1, "order": "as-written", "factors": {
        "strategy": ["ps-async"], "pipeline": [0, 16]}}, "pb.yaml")
    runs = expand(book, 1)
    assert [(r.settings.pipeline, r.job.pipeline) for r in runs] == [(0, 0), (16, 16)]
    assert [r.settings.effective().pipeline for r in runs] == [0, 16]
    import dataclasses
    assert dataclasses.replace(runs[0].settings, strategy="ps-sync").effective().pipeline is None


def test_a_ps_sync_worker_fails_naming_the_worker_that_vanished_from_its_round():
    """The worker's side of the barrier's error: its push is answered with the server's reason,
    raised in the training thread with the server's address and the vanished worker's name."""
    import argparse
    import io
    import pytest

    from netbench.jobs.harness.exchange_loop import _Worker
    from netbench.jobs.harness.peers import Channel, Listener

    state = algorithms.ServerState(mode=algorithms.SYNC, workers=2, learning_rate=1.0)
    condition = threading.Condition()

    def lost(worker: int, cause: str) -> None:
        with condition:
            state.lose(worker, cause)
            condition.notify_all()

    listener = Listener("127.0.0.1", 0, param_server.make_handler(state, condition, first_s=0.0), TOKEN,
                        cap=state.cap, on_lost=lost)
    address = f"127.0.0.1:{listener.sock.getsockname()[1]}"
    try:
        args = argparse.Namespace(strategy="ps-sync", staleness=0, seed=0, startup_timeout=5)
        worker = _Worker(args, io.StringIO(), 0, {"worker": ["a:1", "b:1"], "ps": [address]}, token=TOKEN)
        worker.weights = [np.zeros(3, np.float32)]
        other = Channel.connect(address, 5)
        other.send(exchange.Message(exchange.HELLO, {"worker": 1, "token": TOKEN}))  # the start waits for both
        worker._hello()
        worker._read_replies()
        other.receive()
        other.close()  # worker 1 vanishes without a goodbye
        with pytest.raises(ConnectionError, match=rf"^{address}: worker 1 \(127.0.0.1:\d+\): its connection ended"):
            worker._push(0.0, [np.ones(3, np.float32)])
    finally:
        listener.close()
