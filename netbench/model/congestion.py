"""A sweep's TCP congestion control: the name's checks and the decisions around setting it (pure).

`--congestion-control NAME` (a playbook's `congestion_control:`) sets the default congestion
control of every node's namespace for the sweep (testbed/congestion.py does it, journaled),
so new connections of the job use it. Linux keeps that default per network namespace
(net.ipv4.tcp_congestion_control), but only the host's namespace may choose an algorithm
outside net.ipv4.tcp_allowed_congestion_control (a host-wide list; the host's default and reno
are always on it): for any other, the host's allowed list is widened for the sweep too.
"""

from __future__ import annotations

import re

DEFAULT_KEY = "net.ipv4.tcp_congestion_control"
AVAILABLE_KEY = "net.ipv4.tcp_available_congestion_control"
ALLOWED_KEY = "net.ipv4.tcp_allowed_congestion_control"

# the kernel's names are at most 15 characters (TCP_CA_NAME_MAX 16 with its NUL): reno, cubic,
# bbr, dctcp, htcp, vegas, ...; anything else could not be one, nor be passed to sysctl safely
NAME = re.compile(r"[a-z][a-z0-9_]{0,14}")


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


def narrowed(allowed: list[str], added: str) -> str | None:
    """The host's allowed list with only `added` (the name netbench widened it by) taken out, as
    sysctl takes it; None when it is no longer there. Whatever else changed the list meanwhile
    (an administrator, another tool) stays as it is now."""
    if added not in allowed:
        return None
    return " ".join(name for name in allowed if name != added)


def describe(by_node: dict[str, str], requested: str | None = None) -> str:
    """One line for the sweep's start: the nodes' TCP congestion control as read back, and
    whether the sweep set it."""
    kinds = sorted(set(by_node.values()))
    if len(kinds) == 1:
        line = f"TCP congestion control on every node: {kinds[0] or 'unknown'}"
    else:
        line = "TCP congestion control: " + ", ".join(f"{node} {cc or 'unknown'}" for node, cc in by_node.items())
    if requested:
        line += f" (asked for this sweep: {requested})"
    return line
