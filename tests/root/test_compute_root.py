"""CPU limits on this machine's real cgroups (root; cgroup v1 here, v2 is proven under
`make test-kernel`): a limited busy process runs at its share and is throttled, its group goes
away after it; a sweep's node processes start in their node's group, and `netbench reset`
removes the groups after the controller is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netbench import proc
from netbench.emulation import cgroups as cg
from netbench.model.compute import quota_plan
from netbench.testbed import netns as local
from tests.conftest import NETBENCH, ROOT, cli_ok

BUSY = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n" \
       "print(time.process_time())"
REGEX = r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms"


@pytest.fixture
def groups():
    if os.geteuid() != 0:
        pytest.skip("needs root (writes cgroups)")
    return cg.detect()


def test_a_limited_busy_process_gets_its_share_and_its_group_goes(groups):
    name = f"netbench-test-{os.getpid()}"
    groups.create(name)
    try:
        groups.set_quota(name, quota_plan(0.2))
        limited = proc.spawn([sys.executable, "-c", BUSY, "2"], stdout=subprocess.PIPE,
                             cgroup=str(groups.path(name) / "cgroup.procs"))
        cpu_limited = float(limited.communicate(timeout=30)[0])
        throttled = groups.throttled(name)
    finally:
        assert groups.remove(name)
    assert cpu_limited <= 2 * 0.2 * 1.25, cpu_limited  # 2 s of wall time at 0.2 CPU (+ start-up)
    # held back by its quota (an unlimited twin is no yardstick on a machine whose other work may
    # leave it less than 0.2 CPU): the kernel throttled it, and for a good part of the 2 s
    assert throttled["nr_throttled"] > 0 and throttled["throttled_us"] > 200_000, throttled
    assert not groups.path(name).exists()


def test_node_processes_start_in_their_group_and_reset_removes_it_after_kill_9(clean_machine, groups, tmp_path):
    job = tmp_path / "launcher.sh"  # a launcher whose child does the work, as torchrun's would
    job.write_text(f"{sys.executable} {ROOT}/examples/plain_steps.py --kib 16 &\nwait\n")
    controller = subprocess.Popen([*NETBENCH, "sweep", "--latency", "1ms", "--workers", "2", "--steps", "100000",
                                   "--cpus", "n2=0.5", "--step-delay", "n1=5ms",
                                   "--images-per-step", "8", "--step-regex", REGEX, "--output", str(tmp_path / "out"),
                                   "--", "sh", str(job)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    n2 = groups.path(cg.group_name("netbench-n2"))
    try:
        deadline = time.monotonic() + 120
        while not _pids_running_steps(n2):
            assert controller.poll() is None, "the sweep ended before its job started"
            assert time.monotonic() < deadline, "the job's rank on n2 never started in n2's group"
            time.sleep(0.5)
        in_group = _pids_running_steps(n2)
        assert (n2 / ("cpu.max" if groups.version == 2 else "cpu.cfs_quota_us")).read_text().split()[0] == "5000"
        assert not groups.path(cg.group_name("netbench-n1")).exists()  # n1 is not limited
    finally:
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
    assert in_group  # the launcher's child, started by the job itself, is in the group
    result = cli_ok("reset")
    assert f"cgroup {n2}" in result.stdout + result.stderr
    assert not n2.exists() and not list(groups.root.glob("netbench*/netbench-n*"))
    assert local.list_netbench_netns() == []


def _pids_running_steps(group: Path) -> list[int]:
    """The pids in `group` that run plain_steps.py."""
    try:
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []
    out = []
    for pid in pids:
        try:
            if b"plain_steps.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out
