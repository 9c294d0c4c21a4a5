"""Carry out planned changes through the adapters, journaling each before it is made."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

from netbench.state import journal as jr
from netbench.emulation import changes as ch
from netbench.emulation import readback
from netbench.emulation.backends import BackendChoice, backend_held, choose_backend  # noqa: F401 - re-exported
from netbench.emulation.engines import Engines
from netbench.emulation.held import Held, held_from_entries
from netbench.emulation.iptables import Iptables
from netbench.emulation.netlink.qdisc import NetlinkQdiscs, QdiscAdapter
from netbench.emulation.netlink.batch import TbfLink
from netbench.errors import EmulationError
from netbench.model.topology import Topology

_QDISC_HANDLE_INT = ch.HANDLE_MAJOR << 16


@dataclass
class Executor:
    """Runs a change list; `qdiscs`, `iptables` and `engines` are real adapters or fakes."""

    journal: jr.Journal
    qdiscs: QdiscAdapter
    iptables: Any
    engines: Any
    on_change: Callable[[ch.Change], None] | None = None
    done: list[ch.Change] = field(default_factory=list)  # of the last apply(): a sweep's executor lives long

    def apply(self, plan: list[ch.Change]) -> None:
        """Make `plan`'s changes in order, one netlink socket per namespace for all of them."""
        session = getattr(self.qdiscs, "session", None)
        with session() if session is not None else nullcontext():
            self._refuse_foreign_qdiscs(plan)
            self.done = []
            i = 0
            while i < len(plan):
                batch = self._reconfigure_batch(plan, i)
                roots = [] if batch else self._roots_batch(plan, i)
                for change in batch or roots or plan[i:i + 1]:
                    if self.on_change:
                        self.on_change(change)
                if batch:
                    self._reconfigure(batch)
                elif roots:
                    self._set_roots(roots)
                else:
                    self._dispatch(plan[i])
                self.done.extend(batch or roots or plan[i:i + 1])
                i += len(batch or roots) or 1

    def _reconfigure_batch(self, plan: list[ch.Change], start: int) -> list[ch.ReconfigureEngine]:
        """The run of engine reconfigurations from `start` (sent together: the engines answer in
        about the time of one), when the engines adapter can batch them; else []."""
        if not hasattr(self.engines, "reconfigure_many"):
            return []
        return _run_of(plan, start, lambda c: isinstance(c, ch.ReconfigureEngine))

    def _roots_batch(self, plan: list[ch.Change], start: int) -> list[ch.Change]:
        """The run of root changes from `start`, one per device: tbfs (the userspace backend) or
        netem roots without htb (the netem backend), sent together and then their acks read,
        when the qdisc adapter can batch them; else []."""
        if isinstance(plan[start], ch.SetTbf) and hasattr(self.qdiscs, "replace_tbf_many"):
            return _run_of(plan, start, lambda c: isinstance(c, ch.SetTbf))
        if isinstance(plan[start], ch.ShapeDevice) and hasattr(self.qdiscs, "shape_many"):
            return _run_of(plan, start, lambda c: isinstance(c, ch.ShapeDevice) and not c.uses_htb)
        return []

    def _set_roots(self, batch: list[ch.Change]) -> None:
        pending = self.journal.pending()  # read once for the whole batch
        if isinstance(batch[0], ch.SetTbf):
            for c in batch:
                self._record_root(c.netns, c.ifname, "tbf", pending=pending)
            self.qdiscs.replace_tbf_many([TbfLink(c.netns, c.ifname, c.rate_bps, c.burst_bytes, c.limit_bytes)
                                          for c in batch])
            return
        for c in batch:  # the kernel does not report netem's distribution table: the journal remembers it
            self._record_root(c.netns, c.dev, "netem", pending=pending, distribution=c.netem.distribution)
        self.qdiscs.shape_many(batch)

    def _reconfigure(self, batch: list[ch.ReconfigureEngine]) -> None:
        j = self.journal
        # a table (pairs) travels only when there is one: adapters from before tables take six
        if hasattr(self.engines, "reconfigure_many"):
            taken = self.engines.reconfigure_many([(c.netns, c.queue_num, c.delay_us, c.jitter_us, c.loss, c.seed,
                                                    *((c.pairs,) if c.pairs else ())) for c in batch], j)
        else:
            taken = [self.engines.reconfigure(c.netns, c.queue_num, c.delay_us, c.jitter_us, c.loss, c.seed, j,
                                              **_pairs(c)) for c in batch]
        for change, ok in zip(batch, taken):
            if not ok:  # not live (it died): its entry goes, a new one starts
                self.engines.stop(change.netns, change.queue_num, j)
                self.engines.start(change.netns, change.queue_num, change.delay_us, change.jitter_us,
                                   change.loss, change.seed, j, **_pairs(change))

    def close(self) -> None:
        """Close the netlink sockets a long-lived executor held (real_executor(hold=True))."""
        release = getattr(self.qdiscs, "release", None)
        if release is not None:
            release()

    def lost(self) -> list[str]:
        """What of the emulation applied has died since (a delay engine), one line each."""
        lost = getattr(self.engines, "lost", None)
        return lost(self.journal) if lost is not None else []

    def held(self) -> Held:
        """What netbench holds now, from the journal (plan a change in place against it)."""
        return held_from_entries(self.journal.pending())

    def _record_root(self, netns: str, dev: str, kind: str, pending: list | None = None, **extra: Any) -> None:
        """One pending `qdisc` entry per device, however many live changes a sweep or a schedule
        makes: a new one is written only when what it says changes (the old ones are then done).
        `pending`: the journal's pending entries, when the caller just read them."""
        j = self.journal
        data = {"netns": netns, "ifname": dev, "handle": ch.QDISC_HANDLE, "qdisc_kind": kind, **extra}
        entries = j.pending() if pending is None else pending
        older = [e for e in entries if e.kind == "qdisc" and e.data.get("netns") == netns and e.data.get("ifname") == dev]
        if any(e.data == data for e in older):
            return
        j.record("qdisc", **data)
        for entry in older:
            j.done(entry)

    def _refuse_foreign_qdiscs(self, plan: list[ch.Change]) -> None:
        """Before any change: refuse a plan that would replace a root or ingress qdisc netbench
        did not set (one its journal does not hold). The kernel's default root (handle 0:
        noqueue, pfifo_fast, mq, or whatever net.core.default_qdisc names) is not anyone's."""
        pending = self.journal.pending()
        own_roots = {(e.data.get("netns"), e.data.get("ifname")) for e in pending if e.kind == "qdisc"}
        own_ingress = {(e.data.get("netns"), e.data.get("dev")) for e in pending if e.kind == "ingress"}
        for change in plan:
            if isinstance(change, (ch.SetTbf, ch.ShapeDevice, ch.ShapePairs)):
                dev = change.ifname if isinstance(change, ch.SetTbf) else change.dev
                found = self.qdiscs.root_qdisc(change.netns, dev)
                if found is None or found[1] == 0:
                    continue
                if found[1] == _QDISC_HANDLE_INT and (change.netns, dev) in own_roots:
                    continue
                kind, handle = found
                raise EmulationError(
                    f"{change.node}: {dev} has a root qdisc {kind} {handle >> 16:x}: that netbench did not set; "
                    "refusing to replace it (nothing was changed)",
                    hint=f"remove it first (tc qdisc del dev {dev} root) or shape another interface")
            elif isinstance(change, ch.SetIngress):
                kind = self.qdiscs.ingress_qdisc(change.netns, change.dev)
                if kind is not None and (change.netns, change.dev) not in own_ingress:
                    raise EmulationError(
                        f"{change.node}: {change.dev} has a qdisc {kind} at its ingress that netbench did not set; "
                        "refusing to replace its filters (nothing was changed)",
                        hint=f"remove it first (tc qdisc del dev {change.dev} {kind}) or shape egress only")

    def _dispatch(self, change: ch.Change) -> None:
        j = self.journal
        if isinstance(change, ch.StopEngine):
            self.engines.stop(change.netns, change.queue_num, j)
        elif isinstance(change, ch.ClearRules):
            self.iptables.clear(change.netns)
            jr.resolve(j, "iptables", netns=change.netns)
        elif isinstance(change, ch.ClearQdisc):
            self.qdiscs.clear(change.netns, change.ifname)
            jr.resolve(j, "qdisc", netns=change.netns, ifname=change.ifname)
        elif isinstance(change, ch.SetTbf):
            self._record_root(change.netns, change.ifname, "tbf")
            self.qdiscs.replace_tbf(change.netns, change.ifname, change.rate_bps,
                                    change.burst_bytes, change.limit_bytes)
        elif isinstance(change, ch.ShapeDevice):
            # the kernel does not report netem's distribution table: the journal remembers it
            self._record_root(change.netns, change.dev, "htb" if change.uses_htb else "netem",
                              distribution=change.netem.distribution)
            self.qdiscs.shape(change)
        elif isinstance(change, ch.ShapePairs):  # one distribution recorded per device: the first pair's
            self._record_root(change.netns, change.dev, "htb", distribution=change.classes[0].netem.distribution)
            self.qdiscs.shape_pairs(change)
        elif isinstance(change, ch.SetIngress):
            j.record("ingress", netns=change.netns, dev=change.dev, ifb=change.ifb)
            self.qdiscs.set_ingress(change.netns, change.dev, change.ifb)
        elif isinstance(change, ch.ClearIngress):
            self.qdiscs.clear_ingress(change.netns, change.dev, change.ifb)
            jr.resolve(j, "ingress", netns=change.netns, dev=change.dev)
            jr.resolve(j, "qdisc", netns=change.netns, ifname=change.ifb)  # gone with the ifb
        elif isinstance(change, ch.ReconfigureEngine):  # before StartEngine: it is one
            self._reconfigure([change])
        elif isinstance(change, ch.StartEngine):
            self.engines.start(change.netns, change.queue_num, change.delay_us, change.jitter_us,
                               change.loss, change.seed, j, **_pairs(change))
        elif isinstance(change, ch.DeleteNfqueueRule):  # before AddNfqueueRule: it is one
            self.iptables.delete_rule(change.netns, change.iptables_args())
            jr.resolve(j, "iptables", netns=change.netns, port=change.port)
        elif isinstance(change, ch.AddNfqueueRule):
            j.record("iptables", netns=change.netns, chain=ch.IPT_CHAIN, port=change.port, queue=change.queue_num)
            self.iptables.add_rule(change.netns, change.iptables_args())
        else:  # pragma: no cover - a new change type without a handler is a bug
            raise TypeError(f"no handler for {type(change).__name__}")


def _run_of(plan: list[ch.Change], start: int, accept: Callable[[ch.Change], bool]) -> list[ch.Change]:
    """The changes `accept`ed from `start` on, when at least two in a row are; else []."""
    end = start
    while end < len(plan) and accept(plan[end]):
        end += 1
    return list(plan[start:end]) if end - start > 1 else []


def _pairs(change: ch.StartEngine) -> dict[str, Any]:
    """The engine's per-destination table as a keyword, only when it has one."""
    return {"pairs": change.pairs} if change.pairs else {}


def real_executor(journal: jr.Journal, detach_engines: bool = False, on_change=None,
                  hold: bool = False) -> Executor:
    """The kernel's adapters. `hold`: keep one netlink socket per namespace open across applies
    (a sweep, a schedule) until close()."""
    qdiscs = NetlinkQdiscs()
    if hold:
        qdiscs.hold()
    return Executor(journal=journal, qdiscs=qdiscs, iptables=Iptables(),
                    engines=Engines(journal.dir, detach=detach_engines), on_change=on_change)


def recorded_distributions(journal: jr.Journal) -> dict[tuple[str, str], str]:
    """(netns, device) -> the netem distribution netbench sent (the kernel does not report it)."""
    return {(e.data["netns"], e.data["ifname"]): e.data["distribution"] for e in journal.pending()
            if e.kind == "qdisc" and "distribution" in e.data}


def read_emulation(topology: Topology, qdiscs: QdiscAdapter, iptables: Any, engines: Any,
                   distributions: dict[tuple[str, str], str] | None = None) -> list[dict[str, Any]]:
    """What each node's links hold right now, read from the kernel and the engines, with the
    profile it amounts to (`profile`: the YAML keys, or None when nothing is shaped)."""
    distributions = distributions or {}
    switch_rules = iptables.rules(topology.switch_netns)
    rows = []
    for position, node in enumerate(topology.nodes):
        ifb = ch.ifb_name(node.ifname)
        egress = qdiscs.read(node.netns, node.ifname, distributions.get((node.netns, node.ifname), "uniform"))
        ingress = qdiscs.read(node.netns, ifb, distributions.get((node.netns, ifb), "uniform"))
        rules = [rule for rule in switch_rules if f"--physdev-in {node.port} " in rule + " "]
        engine = engines.read(topology.switch_netns, ch.queue_num(position)) if rules else None
        row: dict[str, Any] = {"node": node.name, "ifname": node.ifname, "qdisc": egress, "ingress_qdisc": ingress,
                               "nfqueue_rules": rules, "engine": engine}
        row["backend"] = backend_held(egress, ingress, rules)
        active = readback.profile_from_state(egress, ingress, engine)
        row["profile"] = active.to_yaml_dict() if active is not None else None
        rows.append(row)
    return rows
