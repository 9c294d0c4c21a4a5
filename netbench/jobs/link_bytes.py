"""A user's command that reports no steps, measured in bytes on each node's link (pure).

A user's command (model/command_job.py) reports its steps through netbench.track (whose
import already says so: a `track-loaded` event) or through ``--step-regex``. A command that
does neither is measured in bytes: the controller reads each of the job's nodes' interface
counters (received and sent bytes) about every `SAMPLE_S` seconds, and `BytesWindow` decides
from them:

* the job has started once its nodes' links together carried `ACTIVE_BYTES` since the
  launch began (a namespace's link is otherwise all but silent);
* its warm-up then lasts `warmup_s` seconds (the job's --warmup, counted in seconds for this
  source), after which the measured window runs for `window_s` seconds (--seconds, else
  `WINDOW_S`), from one counter sample to another, so the rates are over the samples' own
  interval;
* a track event from any rank before the window ends means the job does report steps: the
  bytes are dropped and the point is measured from its steps as usual.

It is not a step measurement: a bytes point has no images/sec, only bytes per second.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

from netbench.jobs import events as ev
from netbench.model.command_job import BYTES_WINDOW_S, SOURCE_BYTES, SOURCE_REGEX, SOURCE_TRACK

TRACK_LOADED = "track-loaded"  # netbench.track's event at import: this job reports steps
SAMPLE_S = 0.5  # seconds between counter samples
ACTIVE_BYTES = 16 * 1024  # bytes on the nodes' links, together, that say the job has started
WINDOW_S = BYTES_WINDOW_S  # the measured window without --seconds


@dataclass(frozen=True)
class LinkSample:
    """Every node's interface counters at one time (monotonic seconds): (node, rx_bytes, tx_bytes)."""

    time: float
    counters: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, time: float, counters: Mapping[str, tuple[int, int]]) -> "LinkSample":
        return cls(time, tuple((node, int(rx), int(tx)) for node, (rx, tx) in sorted(counters.items())))

    def total(self) -> int:
        return sum(rx + tx for _, rx, tx in self.counters)


@dataclass(frozen=True)
class NodeBytes:
    """One node's link over a window: bytes received and sent, and per second."""

    node: str
    rx_bytes: int
    tx_bytes: int
    rx_bytes_per_s: float
    tx_bytes_per_s: float


def link_rates(start: LinkSample, end: LinkSample) -> tuple[NodeBytes, ...]:
    """Each node's bytes and bytes/s between two samples; ValueError when the samples are not
    of the same nodes, not in order, or a counter went back (its interface was replaced)."""
    seconds = end.time - start.time
    if seconds <= 0:
        raise ValueError(f"link counters: the window's end ({end.time}) is not after its start ({start.time})")
    before = {node: (rx, tx) for node, rx, tx in start.counters}
    out = []
    for node, rx, tx in end.counters:
        if node not in before:
            raise ValueError(f"link counters: node {node} was not read at the window's start")
        rx0, tx0 = before[node]
        if rx < rx0 or tx < tx0:
            raise ValueError(f"link counters: node {node}'s counters went back (its interface was replaced?)")
        out.append(NodeBytes(node, rx - rx0, tx - tx0, (rx - rx0) / seconds, (tx - tx0) / seconds))
    return tuple(out)


def interface_counters(net_dev: str, ifname: str) -> tuple[int, int] | None:
    """(rx_bytes, tx_bytes) of `ifname` in the text of /proc/net/dev (the reader's network
    namespace); None when the interface is not there."""
    for line in net_dev.splitlines()[2:]:
        name, _, numbers = line.partition(":")
        columns = numbers.split()
        if name.strip() == ifname and len(columns) >= 9:
            return int(columns[0]), int(columns[8])
    return None


def mean_sent_per_s(nodes: Iterable[NodeBytes]) -> float | None:
    """The mean over nodes of the bytes each sent per second (None without nodes). Between the
    testbed's nodes what one sends another receives, so it is also the mean received."""
    rates = [n.tx_bytes_per_s for n in nodes]
    return sum(rates) / len(rates) if rates else None


def reports_steps(event: ev.Event) -> bool:
    """Whether `event` says the job reports steps (any track event, a step, a start)."""
    if isinstance(event, (ev.Step, ev.Start)):
        return True
    return isinstance(event, ev.Other) and event.name in (TRACK_LOADED, "stop-checked")


def source_of(step_regex: str, heard_track: bool) -> str:
    """Where a user's command's steps come from: "regex" with a step regex, "track" once a
    track event was heard, else "bytes"."""
    if step_regex:
        return SOURCE_REGEX
    return SOURCE_TRACK if heard_track else SOURCE_BYTES


class BytesWindow:
    """The warm-up and measured window of a bytes point, fed counter samples in time order.

    `add` takes each sample; `wait(now)` says how long until the next is wanted; `done` once
    the window has its end sample; `result()` gives the record's `link_bytes` section."""

    def __init__(self, warmup_s: float, window_s: float | None = None, active_bytes: int = ACTIVE_BYTES,
                 sample_s: float = SAMPLE_S) -> None:
        self.warmup_s, self.window_s = float(warmup_s), float(window_s or WINDOW_S)
        self.active_bytes, self.sample_s = active_bytes, sample_s
        self.first: LinkSample | None = None  # at the launch's start
        self.active_at: float | None = None  # when the links had carried active_bytes
        self.start: LinkSample | None = None
        self.end: LinkSample | None = None
        self.last: float | None = None

    @property
    def done(self) -> bool:
        return self.end is not None

    def add(self, sample: LinkSample) -> None:
        """One sample (ignored once done)."""
        if self.done:
            return
        self.last = sample.time
        if self.first is None:
            self.first = sample
            return
        if self.active_at is None:
            if sample.total() - self.first.total() >= self.active_bytes:
                self.active_at = sample.time
            else:
                return
        if self.start is None:
            if sample.time >= self.active_at + self.warmup_s:
                self.start = sample
        elif sample.time >= self.start.time + self.window_s:
            self.end = sample

    def wait(self, now: float) -> float:
        """Seconds until the next sample is wanted (0: now)."""
        if self.last is None:
            return 0.0
        due = self.last + self.sample_s
        if self.start is None and self.active_at is not None:
            due = min(due, self.active_at + self.warmup_s)
        elif self.start is not None:
            due = min(due, self.start.time + self.window_s)
        return max(0.0, due - now)

    def deadline(self, startup_s: float) -> float | None:
        """The monotonic time by which the window should be done: `startup_s` after the launch
        for the job to start moving bytes, then its warm-up and window (None before any sample)."""
        if self.first is None:
            return None
        if self.active_at is None:
            return self.first.time + startup_s
        return self.active_at + self.warmup_s + self.window_s + 2 * self.sample_s + 5.0

    def result(self, started_wall: float) -> dict:
        """The record's `link_bytes`: the window (seconds after the launch's first sample), its
        warm-up, each node's bytes and rates, and the mean bytes each node sent per second.
        `started_wall`: the first sample's time as Unix time."""
        assert self.first is not None and self.start is not None and self.end is not None
        nodes = link_rates(self.start, self.end)

        def after(t: float) -> float:
            return round(t - self.first.time, 3)

        return {"source": SOURCE_BYTES, "warmup_s": self.warmup_s, "active_after_s": after(self.active_at),
                "window_start_s": after(self.start.time), "window_s": round(self.end.time - self.start.time, 3),
                "window_start_wall": started_wall + (self.start.time - self.first.time),
                "window_end_wall": started_wall + (self.end.time - self.first.time),
                "nodes": [asdict(n) for n in nodes], "sent_bytes_per_s_mean": mean_sent_per_s(nodes)}
