"""`netbench apply --schedule --inventory` against real sshd hosts (tests/ssh/lab.py): the
schedule runs in the controller namespace and each change reaches every host through its
agent. The lab's hosts have no netem (this kernel), so the schedule is rate-only (tbf)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from tests.ssh.lab import VENV, root_lab

pytestmark = pytest.mark.root

SCHEDULE = ("name: ramp\nsteps:\n  - {at: 0s, rate: 10mbit}\n  - {at: 300ms, rate: 20mbit}\n"
            "  - {at: 600ms, rate: 30mbit}\n")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from root_lab(tmp_path_factory, "nbsch")


def logging_venv(lab) -> tuple[Path, Path]:
    """A venv for the inventory whose `netbench` logs each start (its arguments) to a file,
    then runs the real one: how many `node` processes a schedule started, and which."""
    venv, log = lab.dir / "logging-venv", lab.dir / "netbench-starts.log"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    real = shlex.quote(str(VENV / "bin"))
    scripts = {"python": f'exec {real}/python "$@"',
               "netbench": f'echo "$*" >> {shlex.quote(str(log))}\nexec {real}/netbench "$@"'}
    for name, body in scripts.items():
        (venv / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (venv / "bin" / name).chmod(0o755)
    log.write_text("")
    return venv, log


def test_a_three_step_schedule_changes_every_host_and_the_last_step_stays(lab):
    venv, log = logging_venv(lab)
    inventory = str(lab.write_inventory(defaults={"interface": "data0", "venv": str(venv), "agent": False}))
    schedule = lab.dir / "ramp.yaml"
    schedule.write_text(SCHEDULE)
    try:
        result = lab.netbench("apply", "--schedule", str(schedule), "--inventory", inventory, timeout=120)
        assert result.returncode == 0, (result.stdout, result.stderr)
        out = result.stdout + result.stderr
        for rate in ("10", "20", "30"):
            assert re.search(rf"ramp@\S+ \(0ms/{rate}mbit/0%\)\s+landed [+-]\d+\.\d ms from its time", out), out
        assert "schedule: 3 change(s), lateness mean" in out
        trip = re.search(r"one SSH round trip to 2 host\(s\) in parallel, mean (\d+\.\d) ms", out)
        assert trip, out
        print(f"\nSSH round trip per change (2 hosts): mean {trip.group(1)} ms; {out.splitlines()[-3]}")
        for host in lab.hosts:  # one `node serve` for the whole schedule, not a `node apply` per change
            started = [line.split()[-1] for line in log.read_text().splitlines() if str(host.state_dir) in line]
            assert started.count("serve") == 1 and "apply" not in started, started
        shown = json.loads(lab.netbench("show", "--inventory", inventory, "--json", check=True).stdout)["hosts"]
        for host in lab.hosts:
            (row,) = shown[host.name]["nodes"]
            assert row["profile"]["rate"] == "30mbit", row
            assert shown[host.name]["lease"]["held"] is False  # released at the end: the step stays
            qdisc = host.root_qdisc("data0")
            assert qdisc["kind"] == "tbf" and qdisc["options"]["rate"] == 30_000_000 // 8
            lines = [json.loads(line) for line in (host.state_dir / "journal.jsonl").read_text().splitlines()]
            # changed in place: the tbf was never cleared between steps, so one qdisc entry was
            # ever written (a clear would have marked it done and the next step written another)
            qdiscs = [line for line in lines if line.get("op") == "create" and line.get("kind") == "qdisc"]
            assert len(qdiscs) == 1 and not any(line.get("op") == "done" for line in lines), lines
    finally:
        lab.netbench("reset", "--inventory", inventory)
    for host in lab.hosts:
        root = host.root_qdisc("data0")
        assert not (root and root.get("handle") == "4e42:")
