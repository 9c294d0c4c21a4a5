"""A parameter server of ps-sync, ps-async, ps-ssp and easgd: a process of its own on its own node.

It holds its shard of the weights (variables round robin over the servers: exchange.shard_of)
in a `ServerState` (netbench.jobs.algorithms) behind one lock and condition, listens on its
node's address, and answers each worker's requests:

* hello: worker 0's carries the initial weights (every worker starts from the same seed);
  the replies wait for every worker's hello (so all start their first step together: a worker
  that starts seconds late, importing TensorFlow on a busy machine, would leave the others to
  train alone) and carry the weights to the others;
* push: the gradient is applied (ps-async, ps-ssp) or joins its round (ps-sync; with
  ``--backup-workers`` B a round closes on its first W - B gradients and a late one is dropped,
  its reply saying ``dropped``); the reply
  waits for the barrier (ps-sync) or the staleness gate (ps-ssp), under ps-async for nothing
  (in the warm-up ps-async and ps-ssp step in lockstep: the measured steps start together),
  then carries the weights, the version, the update's staleness and ``wait_s`` (how long the
  reply was held: the worker's waiting time);
* elastic: the centre moves towards the replica; the reply is the difference (easgd);
* start: easgd's start line: a worker's warm-up is over; answered once every worker's is;
* bye: the worker is done (it no longer holds back a round or the gate).

Every reply carries a copy of the weights taken under the lock (`ServerState.snapshot`): a
reply is encoded after the lock is released, while other connections update the live arrays.

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
from netbench.jobs.harness.peers import Listener, run_limits, run_token


def make_handler(state: algorithms.ServerState, condition: threading.Condition,
                 limits: exchange.Limits | None = None, first_s: float | None = None):
    """The listener's handler over one server state (the lock is the condition's). A read held
    by the barrier or the gate is answered with an error frame, naming the worker it waits for,
    when that worker's connection ended without a goodbye, or after `limits.barrier_s` without
    its push (`first_s` while that worker has not pushed yet: its first step compiles)."""
    limits = limits or exchange.Limits()

    def blocked(worker: int) -> str | None:
        waited = time.monotonic()
        while True:
            if condition.wait_for(lambda: state.may_read(worker) or state.vanished(worker) is not None,
                                  timeout=1.0):
                return None if state.may_read(worker) else state.vanished(worker)
            holding = state.holding(worker)
            first = any(state.clocks.get(w, 0) == 0 for w in holding)
            limit = max(limits.barrier_s, first_s or 0.0) if first else limits.barrier_s
            if holding and time.monotonic() - waited > limit:
                gate = ("the barrier" if state.mode == algorithms.SYNC else "the staleness gate"
                        if state.clocks.get(worker, 0) > state.warmup else "the warm-up's lockstep")
                return f"no push from worker {', '.join(map(str, holding))} within {limit:g}s ({gate} waits for it)"

    def handle(message: exchange.Message) -> exchange.Message | None:
        worker = int(message.meta.get("worker", -1))
        with condition:
            if message.op == exchange.HELLO:
                if message.arrays:
                    state.initialise(message.arrays)
                state.greet(worker)
                condition.notify_all()
                if not condition.wait_for(lambda: state.ready and not state.absent(), timeout=first_s or None):
                    missing = state.absent() or [0]  # worker 0's hello brings the weights
                    return exchange.Message(exchange.ERROR, {"message": (
                        f"no hello from worker {', '.join(map(str, missing))} within {first_s:g}s "
                        "(every worker starts together)")})
                arrays = () if message.arrays else state.snapshot()
                return exchange.Message(exchange.REPLY, {"version": state.version}, arrays)
            if message.op == exchange.PUSH:
                dropped = state.dropped.get(worker, 0)
                staleness = state.push(worker, int(message.meta.get("version", 0)), message.arrays)
                condition.notify_all()
                held = time.monotonic()
                why = blocked(worker)
                if why is not None:
                    return exchange.Message(exchange.ERROR, {"message": why})
                wait_s = time.monotonic() - held
                meta = {"version": state.version, "staleness": staleness, "wait_s": wait_s}
                if state.backup:  # ps-sync with backup workers: whether this gradient came too late
                    meta["dropped"] = state.dropped.get(worker, 0) > dropped
                return exchange.Message(exchange.REPLY, meta, state.snapshot())
            if message.op == exchange.START:  # easgd's start line: answered once every worker is there
                state.reach_line(worker)
                condition.notify_all()
                if not condition.wait_for(lambda: not state.short_of_line(), timeout=first_s or None):
                    return exchange.Message(exchange.ERROR, {"message": (
                        f"worker {', '.join(map(str, state.short_of_line()))} did not end its warm-up "
                        f"within {first_s:g}s (the measured steps start together)")})
                return exchange.Message(exchange.REPLY, {"version": state.version})
            if message.op == exchange.ELASTIC:
                diff = state.elastic(message.arrays)
                return exchange.Message(exchange.REPLY, {"version": state.version}, tuple(diff))
            if message.op == exchange.CENTRE:
                return exchange.Message(exchange.REPLY, {"version": state.version}, state.snapshot())
            if message.op == exchange.BYE:
                state.leave(worker)
                condition.notify_all()
                return exchange.Message(exchange.REPLY, {})
        raise exchange.ProtocolError(f"a parameter server does not answer {message.op!r}")

    return handle


def serve(args: argparse.Namespace, events: IO[str], index: int, cluster: dict[str, list[str]]) -> None:
    """Serve shard `index` until the process is stopped (or a connection fails unexpectedly:
    raised, so the controller hears of it)."""
    workers = len(cluster.get("worker", []))
    alpha = args.elastic_alpha or algorithms.default_elastic_alpha(workers)
    state = algorithms.ServerState(mode=algorithms.SERVER_MODES[args.strategy], workers=workers,
                                   learning_rate=args.learning_rate,
                                   staleness=algorithms.server_gate(args.strategy, args.staleness), alpha=alpha,
                                   backup=getattr(args, "backup_workers", 0) if args.strategy == "ps-sync" else 0,
                                   warmup=getattr(args, "warmup", 0) or 0)
    condition = threading.Condition()
    limits = run_limits()

    def lost(worker: int, cause: str) -> None:
        with condition:
            state.lose(worker, cause)
            condition.notify_all()

    host, port = cluster["ps"][index].rsplit(":", 1)
    listener = Listener(host, int(port), make_handler(state, condition, limits, args.startup_timeout),
                        run_token(), cap=state.cap, limits=limits, on_lost=lost)
    emit(ev.start_event(index, workers, os.getpid(), time.monotonic(), "", args.model, 0, args.batch_size,
                        strategy=args.strategy, role="ps", input_shape=(), data=args.data), events)
    listener.failed.wait()  # until the controller stops this process, or a connection broke
    raise RuntimeError(f"parameter server {index}: {listener.failure()}")
