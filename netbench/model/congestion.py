"""A sweep's TCP congestion control: the name's checks and the decisions around setting it (pure).

`--congestion-control NAME` (a playbook's `congestion_control:`) sets the default congestion
control of every node's namespace for the sweep (testbed/congestion.py does it, journaled),
so new connections of the job use it. Linux keeps that default per network namespace
(net.ipv4.tcp_congestion_control), but only the host's namespace may choose an algorithm
outside net.ipv4.tcp_allowed_congestion_control (a host-wide list; the host's default and reno
are always on it): for any other, the host's allowed list is widened for the sweep too.

Without the flag the embedded nodes get EMBEDDED_DEFAULT (cubic): a namespace would inherit
the host's default, which on some machines is bbr, whose PROBE_RTT drains the queue every ~10 s
and puts steps of hundreds of milliseconds into a shaped point's series; cubic is Linux's own
default and what most users' clusters run. `--congestion-control host` keeps what the
namespaces inherit (docs/background/fixed-costs.md).
"""

from __future__ import annotations

import re

DEFAULT_KEY = "net.ipv4.tcp_congestion_control"
AVAILABLE_KEY = "net.ipv4.tcp_available_congestion_control"
ALLOWED_KEY = "net.ipv4.tcp_allowed_congestion_control"

# the kernel's names are at most 15 characters (TCP_CA_NAME_MAX 16 with its NUL): reno, cubic,
# bbr, dctcp, htcp, vegas, ...; anything else could not be one, nor be passed to sysctl safely
NAME = re.compile(r"[a-z][a-z0-9_]{0,14}")

EMBEDDED_DEFAULT = "cubic"  # the embedded nodes' congestion control unless the sweep names one
HOST = "host"  # --congestion-control host: the nodes keep the host's default, as namespaces inherit it


def embedded_choice(requested: str | None, available: list[str]) -> tuple[str | None, bool]:
    """(the congestion control to set on the embedded nodes, None: leave the nodes' own; whether
    it is the default rather than asked for). A default the kernel lacks is not set (None)."""
    if requested == HOST:
        return None, False
    if requested:
        return requested, False
    return (EMBEDDED_DEFAULT, True) if EMBEDDED_DEFAULT in available else (None, False)


def rootless_refusal(name: str, allowed: list[str]) -> str | None:
    """Why a testbed without root may not set `name` on its nodes (a namespace not made by root
    may only choose from the host's allowed list, which only root can widen), or None."""
    if name in allowed:
        return None
    return (f"{name} is not in the host's allowed list ({' '.join(allowed) or 'empty'}), and without root "
            "netbench cannot add it")


def withheld_note(allowed: list[str]) -> str:
    """Why the nodes of a testbed without root keep the host's default, not the embedded one."""
    return (f"without root: {EMBEDDED_DEFAULT} is not in the host's allowed list ({' '.join(allowed) or 'empty'}), "
            f"so the nodes keep the host's default; as root, or with {EMBEDDED_DEFAULT} added to {ALLOWED_KEY}, "
            f"they get {EMBEDDED_DEFAULT}")


def rootless_choice(requested: str | None, allowed: list[str]) -> tuple[str | None, bool]:
    """embedded_choice for a testbed without root: the default only where the host allows it
    (else the nodes keep the host's default); a name asked for was checked (rootless_refusal)."""
    if requested == HOST:
        return None, False
    if requested:
        return requested, False
    return (EMBEDDED_DEFAULT, True) if EMBEDDED_DEFAULT in allowed else (None, False)


def check_name(text: str) -> str | None:
    """Why `text` cannot be a congestion control's name, or None when it can (it is not yet
    known to be available: `refusal` says that against the kernel's list)."""
    if not NAME.fullmatch(text):
        return f"{text!r} is not a congestion control's name (lower-case letters, digits, '_', at most 15)"
    return None


def refusal(name: str, available: list[str]) -> str | None:
    """Why `name` cannot be set with the kernel's `available` algorithms (the list of
    tcp_available_congestion_control, read after trying to load the module), or None."""
    why = check_name(name)
    if why is not None:
        return why
    if name not in available:
        return f"{name} is not available on this machine (available: {' '.join(available) or 'none'})"
    return None


def widened(allowed: list[str], name: str) -> str | None:
    """The host's tcp_allowed_congestion_control with `name` added, as sysctl takes it, or None
    when a namespace may already choose it."""
    if name in allowed:
        return None
    return " ".join([*allowed, name])


def allowed_setting(name: str) -> str:
    """The machine-wide hold's name for `name` on the host's allowed list (state/holds.py)."""
    return f"{ALLOWED_KEY}+{name}"


def narrowed(allowed: list[str], added: str) -> str | None:
    """The host's allowed list with only `added` (the name netbench widened it by) taken out, as
    sysctl takes it; None when it is no longer there. Whatever else changed the list meanwhile
    (an administrator, another tool) stays as it is now."""
    if added not in allowed:
        return None
    return " ".join(name for name in allowed if name != added)


def describe(by_node: dict[str, str], requested: str | None = None, default: str | None = None) -> str:
    """One line for the sweep's start: the nodes' TCP congestion control as read back, and
    whether the sweep set it (`requested`) or netbench's default did (`default`)."""
    kinds = sorted(set(by_node.values()))
    if len(kinds) == 1:
        line = f"TCP congestion control on every node: {kinds[0] or 'unknown'}"
    else:
        line = "TCP congestion control: " + ", ".join(f"{node} {cc or 'unknown'}" for node, cc in by_node.items())
    if requested == HOST:
        line += " (the host's default, as asked: --congestion-control host)"
    elif requested:
        line += f" (asked for this sweep: {requested})"
    elif default:
        line += (f" (netbench's default for the embedded nodes; --congestion-control NAME sets another, "
                 f"'{HOST}' keeps the host's)")
    return line


def plan_line(requested: str | None, what: str = "sweep") -> str:
    """The dry run's line: which congestion control the embedded nodes get for the `what`."""
    if requested == HOST:
        return f"TCP congestion control: the host's default on every node for the {what} (--congestion-control host)"
    name = requested or EMBEDDED_DEFAULT
    why = "" if requested else " (the embedded default; --congestion-control NAME sets another, 'host' keeps the host's)"
    return f"TCP congestion control {name} on every node for the {what}{why}, the previous one put back after it"
