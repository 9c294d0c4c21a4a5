"""In-memory fakes of the emulation adapters (netlink/qdisc.py, iptables.py, engines.py).

Each fake keeps the state the real adapter would leave in the kernel, so `read`/`rules`
return what was set, and records every call in order in `calls`. Pass one shared list as
`log` to several fakes to see the order of calls across adapters.

`before`, if given, is called as before(adapter_name, method, kwargs) just before a call
changes state; tests use it to look at the journal at the moment a change is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import os
import struct
from typing import Any, Callable, Iterator

from pyroute2.netlink.rtnl.tcmsg import tcmsg

from netbench.emulation.netlink import netem, rtnl
from netbench.emulation.changes import IPT_CHAIN, ShapeDevice, ShapePairs
from netbench.emulation.netlink.netem import NetemParams
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
    """Root qdiscs per (netns, ifname), decoded the way NetlinkQdiscs.read decodes them.

    `foreign` holds root qdiscs someone else set, as (kind, handle) per (netns, ifname),
    and `foreign_ingress` the kind of an ingress-hook qdisc someone else set, per (netns, dev);
    netbench's own appear at handle 4e42: (root) and as "ingress".
    """

    name = "qdiscs"

    def __init__(self, log: list | None = None, before: Hook | None = None) -> None:
        super().__init__(log, before)
        self.state: dict[tuple[str, str], dict[str, Any]] = {}
        self.ingress: dict[tuple[str, str], str] = {}
        self.foreign: dict[tuple[str, str], tuple[str, int]] = {}
        self.foreign_ingress: dict[tuple[str, str], str] = {}
        self.sessions = 0
        self.batches: list[int] = []

    def root_qdisc(self, netns: str, ifname: str) -> tuple[str, int] | None:
        if (netns, ifname) in self.state:
            return self.state[(netns, ifname)]["kind"], 0x4E420000
        return self.foreign.get((netns, ifname))

    def ingress_qdisc(self, netns: str, dev: str) -> str | None:
        return "ingress" if (netns, dev) in self.ingress else self.foreign_ingress.get((netns, dev))

    def replace_tbf(self, netns: str, ifname: str, rate_bps: int, burst_bytes: int, limit_bytes: int) -> None:
        self._call("replace_tbf", netns=netns, ifname=ifname, rate_bps=rate_bps,
                   burst_bytes=burst_bytes, limit_bytes=limit_bytes)
        self.foreign.pop((netns, ifname), None)  # replaced, as the kernel's `replace` would
        self.state[(netns, ifname)] = {"kind": "tbf", "rate_bps": rate_bps, "burst_bytes": burst_bytes,
                                       "limit_bytes": limit_bytes}

    def replace_tbf_many(self, links: list) -> None:
        """As NetlinkQdiscs.replace_tbf_many: every link's tbf (tbf_batch.TbfLink); `batches`
        records the size of each batch."""
        self.batches.append(len(links))
        for link in links:
            self.replace_tbf(link.netns, link.ifname, link.rate_bps, link.burst_bytes, link.limit_bytes)

    def shape_many(self, changes: list) -> None:
        """As NetlinkQdiscs.shape_many: shape() of each; `batches` records the batch's size."""
        self.batches.append(len(changes))
        for change in changes:
            self.shape(change)

    def shape(self, change: ShapeDevice) -> None:
        """Keeps what the kernel would: the netem options go through netlink encoding and
        decoding (netem.options -> bytes -> pyroute2's tcmsg -> netem.decode)."""
        self._call("shape", netns=change.netns, ifname=change.dev, change=change)
        self.foreign.pop((change.netns, change.dev), None)
        previous = self.state.get((change.netns, change.dev))
        kind = "htb" if change.uses_htb else "netem"
        live = previous is not None and previous["kind"] == kind
        self.state[(change.netns, change.dev)] = {
            "kind": kind, "netem": _through_netlink(change.netem), "live_change": live,
            "rate_bps": change.htb_rate_bps if change.uses_htb else change.netem.rate_bps,
            "peers": change.peers, "match": change.match}

    def shape_pairs(self, change: ShapePairs) -> None:
        """As NetlinkQdiscs.shape_pairs, read back as decode_tree reads a per-destination tree."""
        self._call("shape_pairs", netns=change.netns, ifname=change.dev, change=change)
        self.foreign.pop((change.netns, change.dev), None)
        previous = self.state.get((change.netns, change.dev))
        self.state[(change.netns, change.dev)] = {
            "kind": "htb", "netem": None, "rate_bps": None, "peers": (), "match": "dst",
            "live_change": previous is not None and previous["kind"] == "htb",
            "pairs": [{"peer": c.peer, "netem": _through_netlink(c.netem), "rate_bps": c.rate_bps,
                       "classid": f"4e42:{i + 1:x}"} for i, c in enumerate(change.classes)]}

    def set_ingress(self, netns: str, dev: str, ifb: str) -> None:
        self._call("set_ingress", netns=netns, dev=dev, ifb=ifb)
        self.foreign_ingress.pop((netns, dev), None)  # its filters replaced by netbench's redirect
        self.ingress[(netns, dev)] = ifb

    def clear_ingress(self, netns: str, dev: str, ifb: str) -> bool:
        self._call("clear_ingress", netns=netns, dev=dev, ifb=ifb)
        self.state.pop((netns, ifb), None)
        return self.ingress.pop((netns, dev), None) is not None

    def clear(self, netns: str, ifname: str) -> bool:
        self._call("clear", netns=netns, ifname=ifname)
        return self.state.pop((netns, ifname), None) is not None

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """As NetlinkQdiscs.session: the calls inside share sockets (nothing to fake)."""
        self.sessions += 1
        yield

    def read(self, netns: str, ifname: str, distribution: str = "uniform") -> dict[str, Any] | None:
        qdisc = self.state.get((netns, ifname))
        if qdisc is None:
            return None
        qdisc = dict(qdisc)
        if qdisc.get("netem") is not None:  # the kernel does not report the table: the caller says
            qdisc["netem"] = dataclasses.replace(qdisc["netem"], distribution=distribution)
        if qdisc.get("pairs"):
            qdisc["pairs"] = [{**p, "netem": dataclasses.replace(p["netem"], distribution=distribution)}
                              for p in qdisc["pairs"]]
        return qdisc


def as_dumped(msg: Any) -> Any:
    """A tc message as the kernel receives it, parsed back as a netlink dump returns it."""
    msg["header"]["sequence_number"] = 1
    msg.encode()
    back = tcmsg(bytes(msg.data))
    back.decode()
    return back


def _through_netlink(params: NetemParams) -> NetemParams:
    msg = netem.netem_tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, 1, 0x4E420000, 0xFFFFFFFF
    msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", netem.options(params)]]
    parsed = as_dumped(msg)
    return netem.decode(netem.reparse(parsed.get_attr("TCA_OPTIONS")), "unknown")


class FakeIptables(_Recorder):
    """The NETBENCH chain per namespace, as `iptables -S NETBENCH` lines."""

    name = "iptables"

    def __init__(self, log: list | None = None, before: Hook | None = None) -> None:
        super().__init__(log, before)
        self.chains: dict[str, list[str]] = {}

    def add_rule(self, netns: str, args: list[str]) -> None:
        self._call("add_rule", netns=netns, args=list(args))
        self.chains.setdefault(netns, []).append(" ".join(["-A", IPT_CHAIN, *args]))

    def delete_rule(self, netns: str, args: list[str]) -> bool:
        self._call("delete_rule", netns=netns, args=list(args))
        line = " ".join(["-A", IPT_CHAIN, *args])
        if line not in self.chains.get(netns, []):
            return False
        self.chains[netns].remove(line)
        return True

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
              seed: int, journal, pairs: tuple = ()) -> int:
        self._call("start", netns=netns, queue_num=queue_num, delay_us=delay_us, jitter_us=jitter_us,
                   loss=loss, seed=seed, **({"pairs": pairs} if pairs else {}))
        key = (netns, queue_num)
        if key in self.running:
            raise EmulationError(f"{netns}: NFQUEUE {queue_num} is already bound by engine "
                                 f"{self.running[key]['pid']}")
        pid = next(self._pids)
        journal.record("process", pid=pid, start=None, netns=netns, queue=queue_num, role="engine")
        self.running[key] = {"pid": pid, "params": {"queue_num": queue_num, "delay_us": delay_us,
                                                    "jitter_us": jitter_us, "loss": loss, "seed": seed}}
        if pairs:
            self.running[key]["pairs"] = [pair.as_dict() for pair in pairs]
        return pid

    def reconfigure(self, netns: str, queue_num: int, delay_us: int, jitter_us: int, loss: float,
                    seed: int, journal, pairs: tuple = ()) -> bool:
        """New parameters for the running engine, same pid; False when none runs (as Engines)."""
        self._call("reconfigure", netns=netns, queue_num=queue_num, delay_us=delay_us, jitter_us=jitter_us,
                   loss=loss, seed=seed, **({"pairs": pairs} if pairs else {}))
        engine = self.running.get((netns, queue_num))
        if engine is None:
            return False
        engine["params"].update(delay_us=delay_us, jitter_us=jitter_us, loss=loss, seed=seed)
        engine.pop("pairs", None)
        if pairs:
            engine["pairs"] = [pair.as_dict() for pair in pairs]
        return True

    def reconfigure_many(self, changes: list[tuple], journal) -> list[bool]:
        """As Engines.reconfigure_many: every engine asked before any answer is used."""
        return [self.reconfigure(*change[:6], journal, *change[6:]) for change in changes]

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
                "received": 0, "dropped": 0, **({"pairs": engine["pairs"]} if "pairs" in engine else {})}


def make_fakes(before: Hook | None = None) -> tuple[FakeQdiscs, FakeIptables, FakeEngines, list]:
    """Three fakes sharing one call log."""
    log: list = []
    return FakeQdiscs(log, before), FakeIptables(log, before), FakeEngines(log, before), log


# --- a namespace's raw netlink socket, for batched requests (netlink/batch.py) -------------------

def ack(seq: int, code: int = 0) -> bytes:
    """An NLMSG_ERROR answering request `seq` (code 0: applied), capped: the request's header only."""
    body = struct.pack("=i", code) + rtnl._HDR.pack(16, 36, 0, seq, 0)
    return rtnl._HDR.pack(16 + len(body), rtnl.NLMSG_ERROR, rtnl.NLM_F_CAPPED, seq, 0) + body


class FakeKernelSocket:
    """A namespace's netlink socket: answers each request with an ack, or with `refuse`'s code
    for the interfaces listed there. A real socketpair end stands in for select().

    `room`: how many answers fit in its receive buffer; the kernel drops the answers past it
    and the next read fails with ENOBUFS, once (as a netlink socket that overran)."""

    def __init__(self, refuse: dict[int, int] | None = None, room: int | None = None) -> None:
        import socket

        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.refuse = refuse or {}
        self.sent: list[bytes] = []
        self.room, self.overran = room, False

    def fileno(self) -> int:
        return self.ours.fileno()

    def sendto(self, data: bytes, address) -> None:
        self.sent.append(data)
        seq, index = struct.unpack_from("=I", data, 8)[0], struct.unpack_from("=i", data, 20)[0]
        if self.room is not None and len(self.sent) > self.room:
            self.overran = True  # applied, but its answer is dropped
            return
        self.kernel.send(ack(seq, -self.refuse.get(index, 0)))

    def recv(self, size: int) -> bytes:
        if self.overran:
            self.overran = False
            raise OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))
        return self.ours.recv(size)

    def close(self) -> None:
        self.ours.close()
        self.kernel.close()
