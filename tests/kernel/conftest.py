"""The kernel tier's shared fixture: a kernel with netem, or a skip (a failure where the run
requires one, as `make test-kernel`'s VM does)."""

from __future__ import annotations

import contextlib
import os

import pytest

from netbench.emulation.probe import probe_netem
from netbench.state.journal import Journal
from netbench.state.reset import reset
from netbench.testbed import netns as local


@contextlib.contextmanager
def bed_of(nodes, state):
    """`nodes` namespaces journaled in `state` (NETBENCH_STATE_DIR points there meanwhile),
    reset afterwards (also on failure), checked to leave nothing."""
    old = os.environ.get("NETBENCH_STATE_DIR")
    os.environ["NETBENCH_STATE_DIR"] = str(state)
    journal = Journal(state)
    try:
        yield local.up(nodes, journal), journal
    finally:
        reset(journal)
        if old is None:
            os.environ.pop("NETBENCH_STATE_DIR", None)
        else:
            os.environ["NETBENCH_STATE_DIR"] = old
        assert not local.list_netbench_netns()


@pytest.fixture(scope="module")
def netem_kernel():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    has_netem, why = probe_netem("netbench-probe-k")
    if not has_netem:
        if os.environ.get("NETBENCH_REQUIRE_NETEM") == "1":
            pytest.fail(f"this run requires netem and the kernel has none: {why}")
        pytest.skip(f"no netem on this kernel ({why}); 'make test-kernel' boots one that has it")
