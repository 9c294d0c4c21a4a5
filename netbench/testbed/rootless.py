"""What this host allows a user without root, said before anything starts.

`limits` reads the settings that decide it (pure given its readings: `Readings`) and says each
one that applies in one line with its fix; `probe` confirms the one that matters most by trying
it: a user namespace in which this user is root may bring a network link up. `netbench doctor`
shows them all; a command that needs the namespaces refuses with the first that stops it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from netbench.model import congestion as cc


@dataclass(frozen=True)
class Limit:
    """One thing this host withholds from a user without root."""

    what: str  # the setting, e.g. kernel.unprivileged_userns_clone
    says: str  # what it does to netbench, one line
    fix: str  # how to lift it (as root), or what netbench does instead
    blocks: bool  # True: no testbed without root at all; False: one feature only


@dataclass(frozen=True)
class Readings:
    """The host's settings, as read (None: not there on this kernel)."""

    userns_clone: str | None = None  # /proc/sys/kernel/unprivileged_userns_clone (Debian, Arch)
    max_user_namespaces: str | None = None  # /proc/sys/user/max_user_namespaces
    apparmor_restrict: str | None = None  # /proc/sys/kernel/apparmor_restrict_unprivileged_userns (Ubuntu)
    netem_loaded: bool = False  # /sys/module/sch_netem exists (loaded, or built in)
    cgroup_v2_delegated: bool = False  # this user may make CPU-limit groups under its own cgroup
    cgroup_v1: bool = False  # the cpu controller is on a cgroup v1 hierarchy
    allowed_cc: tuple[str, ...] = ()  # net.ipv4.tcp_allowed_congestion_control


CPUS_FIX = "run as root for --cpus (--step-delay needs no root)"


def cpus_withheld(cgroup_v1: bool, delegated: bool) -> str:
    """Why CPU limits (--cpus) are refused without root on this host: the doctor's line and the
    sweep's refusal. A delegated v2 subtree (`delegated`) would do, but none is used yet."""
    if cgroup_v1:
        return "CPU limits (--cpus) are refused: this host's cpu controller is on cgroup v1, which only root may divide"
    return ("CPU limits (--cpus) are refused: this netbench does not yet make its groups in a cgroup v2 subtree "
            "delegated to a user" + ("" if delegated else " (and none is delegated to you)"))


def limits(r: Readings) -> list[Limit]:
    """Every limit that applies to a user without root on a host with readings `r`."""
    found = []
    if r.userns_clone == "0":
        found.append(Limit("kernel.unprivileged_userns_clone", "unprivileged user namespaces are off: no testbed "
                           "without root", "as root: sysctl -w kernel.unprivileged_userns_clone=1", True))
    if r.max_user_namespaces == "0":
        found.append(Limit("user.max_user_namespaces", "user namespaces are limited to 0: no testbed without root",
                           "as root: sysctl -w user.max_user_namespaces=15000", True))
    if r.apparmor_restrict == "1":
        found.append(Limit("kernel.apparmor_restrict_unprivileged_userns", "AppArmor lets a user namespace be made but "
                           "denies it every capability: no testbed without root",
                           "as root: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor "
                           "profile with 'userns,' for this Python", True))
    if not r.netem_loaded:
        found.append(Limit("sch_netem", "the netem module is not loaded and only root can load it: the userspace "
                           "backend shapes instead", "as root: modprobe sch_netem", False))
    found.append(Limit("cgroup v1" if r.cgroup_v1 else "--cpus", cpus_withheld(r.cgroup_v1, r.cgroup_v2_delegated),
                       CPUS_FIX, False))
    if cc.EMBEDDED_DEFAULT not in r.allowed_cc:
        found.append(Limit("net.ipv4.tcp_allowed_congestion_control",
                           f"only {', '.join(r.allowed_cc) or 'none'} may be chosen without root: the nodes keep the "
                           f"host's default instead of {cc.EMBEDDED_DEFAULT}",
                           f"as root: add {cc.EMBEDDED_DEFAULT} to net.ipv4.tcp_allowed_congestion_control", False))
    return found


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def read_host() -> Readings:
    """This host's readings (no root needed)."""
    from netbench.emulation import cgroups

    allowed = _read("/proc/sys/net/ipv4/tcp_allowed_congestion_control") or ""
    return Readings(userns_clone=_read("/proc/sys/kernel/unprivileged_userns_clone"),
                    max_user_namespaces=_read("/proc/sys/user/max_user_namespaces"),
                    apparmor_restrict=_read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
                    netem_loaded=Path("/sys/module/sch_netem").exists(),
                    cgroup_v2_delegated=cgroups.delegated_v2() is not None,
                    cgroup_v1=cgroups.cpu_on_v1(),
                    allowed_cc=tuple(allowed.split()))


def probe() -> str | None:
    """None when a user namespace of this user's may bring a link up in a network namespace of
    its own; else what went wrong, in one line."""
    try:
        result = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--", "ip", "link", "set", "lo", "up"],
                                capture_output=True, text=True, timeout=10)
    except FileNotFoundError as exc:
        return f"{exc.filename} is not installed (util-linux's unshare, iproute2's ip)"
    except subprocess.TimeoutExpired:
        return "a user namespace did not start within 10 s"
    if result.returncode == 0:
        return None
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"


def refusal() -> Limit | None:
    """The limit that keeps a user without root from any testbed here, if one does (checked
    by the settings, then by trying)."""
    blocking = [limit for limit in limits(read_host()) if limit.blocks]
    if blocking:
        return blocking[0]
    failed = probe()
    if failed is not None:
        return Limit("user namespaces", f"a user namespace cannot shape a link here ({failed})",
                     "run netbench as root, or see 'netbench doctor'", True)
    return None
