"""A design run as a campaign of shards through Slurm against the same design on one machine:
each design point's geometric mean images/sec and 95 % interval side by side, and whether the
two answers agree (the intervals overlap; the ratio's Welch interval holds 1).

    flock /tmp/netbench-bed.lock .venv/bin/python bench/campaign.py playbooks/ps-check.yaml --shards 2

Runs `netbench run PLAYBOOK` into OUT/one-machine (as root), then starts a one-node Slurm
cluster (the Slurm tier's lab, tests/slurm/lab.py: munged, slurmctld and slurmd in a folder of
their own, stopped and removed after) and, as an ordinary user the lab makes (`--submitter
root`: as root), `netbench submit PLAYBOOK --slurm --shards N` into OUT/campaign-<submitter>,
waits for its jobs and reports it (`netbench report`, which merges the shards). On one node the
shards' tasks run one after another (--exclusive), so both halves measure the same machine.
`--reuse` skips a half whose folder is already complete. Prints each half's wall time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one_machine(playbook: Path, out: Path) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "netbench.cli", "run", str(playbook), "--output", str(out)], check=True)
    return time.monotonic() - started


def campaign(playbook: Path, out: Path, shards: int, submitter: str) -> float:
    import os
    import pwd

    from tests.slurm.lab import USER, ensure_installed, job_id, slurm_lab

    ensure_installed()
    started = time.monotonic()
    with slurm_lab(USER if submitter == "user" else "root") as lab:
        out.mkdir(parents=True)
        entry = pwd.getpwnam(lab.user)
        os.chown(out, entry.pw_uid, entry.pw_gid)
        shown = lab.netbench("submit", str(playbook), "--slurm", "--shards", str(shards), "--output", str(out),
                             timeout=600).stdout
        print(shown, end="")
        job_id(shown)
        while lab.jobs():
            lab.watch_steps()
            time.sleep(2)
    print(subprocess.run([sys.executable, "-m", "netbench.cli", "status", str(out)], capture_output=True,
                         text=True).stdout, end="")
    return time.monotonic() - started


def compare(one: Path, merged: Path) -> list[str]:
    """The table: per design point, each half's centre and interval, their ratio, and agreement."""
    from netbench.report import group_observations, load_observations
    from netbench.report.groups import ordered, varying
    from netbench.stats import ratio_interval

    a = {g.factors: g for g in group_observations(load_observations(one))}
    b = {g.factors: g for g in group_observations(load_observations(merged))}
    shown = varying(list(a.values())) or ["model"]
    lines = [" | ".join([*shown, "one machine", "campaign (Slurm)", "campaign / one", "intervals overlap",
                         "ratio's interval holds 1"]),
             " | ".join(["---"] * (len(shown) + 5))]
    overlap = holds = 0
    for group in ordered(a.values()):
        other = b.get(group.factors)
        if other is None or group.interval is None or other.interval is None:
            lines.append(" | ".join([*(str(group.get(s)) for s in shown), "-", "-", "-", "missing"]))
            continue

        def text(i) -> str:
            return f"{i.mean:.1f} [{i.low:.1f}, {i.high:.1f}]" if i.low is not None else f"{i.mean:.1f}"

        ratio = ratio_interval(other.values, group.values, 0.95)
        meets = group.interval.low is not None and other.interval.low is not None and \
            group.interval.low <= other.interval.high and other.interval.low <= group.interval.high
        one = ratio.low is not None and ratio.low <= 1 <= ratio.high
        overlap, holds = overlap + meets, holds + one
        lines.append(" | ".join([*(str(group.get(s)) for s in shown), text(group.interval), text(other.interval),
                                 f"{ratio.mean:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]" if ratio.low else
                                 f"{ratio.mean:.3f}", "yes" if meets else "no", "yes" if one else "no"]))
    lines.append(f"{overlap} of {len(a)} points: the two 95 % intervals overlap; {holds} of {len(a)}: the ratio's "
                 "95 % (Welch, log scale) interval holds 1")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("playbook", type=Path)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "campaign")
    parser.add_argument("--reuse", action="store_true", help="keep a half whose folder is complete")
    parser.add_argument("--submitter", choices=("user", "root"), default="user",
                        help="who submits the campaign: an ordinary user the lab makes (its shards rootless), or root")
    args = parser.parse_args()
    playbook = args.playbook.absolute()
    one, camp = args.out / "one-machine", args.out / f"campaign-{args.submitter}"
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.reuse and (one / "results.csv").exists()):
        print(f"one machine: {one_machine(playbook, one):.0f} s")
    if not (args.reuse and (camp / "merged" / "results.csv").exists()):
        print(f"campaign of {args.shards} shards through Slurm, submitted by {args.submitter}: "
              f"{campaign(playbook, camp, args.shards, args.submitter):.0f} s")
    subprocess.run([sys.executable, "-m", "netbench.cli", "report", str(camp)], check=True)
    subprocess.run([sys.executable, "-m", "netbench.cli", "report", str(one)], check=True, capture_output=True)
    print("\n".join(compare(one, camp / "merged")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
