"""Odd and hostile input on the command line, in playbooks, profiles, schedules, traces,
topologies and results folders: each is refused in one line naming the flag (or the file and
key), with a non-zero exit, no traceback and nothing applied, within seconds; a dry run refuses
what the run would refuse (every case here runs as --dry-run, which plans but applies nothing)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.cli import common

SWEEP = ("sweep", "--dry-run", "--latency", "1ms")
ALGO = ("sweep", "--dry-run", "--latency", "1ms", "--strategy")

PLAYBOOK_HEAD = "name: odd\nfixed: {model: mlp, batch: 32, workers: 2}\nsteps: 5\nwarmup: 1\n"


def _case(case_id, argv, fragment, files=None):
    return pytest.param(argv, fragment, files or {}, id=case_id)


# (argv, what the error line must name, files to write first); "{dir}" is the test's folder
FLAG_CASES = [
    # ---- unit traps: spellings two conventions read differently, with both readings
    _case("loss-bare-half", (*SWEEP, "--loss", "0.5"), ["--loss", "0.5%", "50%"]),
    _case("loss-bare-one", (*SWEEP, "--loss", "1"), ["--loss", "1%", "100%"]),
    _case("loss-bare-ten", (*SWEEP, "--loss", "10"), ["--loss", "10%"]),
    _case("loss-bare-list", (*SWEEP, "--loss", "0,0.1,0.5"), ["--loss", "0.1%", "10%"]),
    _case("bandwidth-mbps", (*SWEEP, "--bandwidth", "100mbps"), ["--bandwidth", "100mbit", "800mbit"]),
    _case("bandwidth-MBps", (*SWEEP, "--bandwidth", "100MBps"), ["--bandwidth", "100mbit", "800mbit"]),
    _case("bandwidth-gbps", (*SWEEP, "--bandwidth", "1gbps"), ["--bandwidth", "1gbit", "8gbit"]),
    _case("bandwidth-kbps-list", (*SWEEP, "--bandwidth", "64,128kbps"), ["--bandwidth", "64kbit", "512kbit"]),
    _case("bandwidth-MB/s", (*SWEEP, "--bandwidth", "10MB/s"), ["--bandwidth", "10mbit", "80mbit"]),
    _case("latency-bare", ("sweep", "--dry-run", "--latency", "10"), ["--latency", "10us", "10ms"]),
    _case("jitter-bare", (*SWEEP, "--jitter", "1"), ["--jitter", "1us", "1ms"]),
    _case("apply-loss-bare", ("apply", "--dry-run", "--loss", "0.5"), ["--loss", "0.5%", "50%"]),
    _case("apply-bandwidth-mbps", ("apply", "--dry-run", "--bandwidth", "100mbps"), ["--bandwidth", "800mbit"]),
    _case("collective-loss-bare", ("collective", "--loss", "0.01"), ["--loss", "0.01%", "1%"]),
    _case("collective-bandwidth-gbps", ("collective", "--bandwidth", "1gbps"), ["--bandwidth", "8gbit"]),
    _case("settle-bare", (*SWEEP, "--settle", "2"), ["--settle", "2ms", "2s"]),
    _case("step-timeout-unit", (*SWEEP, "--step-timeout", "10 parsecs"), ["--step-timeout"]),
    _case("step-timeout-nan", (*SWEEP, "--step-timeout", "nan"), ["--step-timeout"]),
    _case("seconds-negative", (*SWEEP, "--seconds", "-5"), ["--seconds"]),
    _case("max-seconds-inf", (*SWEEP, "--max-seconds", "inf"), ["--max-seconds"]),
    # ---- the user's command and --step-regex
    _case("step-regex-invalid", (*SWEEP, "--images-per-step", "64", "--step-regex", "step (?P<step>\\d+", "--", "true"), ["--step-regex"]),
    _case("step-regex-unbalanced", (*SWEEP, "--images-per-step", "64", "--step-regex", "((", "--", "true"), ["--step-regex"]),
    _case("step-regex-no-command", (*SWEEP, "--step-regex", "step (?P<step>\\d+)"), ["--step-regex"]),
    _case("step-regex-two-times", (*SWEEP, "--images-per-step", "64", "--step-regex",
                                   "(?P<seconds>[\\d.]+) (?P<ms>[\\d.]+)", "--", "true"), ["--step-regex"]),
    _case("step-regex-no-images", (*SWEEP, "--step-regex", "step (?P<step>\\d+)", "--", "true"), ["--step-regex"]),
    _case("step-regex-huge", (*SWEEP, "--images-per-step", "64", "--step-regex", "a" * 100_000, "--", "true"), ["--step-regex"]),
    _case("command-empty", (*SWEEP, "--", ""), ["command"]),
    _case("command-blank", (*SWEEP, "--", "  "), ["command"]),
    _case("images-per-step-zero", (*SWEEP, "--images-per-step", "0", "--", "true"), ["--images-per-step"]),
    _case("images-per-step-no-command", (*SWEEP, "--images-per-step", "64"), ["--images-per-step"]),
    _case("command-nul", (*SWEEP, "--", "python\0x"), ["command"]),
    # ---- the algorithms' settings: NaN, infinity, negative and out of range in every float flag
    *[_case(f"elastic-alpha-{v}", (*ALGO, "easgd", "--elastic-alpha", v), ["--elastic-alpha"])
      for v in ("nan", "inf", "-0.5", "0", "1.5", "-inf", "1e999")],
    *[_case(f"gossip-p-{v}", (*ALGO, "gosgd", "--gossip-p", v), ["--gossip-p"])
      for v in ("nan", "inf", "-0.1", "1.5", "NaN")],
    *[_case(f"target-accuracy-{v}", (*SWEEP, "--train-steps", "20", "--target-accuracy", v), ["--target-accuracy"])
      for v in ("nan", "0", "1.5", "-1")],
    *[_case(f"staleness-{v}", (*ALGO, "ps-ssp", "--staleness", v), ["--staleness"]) for v in ("-1", "nan", "1.5", "1e9")],
    *[_case(f"tau-{v}", (*ALGO, "easgd", "--tau", v), ["--tau"]) for v in ("0", "-3", "nan")],
    _case("staleness-wrong-strategy", (*ALGO, "allreduce", "--staleness", "5"), ["--staleness"]),
    _case("tau-wrong-strategy", (*ALGO, "ps-ssp", "--tau", "8"), ["--tau"]),
    _case("elastic-alpha-wrong-strategy", (*ALGO, "gosgd", "--elastic-alpha", "0.5"), ["--elastic-alpha"]),
    _case("gossip-p-wrong-strategy", (*ALGO, "easgd", "--gossip-p", "0.5"), ["--gossip-p"]),
    _case("target-accuracy-without-train-steps", (*SWEEP, "--target-accuracy", "0.5"), ["--target-accuracy"]),
    _case("seconds-and-train-steps", (*SWEEP, "--seconds", "10", "--train-steps", "50"), ["--seconds"]),
    _case("train-steps-under-warmup", (*SWEEP, "--train-steps", "5", "--warmup", "10"), ["--train-steps"]),
    *[_case(f"input-shape-{v}", (*SWEEP, "--input-shape", v), ["--input-shape"])
      for v in ("100000x100000x3", "0x0x3", "1x2x3x4x5", "nan", "32x32x3x")],
    # ---- --precision
    *[_case(f"precision-{v}", (*SWEEP, "--precision", v), ["--precision"])
      for v in ("0", "0%", "-1%", "nan", "NaN%", "200%", "50%", "0.02", "inf", "2 %%", "two")],
    # ---- --framework with what it does not support
    _case("torch-exchange", (*ALGO, "ps-async", "--framework", "torch"), ["--framework"]),
    _case("torch-ps", (*ALGO, "ps", "--framework", "torch"), ["--framework"]),
    _case("framework-unknown", (*SWEEP, "--framework", "jax"), ["--framework"]),
    _case("torch-model", (*SWEEP, "--framework", "torch", "--model", "efficientnetb0"), ["--framework"]),
    # ---- --congestion-control
    *[_case(f"congestion-{i}", (*SWEEP, "--congestion-control", v), ["--congestion-control"])
      for i, v in enumerate(("", "bbr;rm -rf", "../cubic", "x" * 200, "cu bic", "CUBIC\n", "-cubic", "reno\0"))],
    # ---- netbench collective's sizes and operations
    *[_case(f"sizes-{i}", ("collective", "--sizes", v), ["--sizes"])
      for i, v in enumerate(("0", "-8", "64-8", "8-2GiB", "1MB", "8,1M", "", ",", "8-", "1e9", "8.5KiB",
                             "99999999999999999999999", "8-64MiB-1GiB", "nan"))],
    *[_case(f"ops-{i}", ("collective", "--ops", v), ["--ops"])
      for i, v in enumerate(("", ",", "allreduce,reduce", "ALLREDUCE", "allreduce;ls"))],
    *[_case(f"report-level-{v}", ("report", "{dir}", "--level", v), ["--level"]) for v in ("nan", "100", "0.95", "inf")],
    *[_case(f"apply-scale-{v}", ("apply", "--dry-run", "--scale", v), ["--scale"]) for v in ("nan", "0", "-inf")],
    _case("collective-timeout-nan", ("collective", "--timeout", "nan"), ["--timeout"]),
    _case("collective-framework", ("collective", "--framework", "mpi"), ["--framework"]),
    # ---- this round's surface (issue 38): node capacity, a part of a microsecond, b for bytes
    *[_case(f"step-delay-{i}", (*SWEEP, "--step-delay", v), ["--step-delay", *said])
      for i, (v, said) in enumerate((("n2=.,40ms", ["'.'"]), ("n2=..40ms", []), ("n2=40ms,.", []),
                                     ("n2=0.4us", ["0.4us", "write 0 or 1us"]), ("n2=2.5us", ["write 2us or 3us"]),
                                     ("n2=nan", []), ("n2=-40ms", []), ("n2=10", ["10ms"]), ("n2=1e9s", []),
                                     ("n2=40ms,40ms", ["repeated"]), ("n2", [])))],
    *[_case(f"cpus-{i}", (*SWEEP, "--cpus", v), ["--cpus"])
      for i, v in enumerate(("n2=0", "n2=nan", "n2=inf", "n2=-1", "n2=", "n2=0.5,0.5", "n2=0.5x", "N2=0.5", "n2=1e9"))],
    _case("cpus-twice", (*SWEEP, "--cpus", "n2=0.5", "--cpus", "n2=1"), ["--cpus", "twice"]),
    _case("latency-part-of-a-us", (*SWEEP, "--jitter", "0.4us"), ["--jitter", "write 0 or 1us"]),
    _case("latency-half-a-us", ("sweep", "--dry-run", "--latency", "2.5us"), ["--latency", "write 2us or 3us"]),
    _case("sizes-lower-case-b", ("collective", "--sizes", "8b"), ["--sizes", "8B"]),
    _case("sizes-kibibits", ("collective", "--sizes", "8-64kib"), ["--sizes", "64KiB"]),
    *[_case(f"ranks-per-node-{v}", (*SWEEP, "--ranks-per-node", v), ["--ranks-per-node"]) for v in ("0", "-1", "nan")],
    _case("collective-flag-unknown", (*SWEEP, "--collective", "tree"), ["--collective"]),
    _case("device-unknown", (*SWEEP, "--device", "tpu"), ["--device"]),
    _case("gpus-per-node-negative", (*SWEEP, "--gpus-per-node", "-1"), ["--gpus-per-node"]),
    *[_case(f"backup-workers-{v}", (*ALGO, "ps-sync", "--backup-workers", v), ["--backup-workers"])
      for v in ("-1", "2", "nan")],
    _case("backup-workers-wrong-strategy", (*SWEEP, "--backup-workers", "1"), ["--backup-workers"]),
    *[_case(f"pipeline-{v}", (*ALGO, "ps-async", "--pipeline", v), ["--pipeline"]) for v in ("-1", "nan", "1.5")],
    _case("pipeline-wrong-strategy", (*SWEEP, "--pipeline", "4"), ["--pipeline"]),
    *[_case(f"order-seed-{v}", (*SWEEP, "--order-seed", v), ["--order-seed"]) for v in ("-1", "nan", "1e99")],
    *[_case(f"settle-round-trips-{v}", (*SWEEP, "--settle-round-trips", v), ["--settle-round-trips"])
      for v in ("-1", "nan", "inf")],
    _case("settle-huge", (*SWEEP, "--settle", "1e12s"), ["--settle", "86400s"]),
    _case("metrics-wait-huge", (*SWEEP, "--metrics-port", "9464", "--metrics-wait", "1e9s"), ["--metrics-wait"]),
    _case("save-playbook-no-folder", (*SWEEP, "--save-playbook", "{dir}/none/x.yaml"), ["--save-playbook"]),
    _case("ps-nodes-over-64", (*ALGO, "ps-sync", "--workers", "64", "--ps", "16"), ["--workers", "80 nodes"]),
    # ---- nothing after '--', a congestion control the kernel lacks (its list needs no root)
    _case("dashes-and-nothing", (*SWEEP, "--"), ["'--'", "COMMAND"]),
    _case("congestion-unknown", (*SWEEP, "--congestion-control", "nosuchcc"), ["--congestion-control", "not available"]),
    # ---- designs too large to plan within seconds
    _case("levels-grid-too-large", ("sweep", "--dry-run", "--latency", ",".join(f"{i}ms" for i in range(1, 102)),
                                    "--bandwidth", ",".join(f"{i}mbit" for i in range(1, 101))), ["--latency", "10,000"]),
    _case("levels-grid-too-large-repeated", ("sweep", "--dry-run", "--latency", ",".join(f"{i}ms" for i in range(1, 101)),
                                             "--bandwidth", ",".join(f"{i}mbit" for i in range(1, 51)), "--repeat", "3"),
          ["--repeat", "10,000"]),
    _case("compute-grid-too-large", (*SWEEP, "--cpus", "n2=" + ",".join(f"{i / 100:g}" for i in range(1, 101)),
                                     "--step-delay", "n2=" + ",".join(f"{i}ms" for i in range(0, 101))),
          ["--cpus", "10,000"]),
]


@pytest.mark.parametrize("argv, fragments, files", FLAG_CASES)
def test_odd_flag_is_refused_in_one_line(argv, fragments, files, tmp_path, monkeypatch):
    _refused(argv, fragments, files, tmp_path, monkeypatch)


@pytest.mark.parametrize("argv, fragments, files", [case for case in FLAG_CASES if "--dry-run" in case.values[0]])
def test_the_run_refuses_what_the_dry_run_refuses(argv, fragments, files, tmp_path, monkeypatch):
    """The same input without --dry-run: refused before anything would start (a run that got as
    far as needing root, or the hosts, fails this test)."""
    _refused(tuple(arg for arg in argv if arg != "--dry-run"), fragments, files, tmp_path, monkeypatch)


def _never(*args, **kwargs):
    raise AssertionError("odd input was not refused before the command went on to act")


def _refused(argv, fragments, files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("NETBENCH_PRECISION", raising=False)
    monkeypatch.setattr(common, "require_root", _never)
    monkeypatch.setattr(common, "require_testbed", _never)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
    argv = [arg.replace("{dir}", str(tmp_path)) for arg in argv]
    began = time.monotonic()
    result = CliRunner().invoke(cli.main, argv)
    took = time.monotonic() - began
    output = result.output
    assert result.exit_code not in (0, None), output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1, output
    assert all(fragment in errors[0] for fragment in fragments), output
    assert took < 10, took
    assert not (tmp_path / "results").exists(), "a refused command left a results folder"


# ---------------------------------------------------------------- the real command line, as a user runs it


@pytest.mark.parametrize("argv, fragments", [
    (("sweep", "--loss", "0.5", "--dry-run"), ["--loss", "0.5%", "50%"]),
    (("sweep", "--bandwidth", "100mbps", "--dry-run"), ["--bandwidth", "100mbit", "800mbit"]),
    (("collective", "--sizes", "1MB"), ["--sizes", "1MiB", "1000000"]),
    (("sweep", "--dry-run", "--latency", "1ms", "--strategy", "easgd", "--elastic-alpha", "nan"), ["--elastic-alpha"]),
    (("report", "{dir}"), ["r000.json"]),
])
def test_the_installed_command_refuses_in_one_stderr_line(argv, fragments, tmp_path):
    """A process of its own (no CliRunner): exit 2 or 1, one error line on stderr naming the flag
    or file, no traceback, nothing on stdout but click's usage lines."""
    import os
    import subprocess
    import sys

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r000.json").write_text("[]")
    env = {**os.environ, "NETBENCH_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("NETBENCH_PRECISION", None)
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "netbench.cli", *(a.replace("{dir}", str(tmp_path)) for a in argv)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert time.monotonic() - began < 30
    assert done.returncode in (1, 2), (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and all(fragment in errors[0] for fragment in fragments), done.stderr
    assert not (tmp_path / "results").exists()
