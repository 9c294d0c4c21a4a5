"""Optional resource sampling of a training process (``--sample-resources SECONDS``).

Each process samples itself from /proc: CPU time (user + system, all threads), resident
memory, and the bytes its network namespace's interfaces received and sent (loopback
excluded). On a testbed node that namespace is the node, so the bytes are the node's
traffic over its shaped link. Samples travel as ``resources`` events on the same stream as
the steps, so they reach the controller from local and remote nodes alike; the controller
turns them into one summary per process (`summarise`).

Reading and summarising are pure over text, so tests feed them fixed /proc contents.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, Union

from netbench.jobs import events as ev

EVENT = ev.Resources.kind


@dataclass(frozen=True)
class Sample:
    time: float  # monotonic seconds
    cpu_s: float  # user + system CPU seconds of the process so far
    rss_bytes: int
    rx_bytes: int  # received by the namespace's interfaces (lo excluded) so far
    tx_bytes: int

    def to_event(self) -> ev.Resources:
        return ev.Resources(time=self.time, cpu_s=self.cpu_s, rss_bytes=self.rss_bytes,
                            rx_bytes=self.rx_bytes, tx_bytes=self.tx_bytes)


def cpu_seconds(stat: str, ticks_per_s: int) -> float:
    """utime + stime from /proc/<pid>/stat (fields 14 and 15; the name may hold spaces)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def rss_bytes(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ValueError(f"VmRSS in unexpected unit {unit!r}")
            return int(value) * 1024
    raise ValueError("no VmRSS line")


def interface_bytes(net_dev: str) -> tuple[int, int]:
    """(received, sent) bytes summed over every interface but loopback, from /proc/net/dev."""
    rx = tx = 0
    for line in net_dev.splitlines()[2:]:
        name, _, numbers = line.partition(":")
        if not numbers or name.strip() == "lo":
            continue
        columns = numbers.split()
        rx += int(columns[0])
        tx += int(columns[8])
    return rx, tx


def read_sample(proc: Path = Path("/proc/self"), clock: Callable[[], float] = time.monotonic,
                ticks_per_s: int | None = None) -> Sample:
    ticks = ticks_per_s or os.sysconf("SC_CLK_TCK")
    rx, tx = interface_bytes((proc / "net" / "dev").read_text())
    return Sample(time=clock(), cpu_s=cpu_seconds((proc / "stat").read_text(), ticks),
                  rss_bytes=rss_bytes((proc / "status").read_text()), rx_bytes=rx, tx_bytes=tx)


class Sampler:
    """Emits a sample now and every `interval_s` from a daemon thread until `stop()`, which
    emits one last sample (call it before the process reports it is done)."""

    def __init__(self, interval_s: float, emit: Callable[[ev.Resources], None],
                 read: Callable[[], Sample] = read_sample) -> None:
        self.interval_s = interval_s
        self._emit, self._read = emit, read
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="netbench-resources", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def _sample(self) -> None:
        try:
            self._emit(self._read().to_event())
        except (OSError, ValueError, IndexError):
            pass  # a process without /proc (or a changed format) reports no resources

    def _loop(self) -> None:
        self._sample()
        while not self._stopped.wait(self.interval_s):
            self._sample()

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sample()


@dataclass(frozen=True)
class Usage:
    """One process over its sampled window."""

    role: str
    index: int
    samples: int
    window_s: float
    cpu_util: float | None  # CPU seconds per wall second (1.0 = one core busy)
    rss_peak_bytes: int
    rx_bytes: int
    tx_bytes: int

    @property
    def key(self) -> str:
        return f"{self.role}{self.index}"


def summarise(events: Iterable[Union[ev.Event, Mapping]], ranks_per_node: int = 1) -> tuple[Usage, ...]:
    """One Usage per process that sent resources events, in (role, index) order (events are
    typed, or a run record's JSON objects). With several ranks per node (model/ranks.py) the
    node's ranks read the same interface counters: the node's bytes are its first rank's, the
    others' are 0, so the run's totals count each node's link once."""
    by_process: dict[tuple[str, int], list[ev.Resources]] = {}
    for e in map(ev.as_event, events):
        if isinstance(e, ev.Resources):
            by_process.setdefault((e.task_role, e.worker or 0), []).append(e)
    out = []
    for (role, index), samples in sorted(by_process.items()):
        samples.sort(key=lambda e: e.time)
        first, last = samples[0], samples[-1]
        window = last.time - first.time
        out.append(Usage(role=role, index=index, samples=len(samples), window_s=window,
                         cpu_util=(last.cpu_s - first.cpu_s) / window if window > 0 else None,
                         rss_peak_bytes=max(e.rss_bytes for e in samples),
                         rx_bytes=last.rx_bytes - first.rx_bytes if _counts_link(role, index, ranks_per_node) else 0,
                         tx_bytes=last.tx_bytes - first.tx_bytes if _counts_link(role, index, ranks_per_node) else 0))
    return tuple(out)


def _counts_link(role: str, index: int, ranks_per_node: int) -> bool:
    """Whether this process's byte counters stand for its node's link (a worker rank that is
    its node's first, or any process of a one-process node)."""
    return role != "worker" or ranks_per_node <= 1 or index % ranks_per_node == 0


def totals(usage: Sequence[Usage]) -> dict[str, float | int | None]:
    """The run's row in results.csv: mean CPU use, largest process, bytes over all nodes."""
    utils = [u.cpu_util for u in usage if u.cpu_util is not None]
    return {"cpu_util_mean": sum(utils) / len(utils) if utils else None,
            "rss_peak_bytes": max((u.rss_peak_bytes for u in usage), default=None),
            "net_tx_bytes": sum(u.tx_bytes for u in usage) if usage else None,
            "net_rx_bytes": sum(u.rx_bytes for u in usage) if usage else None}
