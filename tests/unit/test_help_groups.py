"""--help in sections (cli/groups.py): every option of the commands with many options is placed in
a section, the sections come in GROUPS' order, the typed option sets reach the command whole, and a
usage error is still click's one "Error: ..." line naming the flag."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from netbench.cli import groups
from netbench.cli.app import main
from netbench.cli.groups import GROUPS, GroupedCommand, option_set, options
from tests.conftest import ROOT

GROUPED = ("sweep", "run", "collective", "apply")


def command(name: str) -> click.Command:
    return main.get_command(click.Context(main), name)


def unplaced(cmd: click.Command) -> list[str]:
    """The options of `cmd` that no declaration placed in a help section."""
    return [param.opts[0] for param in cmd.params
            if isinstance(param, click.Option) and groups.help_group(param) not in GROUPS]


@pytest.mark.parametrize("name", GROUPED)
def test_every_option_is_in_a_help_group(name):
    cmd = command(name)
    assert isinstance(cmd, GroupedCommand)
    assert unplaced(cmd) == [], f"place each new flag of {name} in a section: groups.options(GROUP, ...)"


def test_an_option_no_declaration_placed_is_found_and_shown_under_other():
    @click.command(cls=GroupedCommand)
    @options("Network", click.option("--latency", help="Delay."))
    @click.option("--stray", help="Placed nowhere.")
    def cmd(latency, stray):
        """A command."""

    assert unplaced(cmd) == ["--stray"]
    text = CliRunner().invoke(cmd, ["--help"]).output
    assert text.index("Network:") < text.index("--latency") < text.index("Other:") < text.index("--stray")


def test_options_refuses_a_group_that_is_not_a_section():
    with pytest.raises(ValueError, match="Networking"):
        options("Networking", click.option("--latency"))


@pytest.mark.parametrize("name", ["sweep", "run", "collective"])
def test_help_shows_the_sections_in_order_and_every_flag_once(name):
    cmd = command(name)
    text = CliRunner().invoke(main, [name, "--help"], terminal_width=100).output
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and line[:-1] in GROUPS]
    assert headings == [group for group in GROUPS if group in headings] and headings[0] == "Network"
    assert "Options:" not in text
    options_part = text[text.index("\nNetwork:\n"):]  # the description may start a line with a flag
    rows = [line.split()[0].rstrip(",") for line in options_part.splitlines() if line.startswith("  -")]
    flags = [param.opts[0] for param in cmd.get_params(click.Context(cmd))
             if isinstance(param, click.Option) and not param.hidden]  # an old spelling kept is hidden
    assert sorted(rows) == sorted(flag if flag != "--help" else "-h" for flag in flags)


def test_the_sweeps_common_sections_come_first():
    text = CliRunner().invoke(main, ["sweep", "--help"]).output
    order = [text.index(f"\n{group}:\n") for group in ("Network", "Nodes and compute", "Job",
                                                        "Measurement and precision", "Remote hosts", "Other")]
    assert order == sorted(order)
    rows = [line.split()[0] for line in text[text.index("\nNetwork:\n"):].splitlines() if line.startswith("  --")]
    assert rows.index("--latency") < rows.index("--workers") < rows.index("--strategy") < rows.index("--staleness")


@pytest.mark.parametrize("name", ["sweep", "run"])
def test_the_help_texts_of_every_section_line_up(name):
    text = CliRunner().invoke(main, [name, "--help"]).output
    starts = {match.start(2) for line in text[text.index("\nNetwork:\n"):].splitlines()
              if (match := re.match(r"  (-\S.*?)\s{2,}(\S)", line))}
    assert len(starts) == 1, starts


@pytest.mark.parametrize("args, flag", [
    (["sweep", "--workers", "0"], "--workers"),
    (["sweep", "--strategy", "nope"], "--strategy"),
    (["sweep", "--bogus"], "--bogus"),
    (["sweep", "--latency", "1ms", "--staleness", "5"], "--staleness"),
    (["run", "playbooks/smoke.yaml", "--order", "sideways"], "--order"),
    (["collective", "--workers", "1"], "--workers"),
    (["collective", "--reps", "x"], "--reps"),
    (["apply", "--scale", "0"], "--scale"),
    # a duration whose value was left out: it said "duration must not be negative, got '--output'"
    (["sweep", "--sample-resources", "--output", "x"], "--sample-resources': takes a duration (e.g. 0.5s), got the flag '--output'"),
])
def test_a_usage_error_is_one_error_line_naming_the_flag(args, flag):
    result = CliRunner().invoke(main, args)
    lines = result.output.splitlines()
    assert result.exit_code == 2
    errors = [line for line in lines if "Error" in line or "error" in line]
    assert len(errors) == 1 and errors[0].startswith("Error: ") and flag in errors[0], result.output
    assert lines[0].startswith("Usage: ") and len(lines) == 4, result.output  # usage, try, blank, error
    assert not set("╭╮╰╯│─") & set(result.output)  # no boxes


def test_a_usage_error_in_a_real_process_is_one_line_on_stderr():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    result = subprocess.run([sys.executable, "-m", "netbench.cli", "sweep", "--repeat", "0"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: Invalid value for '--repeat': 0 is not in the range 1<=x<=1000."], result.stderr
    assert len(result.stderr.splitlines()) == 4


@dataclass(frozen=True)
class Pair:
    low: int
    high: int


def test_an_option_set_hands_the_command_one_typed_value():
    seen = []

    @click.command(cls=GroupedCommand)
    @option_set(Pair, "pair", "Job", click.option("--low", default=1, type=int), click.option("--high", type=int))
    def cmd(pair):
        """A command."""
        seen.append(pair)

    assert CliRunner().invoke(cmd, ["--high", "5"]).exit_code == 0
    assert seen == [Pair(low=1, high=5)]


def test_an_option_set_refuses_a_field_without_its_flag():
    with pytest.raises(TypeError, match="high"):
        @option_set(Pair, "pair", "Job", click.option("--low", type=int))
        def cmd(pair):
            """A command."""


def test_a_shared_concern_reads_the_same_in_every_command_that_takes_it():
    from netbench.cli import option_sets

    shared = {"Launch": ("sweep", "run"), "Metrics": ("sweep", "run"), "Probes": ("sweep", "run"),
              "Hosts": ("sweep", "run", "collective"), "Levels": ("sweep", "collective")}
    for name, names in shared.items():
        flags = {field.name for field in option_sets.__dict__[name].__dataclass_fields__.values()}
        records = []
        for cmd in map(command, names):
            ctx = click.Context(cmd)
            records.append([(p.get_help_record(ctx), groups.help_group(p)) for p in cmd.params if p.name in flags])
        assert len(records[0]) == len(flags) and all(r == records[0] for r in records), name
