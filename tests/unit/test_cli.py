"""The click command line: help text, error messages and exit codes, dry runs.

Nothing here needs root: os.geteuid is faked to a normal user, so a command that would
change the network stops with exit code 3 instead of touching it.
"""

from __future__ import annotations

import os

import click
import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.cli import common
from netbench.cli.types import Seconds
from netbench.emulation import backends
from netbench.model.profile import Profile
from netbench.model import topology
from tests.unit.rootless_fakes import no_userns


def _touches_the_testbed(*args, **kwargs):
    raise AssertionError("a CLI test reached the real testbed")


@pytest.fixture(autouse=True)
def not_root(monkeypatch, tmp_path):
    from netbench.testbed import netns as local

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    no_userns(monkeypatch)  # a host where a user gets no testbed: commands stop at the privilege check
    for name in ("discover", "up", "down"):  # belt and braces: never reach the real network
        monkeypatch.setattr(local, name, _touches_the_testbed)
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)


def invoke(*args):
    return CliRunner().invoke(cli.main, list(args))


def walk(command, path=("netbench",)):
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):  # the top group loads its commands on demand
            yield from walk(command.get_command(ctx, name), (*path, name))


ALL = list(walk(cli.main))


def test_tree_has_the_expected_commands():
    names = {" ".join(path) for path, _ in ALL}
    assert {"netbench profile check", "netbench testbed up", "netbench testbed down", "netbench testbed show",
            "netbench apply", "netbench show", "netbench reset", "netbench sweep", "netbench exec"} <= names


def test_every_command_and_group_has_help():
    missing = [" ".join(path) for path, command in ALL if not (command.help or "").strip()]
    assert missing == []


def test_every_option_has_help():
    missing = [f"{' '.join(path)} {param.opts[0]}" for path, command in ALL for param in command.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert missing == []


@pytest.mark.parametrize("path", [path for path, _ in ALL], ids=[" ".join(path) for path, _ in ALL])
def test_help_runs(path):
    command = dict(ALL)[path]
    result = invoke(*path[1:], "--help")
    assert result.exit_code == 0, result.output
    assert command.help.strip().splitlines()[0].strip()[:30] in " ".join(result.output.split())


# ---------------------------------------------------------------- profile check


GOOD = "name: wan\ndelay: 10ms\njitter: 1ms\nrate: 250mbit\nloss: 0%\n"


def test_profile_check_good(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_text("delay: 100us\n")
    result = invoke("profile", "check", "a.yaml", "b.yaml")
    assert result.exit_code == 0, result.output
    assert "ok a.yaml: wan: delay 10ms, jitter 1ms, loss 0%, rate 250mbit" in result.stdout
    assert "ok b.yaml: b: delay 100us" in result.stdout
    assert result.stderr == ""


def expected_error(path):
    """The ProfileError that loading `path` raises, as the library words it."""
    from netbench.errors import ProfileError
    from netbench.model.profile import load_profile

    with pytest.raises(ProfileError) as info:
        load_profile(path)
    return info.value


@pytest.mark.parametrize("text, key", [
    ("dealy: 10ms\n", "dealy"), ("delay: 10xs\n", "delay"), ("loss: 120%\n", "loss"),
    ("rate: 0mbit\n", "rate"), ("delay: 20s\n", "delay"), ("loss: 2\n", "loss"),
])
def test_profile_check_bad_is_one_line(tmp_path, text, key):
    (tmp_path / "bad.yaml").write_text(text)
    result = invoke("profile", "check", "bad.yaml")
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)  # handled: no traceback
    assert "Traceback" not in result.output
    error = expected_error("bad.yaml")
    assert error.message.startswith(f"bad.yaml: {key}: ")
    assert result.stderr.splitlines() == [f"error: {error.message}", f"hint: {error.hint}"]
    assert result.stdout == ""


@pytest.mark.parametrize("text", ["", "- 1\n", "delay: [1\n"])
def test_profile_check_bad_document(tmp_path, text):
    (tmp_path / "bad.yaml").write_text(text)
    result = invoke("profile", "check", "bad.yaml")
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.splitlines()[0].startswith("error: bad.yaml: ")


def test_profile_check_stops_at_the_first_bad_file(tmp_path):
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "bad.yaml").write_text("dealy: 1ms\n")
    result = invoke("profile", "check", "good.yaml", "bad.yaml")
    assert result.exit_code == 2
    assert "ok good.yaml" in result.stdout
    assert "bad.yaml: dealy" in result.stderr


def test_profile_check_missing_file():
    result = invoke("profile", "check", "nope.yaml")
    assert result.exit_code == 2
    assert "nope.yaml: no such profile file" in result.stderr


def long_path(tmp_path):
    folder = tmp_path
    for i in range(8):
        folder = folder / f"a-long-directory-name-to-make-the-path-exceed-any-terminal-width-{i}"
    folder.mkdir(parents=True)
    return folder / "bad.yaml"


def test_profile_check_error_is_not_wrapped(tmp_path):
    path = long_path(tmp_path)  # longer than any terminal is wide
    path.write_text("dealy: 10ms\n")
    result = invoke("profile", "check", str(path))
    assert result.exit_code == 2
    error = expected_error(path)
    assert result.stderr.splitlines() == [f"error: {error.message}", f"hint: {error.hint}"]


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize("args, flag", [
    (("apply", "--latency", "10xs"), "--latency"),
    (("apply", "--bandwidth", "fast"), "--bandwidth"),
    (("apply", "--loss", "2"), "--loss"),
    (("sweep", "--dry-run", "--latency", "1,abc"), "--latency"),
    (("sweep", "--dry-run", "--latency", "1ms,,2ms"), "--latency"),
    (("sweep", "--dry-run", "--bandwidth", "0mbit"), "--bandwidth"),
    (("sweep", "--dry-run", "--loss", "0,120%"), "--loss"),
    (("sweep", "--dry-run", "--latency", "1,20s"), "--latency"),
])
def test_bad_flag_is_named(args, flag):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(f"error: flag {flag}: "), result.stderr
    assert "Traceback" not in result.output


def test_apply_without_anything_is_a_usage_error():
    result = invoke("apply")
    assert result.exit_code == 2
    assert "nothing to apply" in result.stderr


def test_apply_needs_root():
    # parsing is fine, so it gets as far as the root check and stops there (geteuid is faked)
    result = invoke("apply", "--latency", "10ms", "--dry-run")
    assert result.exit_code == 3
    assert "needs root" in result.stderr


def test_overflowing_flag_is_a_usage_error():
    result = invoke("sweep", "--dry-run", "--latency", "1e400ms")
    assert result.exit_code == 2
    assert "--latency" in result.stderr


# ---------------------------------------------------------------- sweep --dry-run


def run_lines(stdout):
    return [line for line in stdout.splitlines() if line[:1] == "r" and line[1:4].isdigit()]


def test_sweep_dry_run_lists_runs_and_changes():
    result = invoke("sweep", "--dry-run", "--latency", "1,10,100ms")
    assert result.exit_code == 0, result.output
    assert [line.split() for line in run_lines(result.stdout)] == [
        ["r000", "d1ms", "repeat", "0"], ["r001", "d10ms", "repeat", "0"], ["r002", "d100ms", "repeat", "0"]]
    topo = topology.plan_topology(2, topology.choose_subnet([]))
    for index, delay in enumerate((1_000, 10_000, 100_000)):
        for change in backends.plan_apply(Profile(delay_us=delay), topo, "userspace", seed=100 * index):
            assert "    " + change.describe() in result.stdout.splitlines()
    assert "start delay engine on NFQUEUE 1: delay 100ms" in result.stdout
    assert not (os.path.exists("results"))  # a dry run writes nothing


def test_sweep_dry_run_grid_and_repeat():
    result = invoke("sweep", "--dry-run", "--latency", "1,10ms", "--bandwidth", "250,500mbit", "--repeat", "2",
                    "--backend", "netem", "--workers", "3")
    assert result.exit_code == 0, result.output
    runs = [line.split() for line in run_lines(result.stdout)]
    assert [r[1] for r in runs] == ["d1ms-r250mbit"] * 2 + ["d1ms-r500mbit"] * 2 + \
        ["d10ms-r250mbit"] * 2 + ["d10ms-r500mbit"] * 2
    assert [r[3] for r in runs] == ["0", "1"] * 4
    netem_lines = [line for line in result.stdout.splitlines() if "netem limit" in line]
    assert len(netem_lines) == 8 * 3
    assert "-j NFQUEUE" not in result.stdout and "start delay engine" not in result.stdout


def test_sweep_dry_run_with_profile(tmp_path):
    (tmp_path / "wan.yaml").write_text(GOOD)
    result = invoke("sweep", "--dry-run", "--profile", "wan.yaml", "--loss", "0,1%")
    assert result.exit_code == 0, result.output
    assert [line.split()[1] for line in run_lines(result.stdout)] == \
        ["d10ms-j1ms-r250mbit", "d10ms-j1ms-r250mbit-l1%"]


def test_sweep_with_bad_profile_names_the_file(tmp_path):
    (tmp_path / "p.yaml").write_text("dealy: 1ms\n")
    result = invoke("sweep", "--dry-run", "--profile", "p.yaml")
    assert result.exit_code == 2
    assert "p.yaml: dealy: unknown key" in result.stderr


def test_version():
    from netbench import __version__

    result = invoke("--version")
    assert result.exit_code == 0
    assert __version__ in result.output


# ---------------------------------------------------------------- numbers outside what the workers take


@pytest.mark.parametrize("seed", ["-1", "4294967296", str(10**30)])
def test_sweep_seed_outside_32_bits_is_refused(seed):
    # numpy (keras.utils.set_random_seed) takes 0..2**32-1: a larger seed crashed every worker
    result = invoke("sweep", "--dry-run", "--latency", "1ms", "--seed", seed)
    assert result.exit_code == 2, result.output
    assert "--seed" in result.stderr and "Traceback" not in result.output


def test_sweep_seed_at_32_bits_is_accepted():
    result = invoke("sweep", "--dry-run", "--latency", "1ms", "--seed", str(2**32 - 1))
    assert result.exit_code == 0, result.output


FLOAT_OPTIONS = [(path, param.opts[0]) for path, command in ALL for param in command.params
                 if isinstance(param, click.Option) and isinstance(param.type, (click.types.FloatParamType, Seconds))]
SECONDS_OPTIONS = [(path, param.opts[0]) for path, command in ALL for param in command.params
                   if isinstance(param, click.Option) and isinstance(param.type, Seconds)]


def test_there_are_float_options_to_check():
    assert {("netbench sweep", "--step-timeout"), ("netbench apply", "--lease"), ("netbench node apply", "--lease"),
            ("netbench report", "--level")} <= {(" ".join(path), opt) for path, opt in FLOAT_OPTIONS}
    assert {("netbench sweep", "--step-timeout"), ("netbench sweep", "--seconds"), ("netbench collective", "--timeout"),
            ("netbench verify", "--interval")} <= {(" ".join(path), opt) for path, opt in SECONDS_OPTIONS}


@pytest.mark.parametrize("path, option", SECONDS_OPTIONS, ids=[f"{' '.join(p[1:])} {o}" for p, o in SECONDS_OPTIONS])
@pytest.mark.parametrize("value, seconds", [("5", 5.0), ("5s", 5.0), ("5000ms", 5.0), ("0.5", 0.5)])
def test_every_seconds_option_takes_bare_seconds_and_a_unit(path, option, value, seconds):
    """A duration flag that took bare seconds keeps taking them, and takes a unit too."""
    param = next(p for p in dict(ALL)[path].params if option in p.opts)
    low, high = param.type.low, param.type.high
    if low <= seconds <= high:
        assert param.type.convert(value, param, None) == pytest.approx(seconds)
    else:
        with pytest.raises(click.BadParameter, match="outside"):
            param.type.convert(value, param, None)
    with pytest.raises(click.BadParameter, match="unknown duration unit"):
        param.type.convert("5 parsecs".replace(" ", ""), param, None)


@pytest.mark.parametrize("path, option", FLOAT_OPTIONS, ids=[f"{' '.join(p[1:])} {o}" for p, o in FLOAT_OPTIONS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_every_float_option_refuses_nan_and_infinity(path, option, value):
    # nan passes every comparison of click.FloatRange: '--step-timeout nan' never timed out
    result = invoke(*path[1:], f"{option}={value}")
    assert result.exit_code == 2, result.output
    assert f"'{option}'" in result.output and "finite" in result.output, result.output


# ---------------------------------------------------------------- user and worker text is not rich markup


def test_profile_check_prints_a_name_with_brackets_as_written(tmp_path):
    (tmp_path / "a.yaml").write_text("name: '[/]'\ndelay: 1ms\n")
    (tmp_path / "[red]b.yaml").write_text("name: '[bold]x[/bold]'\ndelay: 1ms\n")
    result = invoke("profile", "check", "a.yaml", "[red]b.yaml")
    assert result.exit_code == 0, result.output
    assert "ok a.yaml: [/]: delay 1ms" in result.stdout
    assert "ok [red]b.yaml: [bold]x[/bold]: delay 1ms" in result.stdout


def test_sweep_view_prints_worker_errors_and_names_as_written(monkeypatch, tmp_path):
    import io

    from rich.console import Console

    from netbench import console
    from netbench.cli import render as ui
    from netbench.model.job import JobSpec
    from netbench.model.run import Run
    from netbench.experiment.store import RunResult
    from netbench.experiment.runner import SweepConfig

    out = io.StringIO()
    monkeypatch.setattr(console, "out", Console(file=out, width=300, highlight=False, soft_wrap=True))
    profile = Profile(name="[/]", delay_us=1000)
    run = Run(index=0, profile=profile, repeat=0, job=JobSpec(), workers=2)
    config = SweepConfig(sweep_id="s", runs=(run,), job=JobSpec(), workers=2, output=tmp_path / "[/out]")
    error = "worker1 exited with 1: OSError: [/usr/lib/x] [/] not found"
    result = RunResult(run_id="r000", profile=profile.to_record(), backend="netem", strategy="allreduce",
                       model="mlp", batch_size=64, workers=2, repeat=0, warmup_steps=1, status="failed", error=error)
    with ui.SweepView(config) as view:
        view.run_started(run)
        view.run_finished(run, result)
        view.note("r000: verify RTT 1.00 ms (configured 2.00 ms) [out of tolerance]")
    view.summary([result])
    text = out.getvalue()
    assert error in text and "[/]" in text and "[out of tolerance]" in text and "[/out]" in text


# ---------------------------------------------------------------- a sweep's results folder


def test_sweep_refuses_a_folder_that_holds_results(tmp_path):
    (tmp_path / "out" / "runs").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "r000.json").write_text("{}")
    for args in (("--dry-run",), ()):  # the real run stops here too, before the root check (exit 3)
        result = invoke("sweep", *args, "--latency", "1ms", "--output", "out")
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: flag --output: out: already holds results"), result.stderr
        assert "--append" in result.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["runs"]


def test_sweep_append_numbers_its_runs_after_those_in_the_folder(tmp_path):
    (tmp_path / "out" / "runs").mkdir(parents=True)
    for run_id in ("r000", "r001"):
        (tmp_path / "out" / "runs" / f"{run_id}.json").write_text("{}")
    result = invoke("sweep", "--dry-run", "--latency", "1,2ms", "--output", "out", "--append")
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in run_lines(result.stdout)] == ["r002", "r003"]


def test_sweep_into_an_empty_folder_is_fine(tmp_path):
    (tmp_path / "out").mkdir()
    result = invoke("sweep", "--dry-run", "--latency", "1ms", "--output", "out")
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in run_lines(result.stdout)] == ["r000"]


def as_root_without_sandboxes(monkeypatch):
    """root's reset of its default testbed (this test's state folder), with no sandbox beside it."""
    from netbench.cli import emulation

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulation, "_reset_sandboxes", lambda include_default: [])


def test_reset_refuses_while_another_command_holds_the_lock(tmp_path, monkeypatch):
    """A reset beside a running sweep or apply would undo changes it is still making."""
    from netbench.state import reset as reset_module
    from netbench.state.journal import Lock

    calls = []
    as_root_without_sandboxes(monkeypatch)
    monkeypatch.setattr(reset_module, "reset", lambda journal, **kwargs: calls.append(journal) or [])
    with Lock(tmp_path / "state"):
        result = invoke("reset")
    assert result.exit_code == 1
    assert "another netbench command" in result.stderr
    assert calls == []
    assert invoke("reset").exit_code == 0 and len(calls) == 1  # once the holder is gone


def test_reset_prints_warnings_on_stderr(monkeypatch):
    from netbench.state import reset as reset_module

    def reset_with_a_warning(journal, warn, all_namespaces=False):
        warn("journal line 3: not valid JSON; skipped")
        return []

    as_root_without_sandboxes(monkeypatch)
    monkeypatch.setattr(reset_module, "reset", reset_with_a_warning)
    result = invoke("reset")
    assert result.exit_code == 0
    assert "warning: journal line 3: not valid JSON; skipped" in result.stderr
    assert "nothing to remove" in result.stdout


def test_node_is_left_out_of_the_top_level_help_and_still_answers():
    """`netbench node` is what the controller runs on a host over SSH: not listed by
    `netbench --help`, but its own --help and commands work (and the CLI reference lists it)."""
    listed = invoke("--help").output
    assert "provision" in listed and not any(line.split()[:1] == ["node"] for line in listed.splitlines())
    result = invoke("node", "--help")
    assert result.exit_code == 0 and "apply" in result.output


def test_torch_missing_names_the_cpu_build(monkeypatch):
    import importlib.util

    from netbench.cli.framework import require_framework
    from netbench.errors import UsageError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(UsageError) as info:
        require_framework("torch")
    assert "torch==2.13.0+cpu" in info.value.hint and "CPU build" in info.value.hint
