"""The one place that chooses the Target (base.py) a command acts on, from its flags."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from netbench.testbed.base import Target


@contextlib.contextmanager
def open_target(inventory: Path | None = None, insecure_host_keys: bool = False, backend: str | None = None,
                takeover: bool = False, journal=None) -> Iterator[Target]:
    """The target the flags name: the inventory's SSH hosts, or without one the embedded
    namespaces on this machine (journaled in `journal`, default the state folder's)."""
    if inventory is None:
        from netbench.state.journal import Journal
        from netbench.testbed.embedded import EmbeddedTestbed

        yield EmbeddedTestbed(journal or Journal(), backend)
        return
    from netbench.remote import controller
    from netbench.testbed.hosts import HostsTestbed

    loaded, conns = controller.open_inventory(inventory, insecure_host_keys)
    try:
        yield HostsTestbed(loaded, conns, backend, takeover=takeover)
    finally:
        controller.close_all(conns)


@contextlib.contextmanager
def hosts_testbed(inventory_path: Path, insecure: bool, config, takeover: bool = False) -> Iterator[Target]:
    """The inventory's hosts as a sweep's or playbook's target: every run is placed on hosts
    first (hosts.check_on_hosts: pure checks, no connection), then open_target opens them."""
    from netbench.testbed.hosts import check_on_hosts

    check_on_hosts(config, inventory_path)
    with open_target(inventory_path, insecure, config.backend, takeover=takeover) as hosts:
        yield hosts
