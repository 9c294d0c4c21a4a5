"""The Slurm tier: a campaign through a real Slurm (tests/slurm/lab.py: Debian's slurm-wlm and
munge, installed where missing, one slurmctld, one slurmd and munged started here in a folder
of their own, stopped and removed after).

A small design (2 batch sizes x 2 repetitions, 3 measured steps, no precision) is submitted
as 2 shards by SUBMITTER, an ordinary user the lab makes (each shard's testbed a sandbox of its
own: netbench without root; its rows say privilege rootless); one shard's task is cancelled (scancel) once it has recorded its
first run; `netbench status` says it stopped; submitting again runs that shard's missing run
only (the recorded one is not run again); the merged report is complete and every row names
the host it ran on. On the one node, --exclusive runs the tasks one after another.

Its cost, measured here (2 cores): 29-46 s with the packages installed (the cluster up in ~5 s,
4 short runs, one run again), 11-45 s more where apt-get installs them.
"""

from __future__ import annotations

import csv
import json
import os
import pwd
import socket
import time
from pathlib import Path

import pytest

from netbench.testbed import netns as local
from tests.slurm.lab import USER, ensure_installed, job_id, places_snapshot, slurm_lab, system_python_fits

# Who submits: an ordinary user the lab makes and removes (USER), whose shards hold their
# testbeds in sandboxes of their own (netbench without root); "root" submits as root.
SUBMITTER = USER
PRIVILEGE = "root" if SUBMITTER == "root" else "rootless"

PLAYBOOK = """\
name: tiny-campaign
description: two batch sizes, two repetitions (the Slurm tier's design)
factors:
  batch_size: [16, 32]
fixed: {strategy: allreduce, model: mlp, workers: 2, latency: 1ms}
repeat: 2
order: random
seed: 3
warmup: 1
steps: 3
precision: off
startup_timeout: 120s
step_timeout: 30s
"""


def wait_for(what: str, check, timeout: float, lab=None, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if lab is not None:
            lab.watch_steps()
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def records(shard: Path) -> dict[str, dict]:
    out = {}
    for path in sorted((shard / "runs").glob("r*.json")) if (shard / "runs").is_dir() else ():
        try:
            out[path.stem] = json.loads(path.read_text())
        except ValueError:
            continue  # being written
    return out


def test_a_campaign_through_slurm_survives_a_cancelled_shard_and_merges_complete():
    if SUBMITTER == USER and system_python_fits() is not None:
        pytest.skip(system_python_fits())
    installed_s = ensure_installed()
    before = places_snapshot()
    started = time.monotonic()
    with slurm_lab(SUBMITTER) as lab:
        owner = pwd.getpwnam(lab.user)
        book, folder, state = lab.work / "tiny.yaml", lab.work / "campaign", lab.work / "state"
        book.write_text(PLAYBOOK)
        state.mkdir()
        for path in (book, state):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        env = {"NETBENCH_STATE_DIR": str(state)}
        try:
            shown = lab.netbench("submit", str(book), "--slurm", "--shards", "2", "--output", str(folder), **env).stdout
            first = job_id(shown)
            assert str(folder) in shown and "array task(s) 0, 1 of 2 shards" in shown

            # cancel the shard that runs first once it has recorded its first run (its second
            # is another launch: seconds of start-up away)
            def one_recorded():
                for index in (0, 1):
                    if len(records(folder / f"shard-{index}")) == 1:
                        return index
                return None

            cancelled = wait_for("a shard's first run", one_recorded, 240, lab, step=0.1)
            lab.run(["scancel", f"{first}_{cancelled}"])
            kept = records(folder / f"shard-{cancelled}")
            assert len(kept) == 1
            (kept_id, kept_record), = kept.items()
            wait_for("the cancelled task to end", lambda: f"{first}_{cancelled}" not in lab.jobs(), 120, lab)
            status = lab.netbench("status", str(folder), **env).stdout
            row = next(line.split() for line in status.splitlines() if line.split()[:1] == [str(cancelled)])
            assert row[1:2] == ["stopped"] and row[3] == "1/2" and "CANCELLED" in status, status

            again = lab.netbench("submit", str(book), "--slurm", "--shards", "2", "--output", str(folder), **env).stdout
            assert f"array task(s) {cancelled} of 2 shards" in again, again
            second = job_id(again)
            assert second != first
            wait_for("every job to end", lambda: not lab.jobs(), 420, lab, step=0.5)

            status = lab.netbench("status", str(folder), **env).stdout
            assert "all 4 runs done" in status, status
            assert records(folder / f"shard-{cancelled}")[kept_id]["started"] == kept_record["started"]  # not run again
            outputs = sorted(p.name for p in (folder / "slurm").glob("shard-*.out"))
            assert f"shard-{cancelled}.job-{first}.out" in outputs and f"shard-{cancelled}.job-{second}.out" in outputs
            assert "CANCELLED" in (folder / "slurm" / f"shard-{cancelled}.job-{first}.out").read_text()

            report = lab.netbench("report", str(folder), **env)
            assert "merged 4 of 4 runs" in report.stdout, report.stdout + report.stderr
            with open(folder / "merged" / "results.csv", newline="") as fh:
                rows = list(csv.DictReader(fh))
            assert sorted(r["run_id"] for r in rows) == ["r000", "r001", "r002", "r003"]
            for row in rows:
                assert row["status"] == "ok", row
                assert (row["host"], row["privilege"], row["cores"]) == \
                    (socket.gethostname(), PRIVILEGE, str(len(os.sched_getaffinity(0))))
                assert row["shard"] in ("0/2", "1/2") and row["kernel"] == os.uname().release
            text = (folder / "report" / "report.md").read_text()
            assert "## Machines" in text and socket.gethostname() in text.split("## Machines")[1]
            assert all(Path(p).stat().st_uid == owner.pw_uid for p in (folder / "merged" / "results.csv",
                                                                        folder / "shard-0" / "results.csv"))
        finally:
            lab.watch_steps()
            reset = lab.netbench("reset", check=False, **env)
            assert reset.returncode == 0, reset.stdout + reset.stderr
    assert lab.leftovers() == []
    assert places_snapshot() == before  # nothing of munge's or Slurm's outside the lab's folder
    assert local.list_netbench_netns() == []
    print(f"slurm tier: {time.monotonic() - started:.1f} s (+ {installed_s:.1f} s installing slurm-wlm and munge)")
