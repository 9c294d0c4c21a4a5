"""The kernel tier's shared fixture: a kernel with netem, or a skip (a failure where the run
requires one, as `make test-kernel`'s VM does)."""

from __future__ import annotations

import os

import pytest

from netbench.emulation.probe import probe_netem


@pytest.fixture(scope="module")
def netem_kernel():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    has_netem, why = probe_netem("netbench-probe-k")
    if not has_netem:
        if os.environ.get("NETBENCH_REQUIRE_NETEM") == "1":
            pytest.fail(f"this run requires netem and the kernel has none: {why}")
        pytest.skip(f"no netem on this kernel ({why}); 'make test-kernel' boots one that has it")
