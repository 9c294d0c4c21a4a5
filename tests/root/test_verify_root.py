"""Root tier: `netbench verify` measures a real shaped testbed (userspace backend here; the
netem backend on a netem kernel) and compares it with what the kernel and engines hold."""

from __future__ import annotations

import json
import subprocess

import pytest

from netbench.experiment import verify
from netbench.emulation import backends
from netbench.emulation.executor import choose_backend, real_executor
from netbench.model.profile import Profile
from netbench.testbed import netns as local
from tests.conftest import NETBENCH

pytestmark = pytest.mark.root


def test_verify_reports_measured_against_configured(clean_machine):
    topo = local.up(2, clean_machine)
    profile = Profile(delay_us=10_000, rate_bps=50_000_000)
    backend = choose_backend(None).name
    real_executor(clean_machine).apply(backends.plan_apply(profile, topo, backend))
    result = subprocess.run([*NETBENCH, "verify", "--json", "--count", "40", "--interval", "0.02", "--seconds", "2"],
                            capture_output=True, text=True, timeout=180)
    record = json.loads(result.stdout)
    checks = {c["metric"]: c for c in record["checks"]}
    assert (record["from"], record["to"]) == ("n1", "n2")
    assert checks["rtt"]["configured"] == pytest.approx(20.0)  # 10 ms on each node's egress
    assert 19.0 < checks["rtt"]["measured"] < 30.0, checks["rtt"]
    assert checks["rate"]["configured"] == 50_000_000
    assert 0.5 < checks["rate"]["measured"] / 50_000_000 < 1.2, checks["rate"]
    assert checks["loss"]["configured"] == 0.0 and record["measured"]["pings_sent"] == 40
    # the exit status follows the verdict
    assert result.returncode == (0 if record["ok"] else 1), result.stderr


def test_verify_fails_when_the_link_is_not_what_was_claimed(clean_machine):
    topo = local.up(2, clean_machine)
    real_executor(clean_machine).apply(backends.plan_apply(Profile(delay_us=5_000), topo, choose_backend(None).name))
    n1, n2 = topo.nodes
    claimed = Profile(delay_us=20_000)  # the link really has 5 ms each way
    record = verify.verify(n1, claimed, n2, claimed, verify.Settings(ping_count=20, iperf_seconds=0))
    rtt = next(c for c in record["checks"] if c["metric"] == "rtt")
    assert rtt["configured"] == 40.0 and rtt["measured"] < 30.0
    assert rtt["ok"] is False and record["ok"] is False


def test_verify_needs_a_testbed(clean_machine):
    result = subprocess.run([*NETBENCH, "verify"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "needs a testbed of at least 2 nodes" in result.stderr
