"""doctor's probe on this machine's kernel, in real scratch namespaces (tier root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from pyroute2 import netns as pnetns

from netbench.experiment import doctor
from tests.conftest import ROOT
from tests.unit.test_doctor import _by_name


@pytest.fixture
def no_scratch_left():
    """Root only; fails if a doctor namespace this test made is still there afterwards.

    Not clean_machine: its reset would remove other people's netbench-* namespaces.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root (creates a scratch network namespace)")
    before = set(_scratch_namespaces())
    yield
    left = set(_scratch_namespaces()) - before
    assert not left, f"scratch namespaces left behind: {left}"


def _scratch_namespaces() -> list[str]:
    return [name for name in pnetns.listnetns() if name.startswith(doctor.SCRATCH_PREFIX)]


@pytest.mark.root
def test_real_probe_on_this_machine(no_scratch_left):
    report = doctor.run_doctor(tensorflow=False)
    checks = _by_name(report)
    assert checks["netem"].status == "missing"
    assert "sch_netem" in checks["netem"].fix
    for name in ("privileges", "namespaces", "veth", "tbf", "htb", "ifb", "ingress+mirred",
                 "bridge netfilter", "iptables", "NFQUEUE", "physdev", "iperf3", "ping"):
        assert checks[name].status == "ok", (name, checks[name].detail)
    assert checks["tensorflow"].status == "skipped"
    assert report.backend == "userspace"
    assert "netem is missing" in report.backend_reason
    assert doctor.scratch_name() not in pnetns.listnetns()


class _Exploding(doctor.HostProber):
    def qdisc(self, kind):
        raise RuntimeError("probe blew up")


@pytest.mark.root
def test_scratch_namespace_removed_when_a_probe_raises(no_scratch_left):
    prober = _Exploding()
    with pytest.raises(RuntimeError, match="probe blew up"):
        doctor.run_doctor(tensorflow=False, prober=prober)
    assert prober.netns not in pnetns.listnetns()


@pytest.mark.root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop root")
def test_real_probe_as_nobody_reports_without_traceback(no_scratch_left):
    code = ("import json; from netbench.experiment import doctor; "
            "print(json.dumps(doctor.to_json(doctor.run_doctor(tensorflow=False))))")
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["privileges"]["status"] == "missing"
    assert checks["namespaces"]["status"] == "skipped" and "root" in checks["namespaces"]["detail"]
    assert data["backend"] == "none"
