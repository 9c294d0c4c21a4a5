"""Probe the kernel: does it accept a netem qdisc? (the netem backend's probe)."""

from __future__ import annotations

import errno
import os

from pyroute2 import NetNS
from pyroute2.netlink.exceptions import NetlinkError

from netbench import proc
from netbench.errors import NetbenchError, PrivilegeError


def probe_netem(scratch_netns: str | None = None) -> tuple[bool, str]:
    """Try a netem qdisc on a dummy link in a scratch namespace; (available, reason).

    The default name carries this process's pid and start time (topology.scratch_netns),
    so a reset removes it after a crash, and only then."""
    pnetns = proc.pyroute2_netns()

    from netbench.model.topology import scratch_netns as scratch_name

    scratch_netns = scratch_netns or scratch_name("probe", os.getpid(), proc.start_time(os.getpid()))

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
        with NetNS(scratch_netns, flags=0) as ns:
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
