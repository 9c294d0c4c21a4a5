"""The training loop of the exchange strategies: ps-sync, ps-async, ps-ssp, easgd, gosgd and adpsgd.

TensorFlow only computes: each step, the gradient of the loss at this worker's weights on its
local batch (Keras 3 ``stateless_call``, one compiled function). The weights live here as
numpy arrays; the algorithm (netbench.jobs.algorithms) decides what crosses the network, and
every model-sized transfer is one frame (netbench.jobs.exchange) on a TCP connection between
this worker's node and a parameter server's or a peer's (harness.peers). Nothing goes
through a coordinator: there is none.

Each worker streams its own step events: ``compute`` (gradient and local update), ``comm``
(sending and receiving), ``wait`` (a reply held by the barrier or the staleness gate, as the
server measured it) and ``staleness`` (ps-sync, ps-async and ps-ssp: updates applied between the read of
the weights and this step's update). With ``--eval-every K`` every worker evaluates its model
on the held-out set after every K-th step and after the last, outside the timed steps, and
sends an ``eval`` event (harness.evaluate); under easgd worker 0 also reads the centre variable
from the servers and sends its evaluation (``of: centre``), the model the EASGD paper scores.

At the end a worker tells its servers and peers it is done (bye) and, for gosgd and adpsgd,
keeps answering its peers until each of them has said bye too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import queue
import random
import threading
import time
from typing import IO, Any

import numpy as np

from netbench.jobs import algorithms, exchange
from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets
from netbench.jobs.harness import evaluate, loop, param_server
from netbench.jobs.harness.emit import arm_startup_watchdog, disarm_startup_watchdog, emit
from netbench.jobs.harness.peers import Channel, Listener, RemoteError, run_limits, run_token
from netbench.jobs.harness.ps import task_of
from netbench.jobs.harness.step_delay import StepDelay
from netbench.jobs.harness.strategy import import_tf

PEER_FAREWELL_TIMEOUT_S = 120.0  # how long a finished worker keeps answering peers still training
GONE_PEER_TIMEOUT_S = 1.0  # how long a goodbye to a peer that already said its own may take


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Run this process's role (from TF_CONFIG): a parameter server, or a worker."""
    task_type, index, cluster = task_of(os.environ.get("TF_CONFIG", ""))
    if task_type == "ps":
        param_server.serve(args, events, index, cluster)
        return 0
    if task_type != "worker":
        raise ValueError(f"strategy {args.strategy} has no role for TF_CONFIG task type {task_type!r}")
    return _Worker(args, events, index, cluster).train()


class _Worker:
    def __init__(self, args: argparse.Namespace, events: IO[str], index: int, cluster: dict[str, list[str]],
                 token: str | None = None, limits: exchange.Limits | None = None) -> None:
        self.args, self.events, self.index, self.cluster = args, events, index, cluster
        self.token = token or run_token()  # the run's: every connection's hello carries it
        self.limits = limits or run_limits()
        self.listener: Listener | None = None  # gosgd, adpsgd: answering its peers
        self.replied = False  # a first reply may wait for every worker's first (compiling) step
        self.workers = len(cluster["worker"])
        self.strategy = args.strategy
        self.lock = threading.Lock()  # guards weights and gossip weight (the listener changes them)
        self.weights: list[np.ndarray] = []
        self.gossip_weight = 1.0 / self.workers
        self.rng = random.Random(args.seed * 7919 + index)
        self.servers: list[Channel] = []
        self.peers: dict[int, Channel] = {}
        self.farewells = threading.Semaphore(0)
        self.gone: set[int] = set()  # gosgd, adpsgd: peers that said goodbye (never chosen again)
        self.version = 0
        # ps-ssp's and ps-async's pipeline: pushes sent and not yet answered, and how many may stay so
        self.unanswered = 0
        self.depth = algorithms.pipeline_depth(self.strategy, getattr(args, "staleness", 0),
                                               getattr(args, "pipeline", algorithms.DEFAULT_PIPELINE))
        self.inboxes: list[queue.Queue] = []  # ps-sync, ps-async, ps-ssp: each server's replies (_read_replies)
        # ps-sync with backup workers: whether a server dropped this step's gradient as late
        self.backup = getattr(args, "backup_workers", 0) if self.strategy == "ps-sync" else 0
        self.dropped = False
        # gosgd, adpsgd: worker 0 keeps the start line (the workers whose warm-up is over)
        self.line = threading.Condition()
        self.at_line: set[int] = set()

    # -- the network -------------------------------------------------------------------

    def _peer_handler(self, message: exchange.Message) -> exchange.Message | None:
        if message.op == exchange.HELLO:  # a peer's first frame (the listener checked its token)
            return None
        if message.op == exchange.GOSSIP:
            with self.lock:
                self.weights, self.gossip_weight = algorithms.gossip_merge(
                    self.weights, self.gossip_weight, message.arrays, float(message.meta["weight"]))
            return None
        if message.op == exchange.AVERAGE:
            with self.lock:
                theirs = [w.copy() for w in self.weights]
                self.weights = algorithms.average(self.weights, message.arrays)
            return exchange.Message(exchange.REPLY, {}, tuple(theirs))
        if message.op == exchange.START:  # worker 0 keeps the start line
            if not self._wait_at_line(int(message.meta.get("worker", -1))):
                return exchange.Message(exchange.ERROR, {"message": self._short_of_line()})
            return exchange.Message(exchange.REPLY, {})
        if message.op == exchange.BYE:
            self.gone.add(int(message.meta.get("worker", -1)))
            self.farewells.release()
            return None
        raise exchange.ProtocolError(f"a worker does not answer {message.op!r}")

    def _peer(self, other: int, timeout_s: float | None = None) -> Channel:
        if other not in self.peers:
            channel = Channel.connect(self.cluster["worker"][other], timeout_s or self.args.startup_timeout or 60.0,
                                      self.limits)
            channel.cap = exchange.FrameCap.of(self.weights)  # a peer's reply is a model
            channel.send(exchange.Message(exchange.HELLO, {"worker": self.index, "token": self.token}))
            self.peers[other] = channel
        return self.peers[other]

    # -- the start line: own-pace workers end their warm-ups together ------------------

    def _start_line(self) -> None:
        """easgd, gosgd, adpsgd: wait at the end of the warm-up until every worker's is over, so
        the measured steps start together (a slow node's first, compiling, step can take seconds,
        and a worker that starts late, importing TensorFlow on a busy machine, more: the others
        would measure alone, and the cluster's images/sec, the sum of the workers' own rates,
        would add up rates taken apart). A peer's START connects to worker 0 (retrying until it
        listens: its model is built). ps-async and ps-ssp line up at their server
        (ServerState.may_read); ps-sync steps together anyway."""
        if self.strategy == "easgd":
            self._to_servers(exchange.START, [], {})
        elif self.index != 0:
            self._peer(0).request(exchange.Message(exchange.START, {"worker": self.index}))
        elif not self._wait_at_line(0):
            raise TimeoutError(self._short_of_line())

    def _wait_at_line(self, worker: int) -> bool:
        """Worker 0's start line: `worker` is there; wait until every worker still training is."""
        with self.line:
            self.at_line.add(worker)
            self.line.notify_all()
            return self.line.wait_for(lambda: not self._line_missing(), timeout=self.args.startup_timeout or None)

    def _line_missing(self) -> list[int]:
        return [w for w in range(self.workers) if w not in self.at_line and w not in self.gone]

    def _short_of_line(self) -> str:
        missing = ", ".join(map(str, self._line_missing()))
        return (f"worker {missing} did not end its warm-up within {self.args.startup_timeout or 0:g}s "
                "(the measured steps start together)")

    def _hello(self) -> None:
        """Worker 0 seeds the servers with the initial weights; the others read them back."""
        timeout = self.args.startup_timeout or 60.0
        self.servers = [Channel.connect(a, timeout, self.limits) for a in self.cluster.get("ps", [])]
        shards = exchange.split_by_shard(self.weights, len(self.servers))
        for channel, shard in zip(self.servers, shards):
            channel.cap = exchange.FrameCap.of(shard)  # a server's replies carry its shard
            arrays = tuple(shard) if self.index == 0 else ()
            channel.send(exchange.Message(exchange.HELLO, {"worker": self.index, "token": self.token}, arrays))
        replies = [channel.receive() for channel in self.servers]
        if self.index != 0:
            self.weights = exchange.join_shards([r.arrays for r in replies], len(self.weights))

    def _to_servers(self, op: str, arrays: list[np.ndarray], meta: dict) -> list[exchange.Message]:
        """Send each server its shard, then read every reply (the servers work in parallel)."""
        shards = exchange.split_by_shard(arrays, len(self.servers))
        for channel, shard in zip(self.servers, shards):
            channel.send(exchange.Message(op, {"worker": self.index, **meta}, tuple(shard)))
        return [channel.receive() for channel in self.servers]

    # -- one step's exchange: (comm seconds, wait seconds, staleness) --------------------

    def _exchange(self, step: int, grads: list[np.ndarray]) -> tuple[float, float, int | None]:
        t0 = time.monotonic()
        if self.strategy in algorithms.PUSH_STRATEGIES:
            return self._push(t0, grads)
        if self.strategy == "easgd":
            if (step + 1) % self.args.tau == 0:
                replies = self._to_servers(exchange.ELASTIC, self.weights, {})
                diff = exchange.join_shards([r.arrays for r in replies], len(self.weights))
                self.weights = [w - d for w, d in zip(self.weights, diff)]
            return time.monotonic() - t0, 0.0, None
        if self.strategy == "gosgd":
            if self.rng.random() < self.args.gossip_p:
                peer = algorithms.choose_peer(self.rng, self.index, self.workers, self.gone)
                if peer is not None:  # None: every peer is done, this worker trains alone
                    with self.lock:
                        self.gossip_weight, sent = algorithms.gossip_split(self.gossip_weight)
                        model = [w.copy() for w in self.weights]
                    self._peer(peer).send(exchange.Message(exchange.GOSSIP, {"weight": sent}, tuple(model)))
            return time.monotonic() - t0, 0.0, None
        if self.strategy == "adpsgd":
            peer = algorithms.choose_peer(self.rng, self.index, self.workers, self.gone)
            if peer is None:  # every peer is done: this worker trains alone
                return time.monotonic() - t0, 0.0, None
            with self.lock:
                model = [w.copy() for w in self.weights]
            reply = self._peer(peer).request(exchange.Message(exchange.AVERAGE, {}, tuple(model)))
            with self.lock:
                self.weights = algorithms.average(self.weights, reply.arrays)
            return time.monotonic() - t0, 0.0, None
        raise ValueError(f"no exchange for strategy {self.strategy!r}")

    def _push(self, t0: float, grads: list[np.ndarray]) -> tuple[float, float, int | None]:
        """Send this step's gradient; then take the replies already here (fresher weights) and
        block for more only while over the pipeline's depth (ps-sync: 0, its round's reply
        every step). wait: the share of the blocked time the server held a reply (barrier or
        gate); staleness: the largest of the updates answered in this step (None: none was)."""
        shards = exchange.split_by_shard(grads, len(self.servers))
        for channel, shard in zip(self.servers, shards):
            channel.send(exchange.Message(exchange.PUSH, {"worker": self.index, "version": self.version},
                                          tuple(shard)))
        self.unanswered += 1
        sent = time.monotonic()
        held, staleness = 0.0, None
        while self.unanswered > self.depth or (self.unanswered and self._answered()):
            replies = [self._reply(i) for i in range(len(self.inboxes))]
            self.unanswered -= 1
            self.weights = exchange.join_shards([r.arrays for r in replies], len(self.weights))
            self.version = min(int(r.meta["version"]) for r in replies)
            held = max(held, max(float(r.meta.get("wait_s", 0.0)) for r in replies))
            staleness = max([staleness or 0, *(int(r.meta.get("staleness", 0)) for r in replies)])
            self.dropped = any(bool(r.meta.get("dropped")) for r in replies)
        blocked = time.monotonic() - sent
        wait = min(held, blocked)
        return max(0.0, time.monotonic() - t0 - wait), wait, staleness

    def _answered(self) -> bool:
        """Whether every server's next reply is here."""
        return all(not inbox.empty() for inbox in self.inboxes)

    def _reply(self, server: int) -> exchange.Message:
        """Server `server`'s next reply; one that does not come within the limits (a server cut
        off, or gone silent) raises TimeoutError naming it. The server names a worker that
        holds its barrier or gate sooner (Limits.barrier_s), with an error frame."""
        limit = self.limits.reply_s
        if not self.replied:  # the first waits for every worker's first, compiled, step
            limit += self.args.startup_timeout or 0.0
        try:
            got = self.inboxes[server].get(timeout=limit)
        except queue.Empty:
            raise TimeoutError(f"no reply from parameter server {self.cluster['ps'][server]} "
                               f"within {limit:g}s") from None
        if isinstance(got, BaseException):
            raise got
        self.replied = True
        return got

    def _read_replies(self) -> None:
        """A thread per server takes its replies as they come, so a server never blocks
        sending one while this worker is busy sending its next pushes (both sides' buffers
        full of model-sized frames would deadlock)."""
        self.inboxes = [queue.Queue() for _ in self.servers]

        def read(channel: Channel, inbox: queue.Queue) -> None:
            while True:
                try:
                    inbox.put(channel.receive())
                except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                    if isinstance(exc, EOFError):
                        exc = EOFError(f"parameter server {channel.name} closed the connection")
                    elif not isinstance(exc, RemoteError):  # a RemoteError names the server already
                        exc = ConnectionError(f"parameter server {channel.name}: {type(exc).__name__}: {exc}")
                    inbox.put(exc)
                    return

        for channel, inbox in zip(self.servers, self.inboxes):
            threading.Thread(target=read, args=(channel, inbox), name="netbench-replies", daemon=True).start()

    def _local_update(self, grads: list[np.ndarray]) -> None:
        """Decentralised and elastic strategies train their replica locally (plain SGD)."""
        with self.lock:
            self.weights = [w - self.args.learning_rate * g for w, g in zip(self.weights, grads)]

    def _evaluate_centre(self, evaluator: Any, state: list[Any], step: int, train_s: float) -> ev.Eval:
        """EASGD's model is the centre variable (the paper evaluates it): read it from the
        servers, outside the timed steps, and score it."""
        replies = self._to_servers(exchange.CENTRE, [], {})
        centre = exchange.join_shards([r.arrays for r in replies], len(self.weights))
        return dataclasses.replace(evaluator(centre, state, step, train_s), of=ev.EVAL_OF_CENTRE)

    def _goodbye(self) -> None:
        if self.inboxes:  # ps-sync, ps-async, ps-ssp: the pipeline's last replies, then bye through the readers
            for _ in range(self.unanswered):
                for server in range(len(self.inboxes)):
                    self._reply(server)
            self.unanswered = 0
            for channel in self.servers:
                channel.send(exchange.Message(exchange.BYE, {"worker": self.index}))
            for server in range(len(self.inboxes)):
                self._reply(server)
            return
        for channel in self.servers:
            channel.request(exchange.Message(exchange.BYE, {"worker": self.index}))
        if self.strategy in algorithms.PEER_STRATEGIES:
            for other in range(self.workers):
                if other == self.index:
                    continue
                try:
                    gone = other in self.gone  # it may have stopped answering: a short try
                    self._peer(other, GONE_PEER_TIMEOUT_S if gone else None).send(
                        exchange.Message(exchange.BYE, {"worker": self.index}))
                except OSError:
                    if other not in self.gone:
                        raise
            deadline = time.monotonic() + PEER_FAREWELL_TIMEOUT_S
            for _ in range(self.workers - 1):  # keep answering peers that still train
                if not self.farewells.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    break

    # -- training ------------------------------------------------------------------------

    def train(self) -> int:
        args = self.args
        arm_startup_watchdog(args.startup_timeout)
        tf, keras = import_tf(args)
        from netbench.jobs.harness.models import build_model, model_size

        data = loop.load_training_data(tf, args, self.index, self.workers)
        classes = args.classes or max(data.classes, 2)
        batches = datasets.batches(data, args.batch_size)
        keras.utils.set_random_seed(args.seed)  # the same initial weights on every worker
        model = build_model(keras, args.model, data.input_shape, classes)
        params, model_bytes = model_size(model)
        self.weights = [np.array(v.numpy()) for v in model.trainable_variables]
        state = [v.value for v in model.non_trainable_variables]
        gradient = _make_gradient(tf, model)
        evaluator = evaluate.for_run(tf, args, model)
        if self.strategy in algorithms.PEER_STRATEGIES:
            host, port = self.cluster["worker"][self.index].rsplit(":", 1)
            self.listener = Listener(host, int(port), self._peer_handler, self.token,
                                     cap=exchange.FrameCap.of(self.weights), limits=self.limits)
        if self.cluster.get("ps"):
            self._hello()
            if self.strategy in algorithms.PUSH_STRATEGIES:
                self._read_replies()
        emit(ev.start_event(self.index, self.workers, os.getpid(), time.monotonic(), tf.__version__, args.model,
                            params, args.batch_size, strategy=self.strategy, role="worker",
                            model_bytes=model_bytes, input_shape=data.input_shape, classes=classes,
                            data=args.data, step=ev.STEP_SPLIT), self.events)
        disarm_startup_watchdog()
        # --until-stopped (a launch's processes): measured steps until the controller stops it
        until_stopped = getattr(args, "until_stopped", False)
        total = args.warmup + args.steps
        clock = evaluate.TrainClock()
        delay = StepDelay()
        k = -1
        while until_stopped or k + 1 < total:
            k += 1
            if k == args.warmup and self.strategy in algorithms.LINE_STRATEGIES:
                self._start_line()  # before the first measured step (with no warm-up, the first)
            x, y = batches[k % len(batches)]
            t0 = time.monotonic()
            with self.lock:
                current = list(self.weights)
            loss, grads, state = gradient(current, state, x, y)
            delay.pause()  # the node's step delay: compute time
            if self.strategy not in algorithms.SERVER_MODES or self.strategy == "easgd":
                if self.strategy != "adpsgd":  # adpsgd applies its gradient after averaging
                    self._local_update(grads)
            comm, wait, staleness = self._exchange(k, grads)
            if self.strategy == "adpsgd":
                self._local_update(grads)
            if self.listener is not None and self.listener.failure():
                raise RuntimeError(f"worker {self.index} answering its peers: {self.listener.failure()}")
            t2 = time.monotonic()
            clock.add(t2 - t0)
            phase = ev.PHASE_WARMUP if k < args.warmup else ev.PHASE_MEASURED
            step = ev.step_event(k, phase, t0, t2, args.batch_size, loss, compute=max(0.0, t2 - t0 - comm - wait),
                                 comm=comm, wait=wait, staleness=staleness)
            if self.backup:  # a key version-1 readers keep: jobs.stragglers counts the drops
                step = dataclasses.replace(step, extra=(("dropped", self.dropped),))
            emit(step, self.events)
            if evaluator is not None and evaluate.due(k + 1, total, args.eval_every):
                with self.lock:
                    current = list(self.weights)
                emit(evaluator(current, state, k + 1, clock.seconds), self.events)
                if self.strategy == "easgd" and self.index == 0:
                    emit(self._evaluate_centre(evaluator, state, k + 1, clock.seconds), self.events)
        self._goodbye()
        emit(ev.Done(time=time.monotonic(), steps=total), self.events)
        return total


def _make_gradient(tf: Any, model: Any):
    """gradient(weights, state, x, y) -> (mean loss, numpy gradients, new state): one compiled
    forward and backward pass at the given weights (Keras 3 stateless_call)."""

    @tf.function
    def compiled(weights: list[Any], state: list[Any], x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(weights)
            logits, new_state = model.stateless_call(weights, state, x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        return loss, tape.gradient(loss, weights), new_state

    def gradient(weights: list[np.ndarray], state: list[Any], x: np.ndarray, y: np.ndarray):
        loss, grads, new_state = compiled([tf.constant(w) for w in weights], state, x, y)
        return float(loss.numpy()), [g.numpy() for g in grads], list(new_state)

    return gradient
