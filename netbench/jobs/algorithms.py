"""The arithmetic of the exchange strategies (pure: numpy, no sockets, no TensorFlow).

* ``ps-sync`` (BSP): every worker pushes its step's gradient; the server applies the mean of a
  round's W gradients once, together, and a worker's pull waits for its round (the barrier);
  with B backup workers (Chen et al. 2016) a round closes on its first W - B gradients, and a
  gradient computed on weights older than the current version (its round closed without it)
  is dropped and answered at once with the new weights (`ServerState.dropped` counts them);
  the warm-up runs as plain BSP (a round waits for every worker until each has pushed its
  `warmup` gradients), so the backups are the slow workers of the steady state, not the
  one whose start-up (a slow node's import and first, tracing step) ran late;
* ``ps-async`` (ASP, as Dean et al. 2012's Downpour SGD, TF's and MXNet's parameter servers):
  each push is applied at once and answered at once; a worker waits for its own push's reply
  (the weights) every step and never for the other workers, so an update's staleness is about
  the number of workers less one; with a `pipeline` of k it leaves up to k of its own pushes
  unanswered while it computes on the freshest weights it has (hiding its round trip; the
  staleness grows to about (k + 1) x workers - 1);
* ``ps-ssp`` (SSP, Ho et al. 2013): each push is applied at once; a worker computes on the
  weights it last received and keeps up to S pushes unanswered (its pipeline), and the server
  answers push k once every worker still training has pushed k (the gate): so a worker that
  has pushed c steps runs at most S ahead of the slowest, and a step hides up to S round trips;
* ``easgd`` (asynchronous EASGD, Zhang, Choromanska and LeCun 2015): every tau local steps a
  worker and the centre variable move towards each other by alpha times their difference;
* ``gosgd`` (Blot et al. 2016): after each step, with probability p, a worker halves its weight
  and pushes its model and that weight to one random peer, which merges by weighted average;
* ``adpsgd`` (Lian et al. 2018): each step a worker averages its model with one random
  peer's, atomically at the peer, then applies its gradient.

`ServerState` is a parameter server's state machine; its edge (harness.peers) only adds a
lock, a condition and sockets. Staleness of an update = updates applied since the weights it
was computed on were read (0 under BSP: a round's gradients all start from one version).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Collection, Sequence

import numpy as np

from netbench.jobs.exchange import FrameCap

SYNC, SSP, ASYNC, ELASTIC_MODE = "sync", "ssp", "async", "elastic"
DEFAULT_STALENESS = 3
DEFAULT_TAU = 4
DEFAULT_GOSSIP_P = 0.1
# Zhang et al. (2015) fix beta = p * alpha = 0.9 (p workers) in their experiments
EASGD_BETA = 0.9

# the strategies this module serves, and which of them have parameter servers
EXCHANGE_STRATEGIES = ("ps-sync", "ps-async", "ps-ssp", "easgd", "gosgd", "adpsgd")
SERVER_MODES = {"ps-sync": SYNC, "ps-async": ASYNC, "ps-ssp": SSP, "easgd": ELASTIC_MODE}
# the strategies whose workers push a gradient every step and get the weights back
PUSH_STRATEGIES = ("ps-sync", "ps-async", "ps-ssp")
# ps-async's pushes a worker leaves unanswered while it computes (its `pipeline`): 0, the studies'
# ASP; a pipelined run names its window (16 is wide enough for a round trip of 100 ms at a few
# milliseconds of compute per step); not a staleness bound (the server gates nothing)
DEFAULT_PIPELINE = 0
PEER_STRATEGIES = ("gosgd", "adpsgd")
# the strategies whose workers wait at a start line after their warm-up (harness.exchange_loop):
# nothing else lines them up (ps-async and ps-ssp line up at the server: ServerState.may_read)
LINE_STRATEGIES = ("easgd", *PEER_STRATEGIES)


def default_elastic_alpha(workers: int) -> float:
    """The EASGD paper's moving rate for `workers` workers: alpha = beta / p with beta = 0.9."""
    return EASGD_BETA / max(1, workers)


def pipeline_depth(strategy: str, staleness: int, pipeline: int = DEFAULT_PIPELINE) -> int:
    """Pushes a worker may leave unanswered while it computes on the weights it has: SSP's
    slack (ps-ssp: S), ASP's `pipeline` (ps-async: 0 unless set), none for BSP (ps-sync waits
    for its round's reply every step)."""
    if strategy == "ps-async":
        return max(0, pipeline)
    return max(0, staleness) if strategy == "ps-ssp" else 0


def server_gate(strategy: str, staleness: int) -> int:
    """The lead the server's gate allows before it answers a push (ServerState.staleness): 0
    under ps-ssp, whose workers' pipelines carry the S steps; `staleness` otherwise."""
    return 0 if strategy == "ps-ssp" else staleness


def ssp_may_proceed(clock: int, clocks: Sequence[int], staleness: int) -> bool:
    """Whether a worker that has pushed `clock` steps may read and go on, given the push
    counts of the workers still training (its own included): at most `staleness` ahead."""
    return not clocks or clock - min(clocks) <= staleness


def elastic_difference(centre: Sequence[np.ndarray], replica: Sequence[np.ndarray],
                       alpha: float) -> list[np.ndarray]:
    """alpha x (replica - centre): the centre moves by it, the replica by minus it."""
    return [alpha * (r - c) for c, r in zip(centre, replica)]


def gossip_split(weight: float) -> tuple[float, float]:
    """(weight kept, weight sent) of a GoSGD push: each half of the sender's weight."""
    return weight / 2, weight / 2


def gossip_merge(mine: Sequence[np.ndarray], my_weight: float, theirs: Sequence[np.ndarray],
                 their_weight: float) -> tuple[list[np.ndarray], float]:
    """A GoSGD receiver's model and weight after merging a push: the weighted mean, and the
    sum of the weights (so the weights of all workers always sum to 1)."""
    total = my_weight + their_weight
    merged = [(my_weight * a + their_weight * b) / total for a, b in zip(mine, theirs)]
    return merged, total


def average(mine: Sequence[np.ndarray], theirs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """AD-PSGD's pairwise average: both models become their mean."""
    return [(a + b) / 2 for a, b in zip(mine, theirs)]


def choose_peer(rng: random.Random, me: int, workers: int, gone: Collection[int] = ()) -> int | None:
    """A peer drawn uniformly from the other workers that have not said goodbye (`gone`: a
    finished worker answers its peers only for a while); None when every other one is gone
    (the worker goes on alone)."""
    if workers < 2:
        raise ValueError("a peer needs at least two workers")
    if not gone:
        other = rng.randrange(workers - 1)
        return other if other < me else other + 1
    left = [w for w in range(workers) if w != me and w not in gone]
    return left[rng.randrange(len(left))] if left else None


def model_transfers_per_step(strategy: str, workers: int, gossip_p: float = DEFAULT_GOSSIP_P,
                             tau: int = DEFAULT_TAU) -> float:
    """Model-sized transfers a worker's node SENDS per step, as the algorithm says (what
    --sample-resources' tx bytes of a worker should show, over the model's bytes):
    ps-sync/ps-async/ps-ssp its gradient (the weights come back), easgd its replica every tau steps,
    gosgd a model with probability p, adpsgd its model every step plus, on average, one reply
    to a peer's request (each worker is asked once per step by someone), allreduce 2(W-1)/W
    of one (ring)."""
    if strategy in PUSH_STRATEGIES:
        return 1.0
    if strategy == "adpsgd":
        return 2.0
    if strategy == "easgd":
        return 1.0 / tau
    if strategy == "gosgd":
        return gossip_p
    if strategy in ("allreduce", "allreduce-accum"):
        return 2 * (workers - 1) / workers
    raise ValueError(f"no expected transfers for strategy {strategy!r}")


@dataclass
class ServerState:
    """One parameter server's shard: its weights, the version (updates applied) and each
    worker's push count. `mode` is SYNC, ASYNC, SSP or ELASTIC_MODE."""

    mode: str
    workers: int
    learning_rate: float = 0.01
    staleness: int = DEFAULT_STALENESS
    alpha: float = 0.0
    weights: list[np.ndarray] | None = None  # None until worker 0's hello
    version: int = 0
    clocks: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    lost: dict[int, str] = field(default_factory=dict)  # workers whose connection ended without a bye
    _round: dict[int, list[np.ndarray]] = field(default_factory=dict)
    backup: int = 0  # SYNC: gradients a round may go without (backup workers); 0: every worker's
    dropped: dict[int, int] = field(default_factory=dict)  # backup: each worker's gradients dropped as late
    _awaits: dict[int, int] = field(default_factory=dict)  # backup: the version each worker's reply waits for
    warmup: int = 0  # pushes of each worker's warm-up: rounds (backup) and replies (ASYNC, SSP) wait for every worker
    greeted: set[int] = field(default_factory=set)  # workers whose hello came (the start waits for all)
    at_line: set[int] = field(default_factory=set)  # easgd: workers at the start line (their warm-up over)

    def initialise(self, weights: Sequence[np.ndarray]) -> None:
        if self.weights is None:
            self.weights = [np.array(w, copy=True) for w in weights]

    @property
    def ready(self) -> bool:
        return self.weights is not None

    def greet(self, worker: int) -> None:
        """The worker's hello came (worker 0's brings the weights: initialise first)."""
        self.greeted.add(worker)

    def reach_line(self, worker: int) -> None:
        """easgd: the worker's warm-up is over (its START came)."""
        self.at_line.add(worker)

    def short_of_line(self) -> list[int]:
        """easgd: the workers still training that have not reached the start line."""
        return self._awaited(self.at_line)

    def absent(self) -> list[int]:
        """The workers whose hello has not come (a worker's hello is answered once none is:
        every worker starts its first step together, so no worker trains alone at the start
        and has its rate taken as the cluster's share); lost ones are not waited for."""
        return self._awaited(self.greeted)

    def _awaited(self, came: set[int]) -> list[int]:
        """The workers not in `came` that are still training and not lost."""
        return [w for w in range(self.workers) if w not in came and w not in self.lost and w not in self.done]

    def cap(self) -> "FrameCap | None":
        """What a frame about this shard may carry (None until worker 0's hello brings it)."""
        return FrameCap.of(self.weights) if self.weights is not None else None

    def snapshot(self) -> tuple[np.ndarray, ...]:
        """A copy of the weights, taken under the server's lock: a reply is encoded after the
        lock is released, while other connections' pushes update the live arrays in place, so
        it must never carry them (it would mix two versions while naming one)."""
        return tuple(np.array(w, copy=True) for w in self.weights or ())

    def active_clocks(self) -> list[int]:
        return [self.clocks.get(w, 0) for w in range(self.workers) if w not in self.done]

    def push(self, worker: int, base_version: int, grads: Sequence[np.ndarray]) -> int:
        """Take a worker's gradient; returns the staleness of the update it becomes."""
        assert self.weights is not None, "push before the weights exist"
        self.clocks[worker] = self.clocks.get(worker, 0) + 1
        if self.mode == SYNC and self.backup:
            return self._push_backup(worker, base_version, grads)
        if self.mode == SYNC:
            self._round[worker] = [np.asarray(g) for g in grads]
            self._close_round()
            return 0
        staleness = max(0, self.version - base_version)
        for w, g in zip(self.weights, grads):
            w -= self.learning_rate * g
        self.version += 1
        return staleness

    def _push_backup(self, worker: int, base_version: int, grads: Sequence[np.ndarray]) -> int:
        """A ps-sync push with backup workers: a gradient on the current weights joins the open
        round (its reply waits for the round to close), one on older weights came after its
        round closed: dropped, counted, answered at once."""
        if base_version < self.version:
            self.dropped[worker] = self.dropped.get(worker, 0) + 1
            self._awaits[worker] = self.version
            return 0
        self._round[worker] = [np.asarray(g) for g in grads]
        self._awaits[worker] = self.version + 1
        self._close_round()
        return 0

    def round_size(self) -> int:
        """Gradients that close a ps-sync round: every worker still training, less the backup
        workers (at least one) once every one of them has pushed its warm-up's gradients."""
        active = [w for w in range(self.workers) if w not in self.done]
        if any(self.clocks.get(w, 0) < self.warmup for w in active):
            return len(active)  # a worker still warming up: the round waits for it (BSP)
        return max(1, len(active) - self.backup)

    def _close_round(self) -> None:
        """Apply the round's mean gradient once every worker still training has pushed (with
        backup workers: once round_size() of them have)."""
        expected = [w for w in range(self.workers) if w not in self.done]
        if self.backup:
            full = len(self._round) >= self.round_size()
        else:
            full = all(w in self._round for w in expected)
        if self._round and full:
            count = len(self._round)
            for i, w in enumerate(self.weights or []):
                w -= self.learning_rate * sum(g[i] for g in self._round.values()) / count
            self._round.clear()
            self.version += 1

    def may_read(self, worker: int) -> bool:
        """Whether the worker's pull can be answered now (the barrier, or the gate; ASYNC and
        ELASTIC_MODE answer at once)."""
        clock = self.clocks.get(worker, 0)
        if self.mode == SYNC and self.backup:
            return self.version >= self._awaits.get(worker, 0)
        if self.mode == SYNC:
            return self.version >= clock
        if self._lockstep(clock):
            return False  # the warm-up steps in lockstep: the measured ones start together
        if self.mode == SSP:
            return ssp_may_proceed(clock, self.active_clocks(), self.staleness)
        return True

    def _lockstep(self, clock: int) -> list[int]:
        """ASYNC and SSP in the warm-up (a worker's first `warmup` pushes): the workers still
        training that have pushed fewer than `clock` times, whom a reply waits for; [] after it."""
        if self.mode not in (SSP, ASYNC) or clock > self.warmup:
            return []
        return [w for w in range(self.workers) if w not in self.done and self.clocks.get(w, 0) < clock]

    def holding(self, worker: int) -> list[int]:
        """The workers still training that the worker's read waits for: those missing from
        the round (SYNC), during the warm-up those that have pushed less (ASYNC, SSP), after it
        those more than `staleness` behind it (SSP); none otherwise."""
        active = [w for w in range(self.workers) if w not in self.done and w != worker]
        clock = self.clocks.get(worker, 0)
        if behind := self._lockstep(clock):
            return behind
        if self.mode == SYNC:
            return [w for w in active if w not in self._round]
        if self.mode == SSP:
            return [w for w in active if clock - self.clocks.get(w, 0) > self.staleness]
        return []

    def lose(self, worker: int, cause: str) -> None:
        """The worker's connection ended without a goodbye: whoever waits for it will not be answered."""
        if worker not in self.done:
            self.lost.setdefault(worker, cause)

    def vanished(self, worker: int) -> str | None:
        """Why the worker's read can never be answered: a worker it waits for was lost (None: none was)."""
        return next((self.lost[w] for w in self.holding(worker) if w in self.lost), None)

    def elastic(self, replica: Sequence[np.ndarray]) -> list[np.ndarray]:
        """An EASGD exchange: the centre moves towards the replica; returns the difference
        the replica must move away by."""
        assert self.weights is not None, "elastic before the weights exist"
        diff = elastic_difference(self.weights, replica, self.alpha)
        for w, d in zip(self.weights, diff):
            w += d
        self.version += 1
        return diff

    def leave(self, worker: int) -> None:
        """The worker is done: it no longer holds back a round or the gate."""
        self.done.add(worker)
        if self.mode == SYNC:
            self._close_round()
