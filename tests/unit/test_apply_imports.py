"""`netbench apply` starts without the sweep's code: what its path imports leaves out the
modules only a sweep needs (each one is interpreter start-up on every quick command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SWEEP_ONLY = ("netbench.experiment.verify", "netbench.jobs.launch", "netbench.jobs.events", "netbench.stats",
              "netbench.experiment.runner", "netbench.experiment.predict")


def test_the_apply_path_imports_none_of_the_sweeps_modules():
    code = ("import json, sys; import netbench.cli.app, netbench.cli.emulation, netbench.testbed.targets, "
            "netbench.testbed.embedded; print(json.dumps(sorted(m for m in sys.modules if m.startswith('netbench'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    loaded = set(json.loads(out.stdout))
    assert "netbench.testbed.embedded" in loaded
    assert loaded.isdisjoint(SWEEP_ONLY), sorted(loaded & set(SWEEP_ONLY))


def test_the_embedded_testbed_still_spawns_and_verifies_on_demand(tmp_path):
    from netbench.jobs.launch import LocalSpawner
    from netbench.state.journal import Journal
    from netbench.testbed.embedded import EmbeddedTestbed

    bed = EmbeddedTestbed(Journal(tmp_path))
    assert isinstance(bed.spawn, LocalSpawner) and bed.spawn is bed.spawn  # made once, on first use
