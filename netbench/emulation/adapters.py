"""The edge: netlink (pyroute2), iptables and delay-engine processes.

Each adapter is a small class with a fake in tests/fakes.py. The executor in apply.py
turns planned changes into calls on these adapters, journaling each change first.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from pyroute2 import NetNS
from pyroute2.netlink.exceptions import NetlinkError

from netbench import proc
from netbench.emulation.changes import IPT_CHAIN, QDISC_HANDLE
from netbench.errors import EmulationError, NetbenchError, PrivilegeError

ENGINE_RT_PRIORITY = 10
_HANDLE_INT = int(QDISC_HANDLE.rstrip(":"), 16) << 16


def _nl_error(action: str, exc: NetlinkError) -> EmulationError:
    if exc.code == errno.EPERM:
        return PrivilegeError(f"{action}: permission denied", hint="run netbench as root")
    if exc.code in (errno.ENOENT, errno.EOPNOTSUPP):
        return EmulationError(f"{action}: the kernel does not support this qdisc",
                              hint="run 'netbench show --backend userspace' or use --backend userspace")
    return EmulationError(f"{action}: {exc.args[1] if len(exc.args) > 1 else exc}")


class QdiscAdapter(Protocol):
    def replace_tbf(self, netns: str, ifname: str, rate_bps: int, burst_bytes: int, limit_bytes: int) -> None: ...
    def replace_netem(self, netns: str, ifname: str, delay_us: int, jitter_us: int, loss: float,
                      rate_bps: int | None, limit_packets: int) -> None: ...
    def clear(self, netns: str, ifname: str) -> bool: ...
    def read(self, netns: str, ifname: str) -> dict[str, Any] | None: ...


class NetlinkQdiscs:
    """Root qdiscs on a node's interface, through pyroute2 (netlink, not `tc`)."""

    def _index(self, ns: NetNS, netns: str, ifname: str) -> int:
        found = ns.link_lookup(ifname=ifname)
        if not found:
            raise EmulationError(f"{netns}: no interface {ifname}", hint="is the testbed up? 'netbench testbed show'")
        return found[0]

    def replace_tbf(self, netns, ifname, rate_bps, burst_bytes, limit_bytes):
        with NetNS(netns) as ns:
            index = self._index(ns, netns, ifname)
            try:
                # pyroute2 takes an integer rate in bytes/s; burst and limit in bytes
                ns.tc("replace", "tbf", index, handle=QDISC_HANDLE, rate=rate_bps // 8,
                      burst=burst_bytes, limit=limit_bytes)
            except NetlinkError as exc:
                raise _nl_error(f"{netns}: tbf on {ifname}", exc) from None

    def replace_netem(self, netns, ifname, delay_us, jitter_us, loss, rate_bps, limit_packets):
        kwargs: dict[str, Any] = {"delay": delay_us, "jitter": jitter_us, "loss": loss * 100.0,
                                  "limit": limit_packets}
        if rate_bps:
            kwargs["rate"] = rate_bps // 8  # bytes/s
        with NetNS(netns) as ns:
            index = self._index(ns, netns, ifname)
            try:
                ns.tc("replace", "netem", index, handle=QDISC_HANDLE, **kwargs)
            except NetlinkError as exc:
                raise _nl_error(f"{netns}: netem on {ifname}", exc) from None

    def clear(self, netns, ifname):
        """Delete the root qdisc if netbench owns it; a missing one is not an error."""
        try:
            with NetNS(netns) as ns:
                found = ns.link_lookup(ifname=ifname)
                if not found:
                    return False
                for qdisc in ns.get_qdiscs(index=found[0]):
                    if qdisc["parent"] == 0xFFFFFFFF and qdisc["handle"] == _HANDLE_INT:
                        ns.tc("del", index=found[0], handle=QDISC_HANDLE, root=True)
                        return True
        except FileNotFoundError:
            return False
        except NetlinkError as exc:
            if exc.code in (errno.ENOENT, errno.EINVAL):
                return False
            raise _nl_error(f"{netns}: removing qdisc on {ifname}", exc) from None
        return False

    def read(self, netns, ifname):
        """Decode the netbench-owned root qdisc into profile terms, or None."""
        with NetNS(netns) as ns:
            found = ns.link_lookup(ifname=ifname)
            if not found:
                return None
            for qdisc in ns.get_qdiscs(index=found[0]):
                if qdisc["parent"] != 0xFFFFFFFF or qdisc["handle"] != _HANDLE_INT:
                    continue
                return decode_qdisc(qdisc)
        return None


def decode_qdisc(qdisc: Any) -> dict[str, Any]:
    """A pyroute2 tcmsg -> {"kind", "rate_bps", "delay_us", ...} in canonical units."""
    kind = qdisc.get_attr("TCA_KIND")
    options = qdisc.get_attr("TCA_OPTIONS")
    out: dict[str, Any] = {"kind": kind}
    stats = qdisc.get_attr("TCA_STATS2")
    basic = stats.get_attr("TCA_STATS_BASIC") if stats else None
    queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
    if basic:
        out["bytes"], out["packets"] = basic["bytes"], basic["packets"]
    if queue:
        out["drops"], out["backlog"], out["overlimits"] = queue["drops"], queue["backlog"], queue["overlimits"]
    if kind == "tbf" and options:
        parms = options.get_attr("TCA_TBF_PARMS")
        if parms:
            out["rate_bps"] = parms["rate"] * 8
            out["limit_bytes"] = parms["limit"]
    elif kind == "netem" and options:
        out["delay_us"] = options["delay"]
        out["jitter_us"] = options["jitter"]
        out["loss"] = options["loss"] / (2**32 - 1)
        out["limit_packets"] = options["limit"]
        rate = options.get_attr("TCA_NETEM_RATE")
        if rate and rate["rate"]:
            out["rate_bps"] = rate["rate"] * 8
    return out


IPT_HOOK = "FORWARD"  # bridged packets pass iptables FORWARD when bridge-nf-call-iptables is 1
BRIDGE_NF_SYSCTL = "/proc/sys/net/bridge/bridge-nf-call-iptables"


def _enable_bridge_netfilter(netns: str) -> None:
    """Make bridged IPv4 traffic in `netns` traverse iptables (a per-namespace sysctl)."""
    result = proc.run(["sh", "-c", f"test -e {BRIDGE_NF_SYSCTL} && echo 1 > {BRIDGE_NF_SYSCTL}"],
                      netns=netns, check=False)
    if result.returncode != 0:
        raise EmulationError(f"{netns}: bridged traffic cannot reach iptables ({BRIDGE_NF_SYSCTL} is missing)",
                             hint="load the bridge netfilter module: modprobe br_netfilter")


class Iptables:
    """NFQUEUE rules in the switch namespace, in a netbench-owned chain of the mangle table."""

    def __init__(self) -> None:
        self._bridged: set[str] = set()  # namespaces whose bridge netfilter is already on

    def _ipt(self, netns: str, *args: str, check: bool = True):
        return proc.run(["iptables", "-w", "5", "-t", "mangle", *args], netns=netns, check=check)

    def add_rule(self, netns: str, args: list[str]) -> None:
        if netns not in self._bridged:
            _enable_bridge_netfilter(netns)
            self._bridged.add(netns)
        self._ipt(netns, "-N", IPT_CHAIN, check=False)  # exists already: fine
        if self._ipt(netns, "-C", IPT_HOOK, "-j", IPT_CHAIN, check=False).returncode != 0:
            self._ipt(netns, "-I", IPT_HOOK, "1", "-j", IPT_CHAIN)
        self._ipt(netns, "-A", IPT_CHAIN, *args)

    def clear(self, netns: str) -> bool:
        """Flush and delete the netbench chain; False if there was none."""
        if self._ipt(netns, "-S", IPT_CHAIN, check=False).returncode != 0:
            return False
        self._ipt(netns, "-D", IPT_HOOK, "-j", IPT_CHAIN, check=False)
        self._ipt(netns, "-F", IPT_CHAIN, check=False)
        self._ipt(netns, "-X", IPT_CHAIN, check=False)
        return True

    def rules(self, netns: str) -> list[str]:
        result = self._ipt(netns, "-S", IPT_CHAIN, check=False)
        if result.returncode != 0:
            return []
        return [line for line in result.stdout.splitlines() if line.startswith("-A ")]


class Engines:
    """Delay engine processes, one per node namespace; their state lives in the state dir."""

    READY_TIMEOUT_S = 15.0

    def __init__(self, state_dir: Path, detach: bool = False) -> None:
        self.dir = state_dir / "engines"
        self.detach = detach  # True: engines outlive this command (netbench apply)

    def _paths(self, netns: str, queue_num: int) -> tuple[Path, Path, Path]:
        stem = f"{netns}-q{queue_num}"
        return self.dir / f"{stem}.json", self.dir / f"{stem}.out", self.dir / f"{stem}.log"

    def start(self, netns: str, queue_num: int, delay_us: int, jitter_us: int, loss: float,
              seed: int, journal) -> int:
        stats, out, log = self._paths(netns, queue_num)
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in (stats, out):
            path.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "netbench.emulation.engine", "--queue-num", str(queue_num),
                "--delay-us", str(delay_us), "--jitter-us", str(jitter_us), "--loss", repr(loss),
                "--seed", str(seed), "--stats-file", str(stats),
                # SCHED_FIFO: on a busy host the delay error comes from the engine waiting
                # for a CPU, not from its own speed (see bench/engine_ceiling.py)
                "--rt-priority", str(ENGINE_RT_PRIORITY)]
        with open(out, "wb") as out_fh, open(log, "ab") as log_fh:
            child = proc.spawn(argv, netns=netns, stdout=out_fh, stderr=log_fh,
                               die_with_parent=not self.detach,
                               env={"PYTHONPATH": proc.child_pythonpath()})
        journal.record("process", pid=child.pid, start=proc.start_time(child.pid), netns=netns,
                       queue=queue_num, role="engine")
        self._wait_ready(child, out, log, netns)
        return child.pid

    def _wait_ready(self, child, out: Path, log: Path, netns: str) -> None:
        deadline = time.monotonic() + self.READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in out.read_text(errors="replace").splitlines():
                try:
                    if json.loads(line).get("event") == "ready":
                        return
                except (json.JSONDecodeError, AttributeError):
                    continue
            if child.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()
                raise EmulationError(f"{netns}: delay engine exited with {child.returncode}: "
                                     f"{tail[-1] if tail else 'no output'}", hint=f"see {log}")
            time.sleep(0.05)
        proc.stop(child)
        raise EmulationError(f"{netns}: delay engine not ready after {self.READY_TIMEOUT_S:g}s", hint=f"see {log}")

    def stop(self, netns: str, queue_num: int, journal) -> bool:
        """Stop the engine serving `queue_num` in `netns` (TERM releases held packets, then KILL)."""
        stopped = False
        for entry in journal.pending():
            data = entry.data
            if (entry.kind == "process" and data.get("role") == "engine" and data.get("netns") == netns
                    and data.get("queue") == queue_num):
                pid, started = data["pid"], data.get("start")
                if proc.is_same_process(pid, started):
                    proc.stop_pids([pid], grace=3.0)
                    stopped = True
                journal.done(entry)
        return stopped

    def read(self, netns: str, queue_num: int) -> dict[str, Any] | None:
        """The engine's last stats (params, counters) if its process is alive."""
        stats, out, _ = self._paths(netns, queue_num)
        try:
            data = json.loads(stats.read_text())
        except (OSError, json.JSONDecodeError):
            data = _ready_line(out)  # stats are written ~1/s; right after start, the ready line
            if data is None:
                return None
        pid = data.get("pid")
        data["alive"] = bool(pid) and proc.start_time(int(pid)) is not None
        return data


def _ready_line(path: Path) -> dict[str, Any] | None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("event") == "ready":
            return event
    return None


def probe_netem(scratch_netns: str = "netbench-probe") -> tuple[bool, str]:
    """Try a netem qdisc on a dummy link in a scratch namespace; (available, reason)."""
    from pyroute2 import netns as pnetns

    try:
        pnetns.create(scratch_netns)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            pass
        elif exc.errno == errno.EPERM:
            raise PrivilegeError("probing the kernel needs root", hint="run netbench as root") from None
        else:
            raise NetbenchError(f"cannot create a probe namespace: {exc}") from None
    try:
        with NetNS(scratch_netns) as ns:
            ns.link("add", ifname="nbprobe0", kind="veth", peer="nbprobe1")
            index = ns.link_lookup(ifname="nbprobe0")[0]
            try:
                ns.tc("add", "netem", index, handle="1:", delay=1000)
            except NetlinkError as exc:
                return False, f"the kernel refused a netem qdisc ({os.strerror(exc.code)}): no sch_netem"
            return True, "the kernel accepted a netem qdisc"
    finally:
        try:
            pnetns.remove(scratch_netns)
        except OSError:
            pass
