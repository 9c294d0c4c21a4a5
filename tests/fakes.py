"""In-memory fakes of the emulation adapters (netbench/emulation/adapters.py).

Each fake keeps the state the real adapter would leave in the kernel, so `read`/`rules`
return what was set, and records every call in order in `calls`. Pass one shared list as
`log` to several fakes to see the order of calls across adapters.

`before`, if given, is called as before(adapter_name, method, kwargs) just before a call
changes state; tests use it to look at the journal at the moment a change is made.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from netbench.emulation.changes import IPT_CHAIN
from netbench.errors import EmulationError

Hook = Callable[[str, str, dict], None]


class _Recorder:
    name = "fake"

    def __init__(self, log: list | None = None, before: Hook | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.log = log
        self.before = before

    def _call(self, method: str, **kwargs: Any) -> None:
        if self.before is not None:
            self.before(self.name, method, dict(kwargs))
        self.calls.append((method, kwargs))
        if self.log is not None:
            self.log.append((self.name, method, kwargs))

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]


class FakeQdiscs(_Recorder):
    """Root qdiscs per (netns, ifname), decoded the way NetlinkQdiscs.read decodes them."""

    name = "qdiscs"

    def __init__(self, log: list | None = None, before: Hook | None = None) -> None:
        super().__init__(log, before)
        self.state: dict[tuple[str, str], dict[str, Any]] = {}

    def replace_tbf(self, netns: str, ifname: str, rate_bps: int, burst_bytes: int, limit_bytes: int) -> None:
        self._call("replace_tbf", netns=netns, ifname=ifname, rate_bps=rate_bps,
                   burst_bytes=burst_bytes, limit_bytes=limit_bytes)
        self.state[(netns, ifname)] = {"kind": "tbf", "rate_bps": rate_bps, "burst_bytes": burst_bytes,
                                       "limit_bytes": limit_bytes}

    def replace_netem(self, netns: str, ifname: str, delay_us: int, jitter_us: int, loss: float,
                      rate_bps: int | None, limit_packets: int) -> None:
        self._call("replace_netem", netns=netns, ifname=ifname, delay_us=delay_us, jitter_us=jitter_us,
                   loss=loss, rate_bps=rate_bps, limit_packets=limit_packets)
        qdisc: dict[str, Any] = {"kind": "netem", "delay_us": delay_us, "jitter_us": jitter_us,
                                 "loss": loss, "limit_packets": limit_packets}
        if rate_bps:
            qdisc["rate_bps"] = rate_bps
        self.state[(netns, ifname)] = qdisc

    def clear(self, netns: str, ifname: str) -> bool:
        self._call("clear", netns=netns, ifname=ifname)
        return self.state.pop((netns, ifname), None) is not None

    def read(self, netns: str, ifname: str) -> dict[str, Any] | None:
        qdisc = self.state.get((netns, ifname))
        return None if qdisc is None else dict(qdisc)


class FakeIptables(_Recorder):
    """The NETBENCH chain per namespace, as `iptables -S NETBENCH` lines."""

    name = "iptables"

    def __init__(self, log: list | None = None, before: Hook | None = None) -> None:
        super().__init__(log, before)
        self.chains: dict[str, list[str]] = {}

    def add_rule(self, netns: str, args: list[str]) -> None:
        self._call("add_rule", netns=netns, args=list(args))
        self.chains.setdefault(netns, []).append(" ".join(["-A", IPT_CHAIN, *args]))

    def clear(self, netns: str) -> bool:
        self._call("clear", netns=netns)
        return self.chains.pop(netns, None) is not None

    def rules(self, netns: str) -> list[str]:
        return list(self.chains.get(netns, []))


class FakeEngines(_Recorder):
    """Delay engines per namespace; journals a `process` entry on start like Engines does.

    Starting a second engine in a namespace whose engine still runs raises, as the real
    second engine would fail to bind the NFQUEUE already bound by the first.
    """

    name = "engines"

    def __init__(self, log: list | None = None, before: Hook | None = None) -> None:
        super().__init__(log, before)
        self.running: dict[tuple[str, int], dict[str, Any]] = {}
        self._pids = itertools.count(40000)

    def start(self, netns: str, queue_num: int, delay_us: int, jitter_us: int, loss: float,
              seed: int, journal) -> int:
        self._call("start", netns=netns, queue_num=queue_num, delay_us=delay_us, jitter_us=jitter_us,
                   loss=loss, seed=seed)
        key = (netns, queue_num)
        if key in self.running:
            raise EmulationError(f"{netns}: NFQUEUE {queue_num} is already bound by engine "
                                 f"{self.running[key]['pid']}")
        pid = next(self._pids)
        journal.record("process", pid=pid, start=None, netns=netns, queue=queue_num, role="engine")
        self.running[key] = {"pid": pid, "params": {"queue_num": queue_num, "delay_us": delay_us,
                                                    "jitter_us": jitter_us, "loss": loss, "seed": seed}}
        return pid

    def stop(self, netns: str, queue_num: int, journal) -> bool:
        self._call("stop", netns=netns, queue_num=queue_num)
        stopped = self.running.pop((netns, queue_num), None) is not None
        for entry in journal.pending():
            data = entry.data
            if (entry.kind == "process" and data.get("role") == "engine" and data.get("netns") == netns
                    and data.get("queue") == queue_num):
                journal.done(entry)
        return stopped

    def read(self, netns: str, queue_num: int) -> dict[str, Any] | None:
        engine = self.running.get((netns, queue_num))
        if engine is None:
            return None
        return {"pid": engine["pid"], "alive": True, "params": dict(engine["params"]),
                "received": 0, "dropped": 0}


def make_fakes(before: Hook | None = None) -> tuple[FakeQdiscs, FakeIptables, FakeEngines, list]:
    """Three fakes sharing one call log."""
    log: list = []
    return FakeQdiscs(log, before), FakeIptables(log, before), FakeEngines(log, before), log
