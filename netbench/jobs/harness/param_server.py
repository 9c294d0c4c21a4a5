"""A parameter server of ps-sync, ps-async, ps-ssp and easgd: a process of its own on its own node.

It holds its shard of the weights (variables round robin over the servers: exchange.shard_of)
in a `ServerState` (netbench.jobs.algorithms) behind one lock and condition, listens on its
node's address, and answers each worker's requests:

* hello: worker 0's carries the initial weights (every worker starts from the same seed);
  the reply (once the weights exist) carries them to the others;
* push: the gradient is applied (ps-async, ps-ssp) or joins its round (ps-sync; with
  ``--backup-workers`` B a round closes on its first W - B gradients and a late one is dropped,
  its reply saying ``dropped``); the reply
  waits for the barrier (ps-sync) or the staleness gate (ps-ssp), under ps-async for nothing,
  then carries the weights, the version, the update's staleness and ``wait_s`` (how long the
  reply was held: the worker's waiting time);
* elastic: the centre moves towards the replica; the reply is the difference (easgd);
* bye: the worker is done (it no longer holds back a round or the gate).

It imports no TensorFlow: it starts in a fraction of a second, sends a start event and
serves until the controller stops it.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import IO

from netbench.jobs import algorithms, exchange
from netbench.jobs import events as ev
from netbench.jobs.harness.emit import emit
from netbench.jobs.harness.peers import Listener


def make_handler(state: algorithms.ServerState, condition: threading.Condition):
    """The listener's handler over one server state (the lock is the condition's)."""

    def handle(message: exchange.Message) -> exchange.Message | None:
        worker = int(message.meta.get("worker", -1))
        with condition:
            if message.op == exchange.HELLO:
                if message.arrays:
                    state.initialise(message.arrays)
                    condition.notify_all()
                condition.wait_for(lambda: state.ready)
                arrays = () if message.arrays else tuple(state.weights or ())
                return exchange.Message(exchange.REPLY, {"version": state.version}, arrays)
            if message.op == exchange.PUSH:
                dropped = state.dropped.get(worker, 0)
                staleness = state.push(worker, int(message.meta.get("version", 0)), message.arrays)
                condition.notify_all()
                held = time.monotonic()
                condition.wait_for(lambda: state.may_read(worker))
                wait_s = time.monotonic() - held
                meta = {"version": state.version, "staleness": staleness, "wait_s": wait_s}
                if state.backup:  # ps-sync with backup workers: whether this gradient came too late
                    meta["dropped"] = state.dropped.get(worker, 0) > dropped
                return exchange.Message(exchange.REPLY, meta, tuple(state.weights or ()))
            if message.op == exchange.ELASTIC:
                diff = state.elastic(message.arrays)
                return exchange.Message(exchange.REPLY, {"version": state.version}, tuple(diff))
            if message.op == exchange.CENTRE:
                return exchange.Message(exchange.REPLY, {"version": state.version}, tuple(state.weights or ()))
            if message.op == exchange.BYE:
                state.leave(worker)
                condition.notify_all()
                return exchange.Message(exchange.REPLY, {})
        raise exchange.ProtocolError(f"a parameter server does not answer {message.op!r}")

    return handle


def serve(args: argparse.Namespace, events: IO[str], index: int, cluster: dict[str, list[str]]) -> None:
    """Serve shard `index` until the process is stopped."""
    workers = len(cluster.get("worker", []))
    alpha = args.elastic_alpha or algorithms.default_elastic_alpha(workers)
    state = algorithms.ServerState(mode=algorithms.SERVER_MODES[args.strategy], workers=workers,
                                   learning_rate=args.learning_rate,
                                   staleness=algorithms.server_gate(args.strategy, args.staleness), alpha=alpha,
                                   backup=getattr(args, "backup_workers", 0) if args.strategy == "ps-sync" else 0)
    condition = threading.Condition()
    host, port = cluster["ps"][index].rsplit(":", 1)
    Listener(host, int(port), make_handler(state, condition))
    emit(ev.start_event(index, workers, os.getpid(), time.monotonic(), "", args.model, 0, args.batch_size,
                        strategy=args.strategy, role="ps", input_shape=(), data=args.data), events)
    threading.Event().wait()  # until the controller stops this process
