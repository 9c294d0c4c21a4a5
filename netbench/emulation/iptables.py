"""NFQUEUE rules in the switch namespace (the userspace backend's packet steering), via iptables."""

from __future__ import annotations

from netbench import proc
from netbench.emulation.changes import IPT_CHAIN
from netbench.errors import EmulationError

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

    def delete_rule(self, netns: str, args: list[str]) -> bool:
        """Delete one rule netbench added to its chain; False if it was not there."""
        return self._ipt(netns, "-D", IPT_CHAIN, *args, check=False).returncode == 0

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
