"""ps-sync with backup workers as real processes on loopback (tier tf): a parameter server and three
TensorFlow workers, one of them slowed (its gradient takes SLOW_S longer: a test-only wrapper
around the exchange loop's gradient), with --backup-workers 1. The rounds stop waiting for the
slow worker: the others' steps are shorter than its sleep, its late gradients are dropped and
counted, and the attribution names it. (bench/backup_workers.py measures the images/sec of the
same cluster with and without the backup worker, side by side.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netbench.jobs import events as ev
from netbench.jobs import exchange
from netbench.jobs.harness import step_delay
from netbench.jobs import stragglers
from netbench.model.job import JobSpec
from tests.tf.test_worker_tf import _free_ports
from tests.unit.test_worker import _env

SLOW_S = 0.25  # the slow worker's step delay (seconds added to each of its steps)
# the fast workers train long enough for the slow one's few steps to fall within their training
# (each worker runs its own step count; a sweep stops them all once worker 0's window is measured)
STEPS, WARMUP = 60, 2
SLOW_STEPS, SLOW_WARMUP = 3, 1
SLOW = 2  # the slowed worker's index (not worker 0, whose steps measure the rounds)

def _start(backup: int, tmp_path: Path) -> list[subprocess.Popen]:
    """The server, then three workers (worker SLOW slowed); stdout of each to a file."""
    ports = _free_ports(4)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports[:3]], "ps": [f"127.0.0.1:{ports[3]}"]}
    argv = ["--strategy", "ps-sync", "--model", "mlp", "--batch-size", "32", "--warmup", str(WARMUP),
            "--steps", str(STEPS), "--seed", "1", "--backup-workers", str(backup)]
    procs, token = [], {exchange.TOKEN_ENV: f"backup-test-{backup}"}  # the run's token, as the controller gives it
    for role, index in (("ps", 0), ("worker", 0), ("worker", 1), ("worker", 2)):
        config = json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})
        slow = (role, index) == ("worker", SLOW)
        tail = ["--warmup", str(SLOW_WARMUP), "--steps", str(SLOW_STEPS)] if slow else []
        delay = {step_delay.ENV_SECONDS: str(SLOW_S)} if slow else {}  # as --step-delay gives a node
        name = f"b{backup}-{role}{index}"
        with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
            procs.append(subprocess.Popen([sys.executable, "-m", "netbench.jobs.worker", *argv, *tail], stdout=out,
                                          stderr=err, env={**_env(config), **token, **delay}, text=True))
    return procs


def _events(backup: int, tmp_path: Path) -> list[ev.Event]:
    events = []
    for index in range(3):
        for line in (tmp_path / f"b{backup}-worker{index}.out").read_text().splitlines():
            event = ev.parse_line(line)
            if event is not None:
                events.append(ev.received(event, index, "worker", 0.0))
    return events


def test_a_backup_worker_stops_the_rounds_waiting_for_the_slow_worker(tmp_path):
    procs = _start(1, tmp_path)
    try:
        deadline = time.monotonic() + 180
        for proc in procs[1:]:
            assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, \
                sorted(p.read_text()[-2000:] for p in tmp_path.glob("*.err"))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    events = _events(1, tmp_path)
    found = stragglers.attribute(events, JobSpec(strategy="ps-sync", batch_size=32), ("n1", "n2", "n3"),
                                 backup_workers=1)
    # without a backup worker no round closes before the slow worker's gradient (the barrier,
    # tests/unit/test_algorithms.py): every step of worker 0 would last more than SLOW_S. With
    # one, a round closes on the two fast workers' gradients: worker 0 steps at their pace
    assert found.rank_of(0).step_mean_s < 0.5 * SLOW_S, found
    assert found.rank_of(SLOW).step_mean_s > SLOW_S and found.straggler_node == "n3", found
    # the warm-up runs as BSP (the server's --warmup pushes of every worker): none dropped there
    steps = [e for e in events if isinstance(e, ev.Step)]
    assert not any(dict(e.extra)["dropped"] for e in steps if e.step < WARMUP), [(e.step, e.extra) for e in steps]
    # the slow worker's later gradients, pushed while both fast workers still trained, came after
    # their round had closed: every one dropped, and answered with the new weights at once
    fast_end = min(max(e.end for e in steps if e.worker == w) for w in (0, 1))
    during = [e for e in steps if e.worker == SLOW and e.step >= WARMUP and e.end < fast_end]
    assert during and all(dict(e.extra)["dropped"] for e in during), [(e.step, e.extra) for e in steps]
    assert all(e.wait < 0.05 for e in during)  # not held by a barrier
    # the results count the measured steps' drops per worker
    for rank in found.ranks:
        assert rank.dropped == sum(1 for e in steps if e.worker == rank.rank and e.measured
                                   and dict(e.extra)["dropped"]), rank
