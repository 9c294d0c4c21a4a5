"""cgroup v2 on a stock kernel (this tier's VM; the development machine mounts only v1): the v2
adapter makes a node's group under netbench.slice, sets cpu.max, a busy process started in it
is throttled to its share (cpu.stat), and the group goes away. cgroup2 is mounted for the test
where the VM's boot did not mount it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netbench import proc
from netbench.emulation import cgroups as cg
from netbench.model.compute import quota_plan

BUSY = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def v2_root(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    root, _ = cg.find_roots(Path("/proc/self/mounts").read_text())
    mounted = None
    if root is None:
        mounted = tmp_path / "cgroup2"
        mounted.mkdir()
        subprocess.run(["mount", "-t", "cgroup2", "none", str(mounted)], check=True)
        root = mounted
    try:
        if "cpu" not in (root / "cgroup.controllers").read_text().split():
            pytest.skip(f"the cpu controller is bound to cgroup v1 here, not to {root}")
        yield root
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=False)


def test_the_v2_adapter_limits_a_busy_process_and_removes_its_group(v2_root):
    assert cg.detect().version == 2  # the machine's own choice, with cgroup2 mounted
    groups = cg.V2Cgroups(v2_root)
    name = "netbench-kernel-test"
    path = groups.create(name)
    try:
        assert "cpu" in (v2_root / cg.V2_PARENT / "cgroup.subtree_control").read_text().split()
        groups.set_quota(name, quota_plan(0.2))
        assert (path / "cpu.max").read_text().split() == ["2000", "10000"]
        child = proc.spawn([sys.executable, "-c", BUSY, "3"], cgroup=str(path / "cgroup.procs"))
        deadline = time.monotonic() + 30  # it joins as its first act, which a slow VM takes a while to reach
        while str(child.pid) not in (path / "cgroup.procs").read_text().split():
            assert child.poll() is None and time.monotonic() < deadline, "the child never joined its group"
            time.sleep(0.05)
        assert child.wait(timeout=120) == 0
        throttled = groups.throttled(name)
    finally:
        removed = groups.remove(name)
    assert removed and not path.exists() and not (v2_root / cg.V2_PARENT).exists()
    # 3 s of a busy loop at 0.2 CPU: held back most of the time (coarse: the VM's clock is noisy)
    assert throttled["nr_throttled"] > 10 and throttled["throttled_us"] > 1_000_000, throttled
