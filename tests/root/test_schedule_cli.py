"""Root tier: `netbench apply --schedule` on real namespaces with the userspace backend."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import NETBENCH, cli_ok

pytestmark = pytest.mark.root

SCHEDULE = ("name: quick\nsteps:\n  - {at: 0s, delay: 5ms}\n  - {at: 300ms, delay: 20ms}\n"
            "  - {at: 600ms, delay: 12ms, rate: 50mbit}\n")


def test_apply_schedule_lands_each_step_and_leaves_the_last(clean_machine, tmp_path):
    path = tmp_path / "quick.yaml"
    path.write_text(SCHEDULE)
    try:
        cli_ok("testbed", "up", "--nodes", "2")
        out = cli_ok("apply", "--schedule", str(path), "--backend", "userspace").stdout
        for name in ("quick@0s", "quick@0.3s", "quick@0.6s"):
            assert name in out, out
        assert "schedule: 3 change(s)" in out
        shown = json.loads(cli_ok("show", "--json").stdout)
        profiles = [node["profile"] for node in shown["nodes"]]
        assert len(profiles) == 2
        assert all(p["delay"] == "12ms" and p["rate"] == "50mbit" for p in profiles), profiles
    finally:
        subprocess.run([*NETBENCH, "reset"], capture_output=True, text=True, timeout=120)
