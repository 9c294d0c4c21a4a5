"""Fakes for the privilege check of commands that need a testbed (testbed/sandbox.py)."""

from __future__ import annotations

from netbench.testbed import rootless


def no_userns(monkeypatch) -> None:
    """A host where a user without root gets no testbed (unprivileged user namespaces off), so
    a command run as a faked user stops at the privilege check with exit status 3."""
    limit = rootless.Limit("kernel.unprivileged_userns_clone", "unprivileged user namespaces are off",
                           "as root: sysctl -w kernel.unprivileged_userns_clone=1", True)
    monkeypatch.setattr(rootless, "refusal", lambda: limit)
