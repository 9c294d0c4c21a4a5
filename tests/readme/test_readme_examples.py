"""The docs tier. The documentation is a contract: every command example netbench ships (the
```sh blocks of README.md and of docs/, and the --help texts' `Example:` lines) runs here, on
the embedded testbed (root, TensorFlow); test_docs_site.py builds the site and checks what
it covers.

The examples are found by parsing (tests/readme_examples.py), so a new one runs without being
added here; tests/readme/plan.py names the exceptions, each with its reason: examples that
cannot run on one machine (SSH inventories, make targets, the host agent), training commands
that run as --dry-run (a kind another example trains, or a large grid), placeholders,
and the state a block's text assumes (a testbed of N nodes).

One test per block: its examples run in the order shown, in one testbed and one working folder
(the repository's profiles/, playbooks/ and examples/ linked in, results/ written there), each as a shell
command line with `netbench` being this checkout's CLI; `netbench reset` ends every block, also
on failure, and the `clean_machine` fixture fails a block that leaves anything behind. Blocks
run in the order shown too, so `netbench report results/smoke` finds what `netbench run
playbooks/smoke.yaml` wrote a block before.

A block shown twice (the same commands) runs once; a training command shown again in another
block trains only where it is first shown and is not run again (its output, where a page shows
it, is compared with what it printed there). What runs is shortened, never changed in kind (readme_examples.shorten): a sweep measures
`--steps 3 --warmup 1` with `--precision off` (or the precision it names within `--max-seconds
2`; a sweep with --schedule `--seconds 3`, so the schedule's change at 2 s
lands inside the run; a --seconds window 1 s), `--repeat 1`, on any free --metrics-port; a
verify sends 10 pings and 1 s of iperf3; `sudo` is dropped (the tier runs as root); optional
`[...]` parts are run, except the flags plan.LEFT_OUT names. Each example
must exit 0 (or a status it documents, plan.STATUSES), show what its text says it shows
(plan.OUTPUT; the demo's table as README.md shows it, plan.TABLES; an output block a page shows
after it, by its shape: readme_examples.output_problems) and write the files it names
(plan.FILES); each real sweep or playbook run must
record every run `ok`, and a run that follows a schedule must have landed a change during the run.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netbench.cli.app import main
from tests import readme_examples as rx
from tests.conftest import ROOT, netbench_processes
from tests.readme import plan

EXAMPLES = rx.docs_examples(ROOT) + list(rx.walk_help(main))
BLOCKS = rx.blocks(EXAMPLES)
TIMEOUT_S = 300


heading = rx.block_title  # "docs/getting-started.md:37 A tour of the CLI" -> "A tour of the CLI"


def prelude(block: str) -> list[str]:
    title = heading(block)
    return [command for key, commands in plan.PRELUDE.items()
            if title == key or title.startswith(key + ":") for command in commands]


# where each command is first shown: a training command shown again (the README's quick start in
# the tutorial, a help text's example in a guide) trains once, there, and is not run again: a
# dry run would add nothing, and one with --output is refused the folder the first run wrote
FIRST_SHOWN = {}
for _example in EXAMPLES:
    FIRST_SHOWN.setdefault(_example.command, _example.source)


def steps(example: rx.Example) -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(what is shown, what runs, the output shown after it) for one example: nothing when it
    is not runnable here; None runs nothing (a training command shown again: only the output
    shown after it is compared with what it printed where it trained)."""
    shown = example.command
    if shown in plan.NOT_RUNNABLE:
        return []
    if rx.is_training(shown) and FIRST_SHOWN[shown] != example.source:
        return [(shown, None, example.output)] if example.output else []
    command = rx.expand(rx.dry_run(shown) if shown in plan.DRY else shown, plan.PLACEHOLDERS, plan.LEFT_OUT)
    return [(shown, rx.shorten(command), example.output)]


# what each example printed where it ran as shown (shortened), by the command shown: an output a
# page shows after a training command that runs as a --dry-run there (it trained where it was
# first shown) is compared with what it printed then
PRINTED: dict[str, str] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> tuple[Path, dict]:
    """A working folder with profiles/, playbooks/, examples/ and bench/, and a PATH whose `netbench` is this checkout."""
    work = tmp_path_factory.mktemp("readme")
    for name in ("profiles", "playbooks", "examples", "bench"):
        (work / name).symlink_to(ROOT / name)
    bin_dir = work / ".bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "netbench"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m netbench.cli "$@"\n')
    wrapper.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return work, env


def run(command: str, work: Path, env: dict, shown: str = "") -> subprocess.CompletedProcess:
    """`command` in `work`; an example plan.PREDICT names runs with the step model on (the suite
    turns it off)."""
    extra = {"NETBENCH_PREDICT": "1"} if shown in plan.PREDICT else {}
    return subprocess.run(["bash", "-c", command], cwd=work, env={**os.environ, **env, **extra}, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def results_folders(work: Path) -> set[Path]:
    """Every results folder: results/*, and a campaign's shard folders (results/*/shard-*)."""
    if not (work / "results").is_dir():
        return set()
    return set((work / "results").glob("*")) | set((work / "results").glob("*/shard-*"))


def schedule_problems(folder: Path) -> list[str]:
    """A run that followed a schedule must have made a change during the run (after time 0, from
    the schedule's own thread), not only started on the schedule's first step."""
    problems = []
    for path in sorted((folder / "runs").glob("*.json")):
        section = json.loads(path.read_text()).get("schedule")
        if not section:
            continue
        if section.get("error") is not None:
            problems.append(f"{path.name}: schedule error {section['error']}")
        if not any(change["scheduled_s"] > 0 for change in section.get("changes", [])):
            problems.append(f"{path.name}: no change of schedule {section.get('name')} landed during the run")
    return problems


def check_example(shown: str, command: str, result: subprocess.CompletedProcess, work: Path,
                  new_results: set[Path], shown_output: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with one example's run (nothing: it kept its word)."""
    output = result.stdout + result.stderr
    as_shown = command == rx.shorten(rx.expand(shown, plan.PLACEHOLDERS, plan.LEFT_OUT))
    if as_shown:
        PRINTED[shown] = output
    statuses = next((codes for prefix, (codes, _) in plan.STATUSES.items()
                     if shown == prefix or shown.startswith(prefix + " ")), {0})
    problems = []
    if result.returncode not in statuses:
        problems.append(f"exit status {result.returncode}, expected {sorted(statuses)}")
    for pattern in plan.OUTPUT.get(shown, []) if command == rx.shorten(shown) else []:
        if not re.search(pattern, output):
            problems.append(f"output lacks /{pattern}/")
    if shown in plan.TABLES and command == rx.shorten(shown):
        path, words, leading = plan.TABLES[shown]
        problems += rx.table_problems(rx.shown_output((ROOT / path).read_text(), words), output, leading)
    if shown_output:
        printed = output if as_shown else PRINTED.get(shown)
        if printed is None:
            problems.append("the page shows its output, but it runs as a --dry-run here and nowhere as shown")
        else:
            problems += [f"output shown after it: {p}" for p in rx.output_problems(shown_output, printed)]
    for name in plan.FILES.get(shown, []):
        if not (work / name).is_file():
            problems.append(f"{name} was not written")
    if rx.is_training(command):
        if not new_results:
            problems.append("no results folder was written")
        for folder in sorted(new_results):
            if (folder / "campaign.json").is_file():  # a campaign: each shard's folder is checked as one
                continue
            if not (folder / "results.csv").is_file():
                problems.append(f"{folder.name}/results.csv was not written")
                continue
            rows = list(csv.DictReader(open(folder / "results.csv", newline="")))
            bad = [(row.get("run"), row.get("status"), row.get("error", "")[:300]) for row in rows
                   if row.get("status") != "ok"]
            if not rows or bad:
                problems.append(f"{folder.name}/results.csv: {len(rows)} runs, not ok: {bad}")
            problems += [f"{folder.name}: {problem}" for problem in schedule_problems(folder)]
    if problems:
        problems = [f"`{command}` (shown as `{shown}`): {p}" for p in problems]
        problems.append("output ends: " + output[-3000:])
    return problems


def runnable(block: str) -> bool:
    return any(steps(example) for example in BLOCKS[block])


def shown_before(block: str) -> bool:
    """The block's commands are exactly an earlier block's (Getting started repeats the README's
    quick start): it ran there, and would only find that block's results folders here."""
    commands = [example.command for example in BLOCKS[block]]
    earlier = list(BLOCKS)[:list(BLOCKS).index(block)]
    return any([example.command for example in BLOCKS[other]] == commands for other in earlier)


# a block none of whose examples runs here is left out (tests/unit/test_readme_examples.py checks
# that each is listed in plan.NOT_RUNNABLE with its reason), and so is a block shown twice
@pytest.mark.parametrize("block", [block for block in BLOCKS if runnable(block) and not shown_before(block)],
                         ids=heading)
def test_block_of_examples_runs(block: str, clean_machine, workdir):
    work, env = workdir
    todo = [(shown, shown, ()) for shown in prelude(block)]
    todo += [step for example in BLOCKS[block] for step in steps(example)]
    problems: list[str] = []
    try:
        for shown, command, shown_output in todo:
            if command is None:  # trained where it was first shown: its shown output against that run's
                printed = PRINTED.get(shown)
                problems = (["the page shows its output, but it trained in an earlier block that did not run"]
                            if printed is None else
                            [f"`{shown}`: output shown after it: {p}" for p in rx.output_problems(shown_output, printed)])
                if problems:
                    break
                continue
            before = results_folders(work)
            started = time.monotonic()
            result = run(command, work, env, shown)
            took = time.monotonic() - started
            print(f"{took:6.1f} s  rc {result.returncode}  {command}")
            problems = check_example(shown, command, result, work, results_folders(work) - before, shown_output)
            if problems:
                break  # the block's later examples need this one's state
    finally:
        reset = run("netbench reset", work, env)
    assert not problems, "\n".join(problems)
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert netbench_processes() == []  # no engine or worker outlived its block
