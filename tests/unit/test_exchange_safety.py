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
    state = algorithms.ServerState(mode=mode, workers=workers, learning_rate=1.0)
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
