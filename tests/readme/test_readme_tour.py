"""README tier: the README is a contract. The commands of its "A tour of the CLI" block run as
written, in order, on the embedded testbed (root, real TensorFlow), with short windows: a sweep
that trains gets SHORT appended (click takes an option's last value, so `--repeat 3` becomes 1)
and an --output in the test's folder. A shipped example that fails is a failing test.

Not covered yet: the examples elsewhere in the README and in --help texts (many need SSH hosts,
a netem kernel or long runs)."""

from __future__ import annotations

import csv
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import NETBENCH, ROOT, netbench_processes

pytestmark = [pytest.mark.root, pytest.mark.tf]

SHORT = ("--warmup", "1", "--steps", "2", "--batch-size", "16", "--repeat", "1")


def tour_commands(readme: str) -> list[list[str]]:
    """The `netbench ...` lines of the tour's first sh block, without their comments."""
    section = readme.split("## A tour of the CLI", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)[1]
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "netbench", line
            commands.append(words[1:])
    return commands


def test_the_tour_is_found():
    commands = tour_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert commands[0][:2] == ["testbed", "up"] and commands[-1] == ["reset"] and len(commands) >= 10


def test_the_tour_runs_as_written(clean_machine, tmp_path: Path):
    commands = tour_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    try:
        for i, argv in enumerate(commands):
            if argv[0] == "sweep" and "--dry-run" not in argv:
                argv = [*argv, *SHORT, "--output", str(tmp_path / f"sweep{i}")]
            result = subprocess.run([*NETBENCH, *argv], capture_output=True, text=True, timeout=600, cwd=ROOT)
            assert result.returncode == 0, f"netbench {shlex.join(argv)}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
            if argv[0] == "sweep" and "--dry-run" not in argv:
                with open(tmp_path / f"sweep{i}" / "results.csv", newline="") as fh:
                    statuses = [row["status"] for row in csv.DictReader(fh)]
                assert statuses and set(statuses) == {"ok"}, statuses
    finally:
        subprocess.run([*NETBENCH, "reset"], capture_output=True, text=True, timeout=120)
    assert netbench_processes() == []
