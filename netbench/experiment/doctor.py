"""`netbench doctor`: what this host can do, found by trying, and which backend follows.

Module lists and kernel configs lie (built-ins, containers, seccomp), so every kernel
feature is probed by doing what netbench would do, in a scratch namespace that is always
removed. The probing sits behind `Prober`; turning outcomes into checks, choosing the
backend and rendering are pure, so they are tested with a fake prober.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol


from netbench import proc
from netbench.emulation.backends import BACKENDS
from netbench.emulation.iptables import BRIDGE_NF_SYSCTL
from netbench.errors import NetbenchError
from netbench.model import topology as topo

Status = Literal["ok", "missing", "skipped"]
SCRATCH_PREFIX = topo.SCRATCH_PREFIX + "doctor-"  # `netbench reset` removes one whose maker is gone
CAP_NET_ADMIN = 12
USERSPACE_NEEDS = BACKENDS["userspace"].needs  # the doctor checks the userspace backend needs
TF_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Outcome:
    """What one probe found: whether the thing worked, and what happened in words."""

    ok: bool
    detail: str


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str
    needed_by: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]
    backend: str  # "netem", "userspace" or "none"
    backend_reason: str

    @property
    def ready(self) -> bool:
        """True when netbench can shape links here with some backend."""
        return self.backend != "none"


class Prober(Protocol):
    """One method per thing to try; each returns an Outcome instead of raising for a no."""

    def privileges(self) -> Outcome: ...
    def namespaces(self) -> Outcome: ...
    def veth(self) -> Outcome: ...
    def qdisc(self, kind: str) -> Outcome: ...
    def ifb(self) -> Outcome: ...
    def mirred(self) -> Outcome: ...
    def bridge_netfilter(self) -> Outcome: ...
    def iptables(self) -> Outcome: ...
    def nfqueue(self) -> Outcome: ...
    def physdev(self) -> Outcome: ...
    def tool(self, name: str) -> Outcome: ...
    def tensorflow(self) -> Outcome: ...
    def torch(self) -> Outcome: ...
    def gloo(self) -> Outcome: ...


@dataclass(frozen=True)
class Spec:
    """A check: how to probe it, what must work first, who needs it, how to get it."""

    name: str
    probe: Callable[[Prober], Outcome]
    requires: tuple[str, ...]
    needed_by: tuple[str, ...]
    fix: str


_NETEM_FIX = ("Debian: apt install linux-image-amd64 and boot it (Debian's stock kernel ships sch_netem); "
              "Ubuntu: apt install linux-modules-extra-$(uname -r); then modprobe sch_netem "
              "(custom kernels: CONFIG_NET_SCH_NETEM). Until then netbench uses the userspace backend")
_TORCH_FIX = ("optional: make install adds it where torch's CPU build is on disk; else "
              ".venv/bin/pip install torch==2.13.0+cpu (PyTorch's CPU build: a wheel on disk, or PyTorch's CPU "
              "package index; never an unpinned torch: a CUDA build of several GB)")
_ROOT = ("privileges",)
_NS = ("namespaces",)
_VETH = ("veth",)
_USERSPACE = ("userspace backend",)

SPECS: tuple[Spec, ...] = (
    Spec("privileges", lambda p: p.privileges(), (), ("testbed", "apply", "sweep"),
         "run as root (sudo .venv/bin/netbench doctor) or with CAP_NET_ADMIN"),
    Spec("namespaces", lambda p: p.namespaces(), _ROOT, ("testbed",),
         "a kernel with network namespaces (CONFIG_NET_NS) and a writable /run/netns; "
         "in a container, run it privileged"),
    Spec("veth", lambda p: p.veth(), _NS, ("testbed",), "modprobe veth"),
    Spec("netem", lambda p: p.qdisc("netem"), _VETH, ("netem backend",), _NETEM_FIX),
    Spec("tbf", lambda p: p.qdisc("tbf"), _VETH, _USERSPACE, "modprobe sch_tbf"),
    Spec("htb", lambda p: p.qdisc("htb"), _VETH, ("netem: rates over 34gbit, peers",), "modprobe sch_htb"),
    Spec("ifb", lambda p: p.ifb(), _NS, ("netem: ingress shaping",), "modprobe ifb"),
    Spec("ingress+mirred", lambda p: p.mirred(), _VETH, ("netem: ingress shaping",), "modprobe sch_ingress cls_u32 act_mirred"),
    Spec("bridge netfilter", lambda p: p.bridge_netfilter(), _NS, _USERSPACE, "modprobe br_netfilter"),
    Spec("iptables", lambda p: p.iptables(), (), _USERSPACE, "apt install iptables"),
    Spec("NFQUEUE", lambda p: p.nfqueue(), ("namespaces", "iptables"), _USERSPACE,
         "modprobe nfnetlink_queue xt_NFQUEUE nft_queue"),
    Spec("physdev", lambda p: p.physdev(), ("namespaces", "iptables"), _USERSPACE, "modprobe xt_physdev"),
    Spec("iperf3", lambda p: p.tool("iperf3"), (), ("make bench",), "apt install iperf3"),
    Spec("ping", lambda p: p.tool("ping"), (), ("make bench",), "apt install iputils-ping"),
    Spec("tensorflow", lambda p: p.tensorflow(), (), ("sweep",),
         "make install (or .venv/bin/pip install -e '.[tf]')"),
    Spec("torch", lambda p: p.torch(), (), ("sweep --framework torch",), _TORCH_FIX),
    Spec("gloo", lambda p: p.gloo(), ("torch",), ("sweep --framework torch",),
         "a torch build with distributed support (torch==2.13.0 from PyPI or the CPU wheel has gloo)"),
)


def _blocked_detail(blocker: Check) -> str:
    """Name the root cause: a check skipped for want of root says so, not 'needs veth'."""
    if blocker.status == "skipped":
        return blocker.detail
    if blocker.name == "privileges":
        return "not checked: needs root or CAP_NET_ADMIN"
    return f"not checked: needs {blocker.name}, which is {blocker.status}"


def build_checks(prober: Prober, tensorflow: bool = True) -> tuple[Check, ...]:
    """Run each spec's probe once what it requires works; otherwise skip it and say why."""
    done: dict[str, Check] = {}
    for spec in SPECS:
        blockers = [done[name] for name in spec.requires if done[name].status != "ok"]
        if blockers:
            done[spec.name] = Check(spec.name, "skipped", _blocked_detail(blockers[0]), "", spec.needed_by)
        elif spec.name == "tensorflow" and not tensorflow:
            done[spec.name] = Check(spec.name, "skipped", "not checked (skipped on request)", "", spec.needed_by)
        else:
            outcome = spec.probe(prober)
            status: Status = "ok" if outcome.ok else "missing"
            done[spec.name] = Check(spec.name, status, outcome.detail, "" if outcome.ok else spec.fix,
                                    spec.needed_by)
    return tuple(done.values())


def decide_backend(checks: tuple[Check, ...] | list[Check]) -> tuple[str, str]:
    """The backend netbench would pick, as choose_backend does: netem first, else userspace.

    Unlike choose_backend, which only probes netem, this also says "none" when the
    userspace backend's pieces are missing, so the failure shows here and not mid-sweep.
    """
    by_name = {check.name: check for check in checks}
    netem = by_name.get(BACKENDS["netem"].needs[0])
    if netem is not None and netem.status == "ok":
        return "netem", netem.detail
    if netem is None:
        why_not = "netem not checked"
    elif netem.status == "skipped":
        why_not = f"netem {netem.detail}"
    else:
        why_not = f"netem is missing: {netem.detail}"
    states = {name: by_name[name].status if name in by_name else "skipped" for name in USERSPACE_NEEDS}
    missing = [name for name, state in states.items() if state == "missing"]
    unchecked = [name for name, state in states.items() if state == "skipped"]
    if not missing and not unchecked:
        return "userspace", f"{why_not}; using tbf for rate and NFQUEUE + delay engines for delay, jitter and loss"
    parts = [f"the userspace backend lacks {', '.join(missing)}"] if missing else []
    parts += [f"{', '.join(unchecked)} not checked"] if unchecked else []
    return "none", "; ".join([why_not, *parts])


def diagnose(prober: Prober, tensorflow: bool = True) -> Report:
    checks = build_checks(prober, tensorflow=tensorflow)
    backend, reason = decide_backend(checks)
    return Report(checks, backend, reason)


def has_net_admin(status_text: str) -> bool:
    """CAP_NET_ADMIN in the effective set, from the text of /proc/self/status."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    return False


def _nl_reason(exc: Exception) -> str:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    return os.strerror(code) if isinstance(code, int) and code > 0 else str(exc)


def scratch_name() -> str:
    """This process's scratch namespace: its pid and start time in the name tell a reset
    whether the doctor that made it still runs."""
    return topo.scratch_netns("doctor", os.getpid(), proc.start_time(os.getpid()))


class HostProber:
    """Tries each feature for real inside `nbscratch-doctor-<pid>-<start>`; call close() to remove it."""

    VETH, PEER, IFB, BRIDGE = "nbdoc0", "nbdoc1", "nbdocifb0", "nbdocbr0"
    QDISC_ARGS: dict[str, dict[str, Any]] = {"netem": {"delay": 1000}, "htb": {"default": 1},
                                             "tbf": {"rate": 125_000, "burst": 16_000, "limit": 32_000}}

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns or scratch_name()
        self._created = False
        self._ns: Any = None
        self._torch_found: tuple[str, bool] | None | bool = False  # False: not asked yet

    def privileges(self) -> Outcome:
        if os.geteuid() == 0 and os.environ.get("NETBENCH_PRIVILEGE") == "rootless":
            return Outcome(True, "without root: in a user namespace of your own (a sandbox)")
        if os.geteuid() == 0:
            return Outcome(True, "running as root")
        try:
            with open("/proc/self/status") as fh:
                status = fh.read()
        except OSError:
            status = ""
        if has_net_admin(status):
            return Outcome(True, "CAP_NET_ADMIN is in the effective set")
        return Outcome(False, f"uid {os.geteuid()} without CAP_NET_ADMIN")

    def namespaces(self) -> Outcome:
        from pyroute2 import NetNS

        netns = proc.pyroute2_netns()

        self._created = True  # from here on close() must try to remove it
        try:
            try:
                netns.create(self.netns)
            except OSError as exc:
                if exc.errno != errno.EEXIST:  # a stale one from a reused pid: start afresh
                    raise
                netns.remove(self.netns)
                netns.create(self.netns)
            self._ns = NetNS(self.netns)
        except OSError as exc:
            return Outcome(False, f"cannot create a network namespace: {_nl_reason(exc)}")
        return Outcome(True, f"created scratch namespace {self.netns}")

    def veth(self) -> Outcome:
        return self._try("a veth pair", lambda: self._ns.link("add", ifname=self.VETH, kind="veth", peer=self.PEER))

    def qdisc(self, kind: str) -> Outcome:
        def add_and_remove() -> None:
            self._ns.tc("add", kind, self._index(self.VETH), handle="1:", **self.QDISC_ARGS[kind])
            self._ns.tc("del", index=self._index(self.VETH), handle="1:", root=True)

        outcome = self._try(f"a {kind} qdisc", add_and_remove)
        return outcome if outcome.ok else Outcome(False, f"{outcome.detail}: no sch_{kind}")

    def ifb(self) -> Outcome:
        return self._try("an ifb link", lambda: self._ns.link("add", ifname=self.IFB, kind="ifb"))

    def mirred(self) -> Outcome:
        """An ingress qdisc and a u32 match-all filter redirecting to the ifb (or the peer)."""

        def redirect() -> None:
            index = self._index(self.VETH)
            target = (self._ns.link_lookup(ifname=self.IFB) or [self._index(self.PEER)])[0]
            self._ns.tc("add", "ingress", index, "ffff:")
            self._ns.tc("add-filter", "u32", index, parent="ffff:", protocol=0x0003, prio=10,
                        keys=["0x0/0x0+0"], target=0x10001,
                        action={"kind": "mirred", "direction": "egress", "action": "redirect",
                                "ifindex": target})

        return self._try("an ingress qdisc with a u32 mirred redirect", redirect)

    def bridge_netfilter(self) -> Outcome:
        outcome = self._try("a bridge", lambda: self._ns.link("add", ifname=self.BRIDGE, kind="bridge"))
        if not outcome.ok:
            return outcome
        result = proc.run(["test", "-e", BRIDGE_NF_SYSCTL], netns=self.netns, check=False)
        if result.returncode != 0:
            return Outcome(False, f"{BRIDGE_NF_SYSCTL} is missing: bridged packets never reach iptables")
        return Outcome(True, f"{BRIDGE_NF_SYSCTL} exists")

    def iptables(self) -> Outcome:
        if shutil.which("iptables") is None:
            return Outcome(False, "iptables is not on PATH")
        return self._command(["iptables", "-V"], "")

    def nfqueue(self) -> Outcome:
        return self._command(self._rule("-j", "NFQUEUE", "--queue-num", "999", "--queue-bypass"),
                             "the kernel accepted an NFQUEUE rule", netns=self.netns)

    def physdev(self) -> Outcome:
        return self._command(self._rule("-m", "physdev", "--physdev-in", self.VETH, "-j", "ACCEPT"),
                             "the kernel accepted a physdev match", netns=self.netns)

    def tool(self, name: str) -> Outcome:
        path = shutil.which(name)
        return Outcome(True, path) if path else Outcome(False, f"{name} is not on PATH")

    def tensorflow(self) -> Outcome:
        outcome = self._command([sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
                                "", timeout=TF_TIMEOUT_S)
        return Outcome(True, f"TensorFlow {outcome.detail}") if outcome.ok else outcome

    def torch(self) -> Outcome:
        found = self._torch()
        return Outcome(True, f"PyTorch {found[0]}") if found else Outcome(False, "PyTorch is not installed")

    def gloo(self) -> Outcome:
        found = self._torch()
        if found and found[1]:
            return Outcome(True, f"gloo available in torch {found[0]}")
        return Outcome(False, f"torch {found[0] if found else '-'} has no gloo backend (torch.distributed)")

    def _torch(self) -> tuple[str, bool] | None:
        """(torch's version, whether gloo is available), asked once; None: no torch."""
        if self._torch_found is False:
            outcome = self._command([sys.executable, "-c", "import torch, torch.distributed as d; "
                                     "print(torch.__version__, int(d.is_available() and d.is_gloo_available()))"],
                                    "", timeout=TF_TIMEOUT_S)
            words = outcome.detail.split()
            self._torch_found = (words[0], words[-1] == "1") if outcome.ok and len(words) == 2 else None
        return self._torch_found  # type: ignore[return-value]

    def close(self) -> None:
        """Remove the scratch namespace (and everything made inside it); safe to call twice."""
        netns = proc.pyroute2_netns()

        if self._ns is not None:
            self._ns.close()
            self._ns = None
        if not self._created:
            return
        self._created = False
        if self.netns not in netns.listnetns():
            return
        try:
            netns.remove(self.netns)
        except OSError as exc:
            raise NetbenchError(f"cannot remove the scratch namespace {self.netns}: {_nl_reason(exc)}",
                                hint="'netbench reset' removes it") from None

    def _index(self, ifname: str) -> int:
        found = self._ns.link_lookup(ifname=ifname)
        if not found:
            raise NetbenchError(f"no interface {ifname} in {self.netns}")
        return found[0]

    def _try(self, what: str, action: Callable[[], Any]) -> Outcome:
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            action()
        except (NetlinkError, OSError) as exc:
            return Outcome(False, f"the kernel refused {what} ({_nl_reason(exc)})")
        except NetbenchError as exc:
            return Outcome(False, exc.message)
        return Outcome(True, f"the kernel accepted {what}")

    @staticmethod
    def _rule(*args: str) -> list[str]:
        return ["iptables", "-w", "5", "-t", "mangle", "-A", "FORWARD", *args]

    @staticmethod
    def _command(argv: list[str], ok_detail: str, netns: str | None = None, timeout: float = 30.0) -> Outcome:
        """Run argv; ok with `ok_detail` (or its last output line), else the error it printed."""
        try:
            result = proc.run(argv, netns=netns, check=False, timeout=timeout)
        except NetbenchError as exc:
            return Outcome(False, exc.message)
        said = (result.stdout if result.returncode == 0 else result.stderr or result.stdout).strip().splitlines()
        last = said[-1] if said else f"exit status {result.returncode}"
        return Outcome(True, ok_detail or last) if result.returncode == 0 else Outcome(False, last)


def run_doctor(tensorflow: bool = True, prober: HostProber | None = None) -> Report:
    """Probe this host; the scratch namespace is removed even when a probe raises."""
    prober = prober or HostProber()
    try:
        return diagnose(prober, tensorflow=tensorflow)
    finally:
        prober.close()


def to_json(report: Report) -> dict[str, Any]:
    return {
        "backend": report.backend,
        "backend_reason": report.backend_reason,
        "ready": report.ready,
        "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix,
                    "needed_by": list(c.needed_by)} for c in report.checks],
    }
