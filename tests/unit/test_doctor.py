"""`netbench doctor`: the pure decision and rendering with a fake prober, then the real
HostProber on this machine (root tier), which has every piece of the userspace backend
but no sch_netem."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import pytest
from rich.console import Console

from netbench.cli import render
from netbench.experiment import doctor
from netbench.experiment.doctor import Check, Outcome
from netbench.emulation.executor import choose_backend

USERSPACE_PIECES = {"tbf", "iptables", "NFQUEUE", "physdev", "bridge netfilter"}
NAMESPACE_CHECKS = {"namespaces", "veth", "netem", "tbf", "htb", "ifb", "ingress+mirred",
                    "bridge netfilter", "NFQUEUE", "physdev"}


@dataclass
class FakeProber:
    """Every probe succeeds unless named in `failing`; records which probes ran."""

    failing: set[str] = field(default_factory=set)
    called: list[str] = field(default_factory=list)

    def _answer(self, name: str) -> Outcome:
        self.called.append(name)
        if name in self.failing:
            return Outcome(False, f"fake: {name} refused")
        return Outcome(True, f"fake: {name} works")

    def privileges(self): return self._answer("privileges")
    def namespaces(self): return self._answer("namespaces")
    def veth(self): return self._answer("veth")
    def qdisc(self, kind): return self._answer(kind)
    def ifb(self): return self._answer("ifb")
    def mirred(self): return self._answer("ingress+mirred")
    def bridge_netfilter(self): return self._answer("bridge netfilter")
    def iptables(self): return self._answer("iptables")
    def nfqueue(self): return self._answer("NFQUEUE")
    def physdev(self): return self._answer("physdev")
    def tool(self, name): return self._answer(name)
    def tensorflow(self): return self._answer("tensorflow")
    def torch(self): return self._answer("torch")
    def gloo(self): return self._answer("gloo")


ALL_NAMES = {spec.name for spec in doctor.SPECS}


def _by_name(report: doctor.Report) -> dict[str, Check]:
    return {check.name: check for check in report.checks}


# ---------------------------------------------------------------- pure


def test_specs_are_unique_and_require_only_earlier_checks():
    seen: set[str] = set()
    for spec in doctor.SPECS:
        assert spec.name not in seen
        assert set(spec.requires) <= seen, spec.name
        seen.add(spec.name)
    assert set(doctor.USERSPACE_NEEDS) <= seen


def test_everything_works_gives_netem():
    report = doctor.diagnose(FakeProber())
    assert report.backend == "netem"
    assert report.backend_reason == "fake: netem works"
    assert report.ready
    assert all(check.status == "ok" and check.fix == "" for check in report.checks)


def test_netem_missing_with_userspace_pieces_gives_userspace():
    report = doctor.diagnose(FakeProber(failing={"netem"}))
    assert report.backend == "userspace"
    assert "netem is missing" in report.backend_reason
    assert "fake: netem refused" in report.backend_reason
    assert "NFQUEUE" in report.backend_reason
    assert "sch_netem" in _by_name(report)["netem"].fix


@pytest.mark.parametrize("piece", sorted(USERSPACE_PIECES))
def test_netem_and_one_userspace_piece_missing_gives_none(piece):
    report = doctor.diagnose(FakeProber(failing={"netem", piece}))
    assert report.backend == "none"
    assert not report.ready
    assert "netem is missing" in report.backend_reason
    assert f"lacks {piece}" in report.backend_reason


def test_nothing_works_gives_none_and_every_missing_check_has_a_fix():
    report = doctor.diagnose(FakeProber(failing=ALL_NAMES - {"privileges"}))
    assert report.backend == "none"
    assert "netem" in report.backend_reason
    for check in report.checks:
        if check.status == "missing":
            assert check.fix, check.name
        else:
            assert check.fix == "", check.name
    statuses = _by_name(report)
    assert statuses["namespaces"].status == "missing"
    assert statuses["veth"].status == "skipped"  # nothing to try it in
    assert statuses["iperf3"].status == "missing"


@pytest.mark.parametrize("name,words", [
    ("netem", ["linux-image-amd64", "linux-modules-extra-$(uname -r)", "modprobe sch_netem"]),
    ("ifb", ["modprobe ifb"]),
    ("bridge netfilter", ["modprobe br_netfilter"]),
    ("iptables", ["apt install iptables"]),
    ("iperf3", ["apt install iperf3"]),
    ("tensorflow", ["make install", "pip install -e '.[tf]'"]),
    ("torch", ["make install", "pip install torch==2.13.0+cpu", "CPU build"]),
    ("privileges", ["root", "CAP_NET_ADMIN"]),
])
def test_fixes_are_concrete(name, words):
    fix = _by_name(doctor.diagnose(FakeProber(failing={name})))[name].fix
    for word in words:
        assert word in fix


def test_not_root_reports_instead_of_probing_namespaces():
    prober = FakeProber(failing={"privileges"})
    report = doctor.diagnose(prober)
    checks = _by_name(report)
    assert checks["privileges"].status == "missing"
    for name in NAMESPACE_CHECKS:
        assert checks[name].status == "skipped", name
        assert "root" in checks[name].detail, name
    assert not NAMESPACE_CHECKS & set(prober.called)
    assert {"iptables", "iperf3", "ping", "tensorflow"} <= set(prober.called)
    assert report.backend == "none"
    assert "netem not checked" in report.backend_reason


def test_tensorflow_can_be_left_unchecked():
    prober = FakeProber()
    check = _by_name(doctor.diagnose(prober, tensorflow=False))["tensorflow"]
    assert check.status == "skipped"
    assert "not checked" in check.detail
    assert "tensorflow" not in prober.called


@pytest.mark.parametrize("has_netem", [True, False])
def test_decision_agrees_with_choose_backend(has_netem):
    report = doctor.diagnose(FakeProber(failing=set() if has_netem else {"netem"}))
    chosen = choose_backend(None, probe=lambda: (has_netem, "probe"))
    assert report.backend == chosen.name


def test_json_shape():
    report = doctor.diagnose(FakeProber(failing={"netem"}), tensorflow=False)
    data = json.loads(json.dumps(doctor.to_json(report)))
    assert set(data) == {"backend", "backend_reason", "ready", "checks"}
    assert data["backend"] == "userspace" and data["ready"] is True
    assert [c["name"] for c in data["checks"]] == [spec.name for spec in doctor.SPECS]
    for entry in data["checks"]:
        assert set(entry) == {"name", "status", "detail", "fix", "needed_by"}
        assert entry["status"] in ("ok", "missing", "skipped")
        assert isinstance(entry["needed_by"], list)


def test_render_shows_every_check_and_keeps_brackets():
    report = doctor.diagnose(FakeProber(failing={"netem", "tensorflow"}))
    table = render.doctor_table(report)
    assert table.row_count == len(report.checks)
    buffer = io.StringIO()
    Console(file=buffer, width=300, color_system=None).print(table)
    text = buffer.getvalue()
    assert ".[tf]" in text  # would be eaten if fixes were parsed as rich markup
    assert "backend: userspace" in text


@pytest.mark.parametrize("capeff,expected", [
    ("000001fffeffffff", True), ("0000000000001000", True), ("0000000000000fff", False), ("0", False),
])
def test_has_net_admin(capeff, expected):
    assert doctor.has_net_admin(f"Name:\tpython\nCapEff:\t{capeff}\n") is expected
    assert doctor.has_net_admin("Name:\tpython\n") is False


# ---------------------------------------------------------------- root


def test_gloo_is_checked_only_where_torch_imports():
    prober = FakeProber(failing={"torch"})
    checks = _by_name(doctor.diagnose(prober, tensorflow=False))
    assert checks["torch"].status == "missing" and checks["gloo"].status == "skipped"
    assert "torch" in checks["gloo"].detail and "gloo" not in prober.called
    # torch is optional: its absence leaves the backend (and readiness) as it was
    assert doctor.diagnose(FakeProber(failing={"torch"}), tensorflow=False).ready
