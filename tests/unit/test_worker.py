"""Tests for netbench.jobs.worker.

Pure tests need no TensorFlow.  Tests marked ``tf`` start real worker
processes (TensorFlow import ~5 s each) and talk only over 127.0.0.1.
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netbench.jobs import worker

REPO_ROOT = Path(__file__).resolve().parents[2]

START_KEYS = {"event", "task_index", "num_workers", "pid", "time", "tf_version",
              "model", "params", "batch_size", "global_batch_size", "strategy", "role",
              "accum_steps", "model_bytes", "input_shape", "classes", "data"}
STEP_KEYS = {"event", "step", "phase", "start", "end", "duration", "images", "loss",
             "compute", "comm"}
DONE_KEYS = {"event", "time", "steps"}
ERROR_KEYS = {"event", "type", "message"}


# ---------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------


def test_parse_args_defaults():
    args = worker.parse_args([])
    assert args.model == "mlp"
    assert args.batch_size == 64
    assert args.warmup == 10
    assert args.steps == 30
    assert args.seconds is None
    assert args.seed == 0
    assert args.learning_rate == pytest.approx(0.05)
    assert args.collective_timeout == pytest.approx(120.0)
    assert args.startup_timeout == pytest.approx(300.0)
    assert args.threads == 0
    assert (args.strategy, args.accum_steps, args.data) == ("allreduce", 4, "synthetic")
    assert args.input_shape is None and args.classes is None


def test_parse_args_strategy_model_and_data(tmp_path):
    archive = tmp_path / "d.npz"
    archive.write_bytes(b"")  # only its existence and suffix are checked here
    args = worker.parse_args(["--strategy", "allreduce-accum", "--accum-steps", "8",
                              "--model", "resnet18", "--input-shape", "64x64x3",
                              "--classes", "100", "--data", str(archive)])
    assert (args.strategy, args.accum_steps, args.model) == ("allreduce-accum", 8, "resnet18")
    assert (args.input_shape, args.classes, args.data) == ((64, 64, 3), 100, str(archive))
    assert worker.parse_args(["--strategy", "ps"]).strategy == "ps"
    assert worker.parse_args(["--data", str(tmp_path)]).data == str(tmp_path)


def test_parse_args_all_options():
    args = worker.parse_args([
        "--model", "cnn", "--batch-size", "16", "--warmup", "0", "--steps", "7",
        "--seed", "3", "--learning-rate", "0.5", "--collective-timeout", "0",
        "--startup-timeout", "9", "--threads", "2",
    ])
    assert (args.model, args.batch_size, args.warmup, args.steps) == ("cnn", 16, 0, 7)
    assert (args.seed, args.learning_rate, args.collective_timeout) == (3, 0.5, 0.0)
    assert (args.startup_timeout, args.threads) == (9.0, 2)
    assert args.seconds is None


def test_parse_args_seconds_replaces_steps():
    args = worker.parse_args(["--seconds", "2.5", "--warmup", "3"])
    assert args.seconds == pytest.approx(2.5)
    assert args.steps is None


@pytest.mark.parametrize("argv", [
    ["--batch-size", "0"],
    ["--batch-size", "-4"],
    ["--batch-size", "x"],
    ["--warmup", "-1"],
    ["--steps", "0"],
    ["--seconds", "0"],
    ["--seconds", "-1"],
    ["--seconds", "nan"],
    ["--seconds", "inf"],
    ["--steps", "5", "--seconds", "5"],      # mutually exclusive
    ["--seconds", "5", "--warmup", "0"],     # no warm-up mean to size it
    ["--model", "resnet"],
    ["--strategy", "ring"],
    ["--accum-steps", "0"],
    ["--classes", "1"],
    ["--input-shape", "32xx3"],
    ["--input-shape", "0x32x3"],
    ["--model", "cnn", "--input-shape", "784"],          # a conv net needs HxWxC
    ["--model", "vgg16", "--input-shape", "16x16x3"],    # too small for vgg16
    ["--data", "/nonexistent/cifar.npz"],
    ["--learning-rate", "0"],
    ["--collective-timeout", "-1"],
    ["--startup-timeout", "-1"],
    ["--threads", "-1"],
    ["--unknown"],
])
def test_parse_args_rejects(argv, capsys):
    with pytest.raises(SystemExit) as info:
        worker.parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Seconds -> steps
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seconds, mean, expected", [
    (10.0, 0.033, 304),     # 303.03 -> rounds up
    (1.0, 0.25, 4),         # exact division: no extra step
    (0.001, 0.5, 1),        # shorter than one step: still one step
    (60.0, 2.0, 30),
])
def test_measured_steps_from_mean(seconds, mean, expected):
    assert worker.measured_steps_from_mean(seconds, mean) == expected


def test_measured_steps_covers_window():
    for seconds in (0.3, 1.0, 7.5, 30.0):
        for mean in (0.0011, 0.033, 0.2, 1.7):
            steps = worker.measured_steps_from_mean(seconds, mean)
            assert steps >= 1
            assert steps * mean >= seconds * (1 - 1e-12)
            assert steps == 1 or (steps - 1) * mean < seconds


@pytest.mark.parametrize("seconds, mean", [
    (1.0, 0.0), (1.0, -0.1), (1.0, math.nan), (1.0, math.inf),
    (0.0, 0.1), (-1.0, 0.1), (math.nan, 0.1),
])
def test_measured_steps_rejects_bad_input(seconds, mean):
    with pytest.raises(ValueError):
        worker.measured_steps_from_mean(seconds, mean)


def test_warmup_mean_drops_traced_first_step():
    assert worker.warmup_mean([5.0, 1.0, 3.0]) == pytest.approx(2.0)
    assert worker.warmup_mean([0.7]) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        worker.warmup_mean([])


def test_split_steps_run_only_where_calibration_or_the_split_step_needs_them():
    from netbench.jobs.harness.loop import calibration_steps

    assert calibration_steps(worker.parse_args([])) == 5  # fused: calibration after the window
    assert calibration_steps(worker.parse_args(["--calibration-steps", "2"])) == 2
    assert calibration_steps(worker.parse_args(["--step", "split"])) == 0  # every step is split
    # a launch's processes are stopped by the controller: no calibration, so no split functions
    # and none of their accumulators' broadcasts at start-up (1.4 s of it at 50 ms one-way)
    assert calibration_steps(worker.parse_args(["--until-stopped"])) == 0


# ---------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------


def test_start_event_shape():
    ev = worker.start_event(1, 4, 123, 10.5, "2.21.0", "mlp", 669706, 64,
                            strategy="allreduce-accum", accum_steps=4, model_bytes=2678824,
                            input_shape=(784,), classes=10)
    assert set(ev) == START_KEYS
    assert (ev["strategy"], ev["role"], ev["accum_steps"]) == ("allreduce-accum", "worker", 4)
    assert (ev["model_bytes"], ev["input_shape"], ev["data"]) == (2678824, [784], "synthetic")
    assert ev["event"] == "start"
    assert (ev["task_index"], ev["num_workers"], ev["pid"]) == (1, 4, 123)
    assert ev["params"] == 669706
    assert ev["batch_size"] == 64
    assert ev["global_batch_size"] == 256


def test_step_event_shape():
    ev = worker.step_event(3, "measured", 10.0, 10.25, 128, 1.5, compute=0.2, comm=0.05)
    assert set(ev) == STEP_KEYS
    assert (ev["compute"], ev["comm"]) == (0.2, 0.05)
    assert worker.step_event(3, "measured", 10.0, 10.25, 128, 1.5)["comm"] is None
    with_executor = worker.step_event(3, "measured", 10.0, 10.25, 128, 1.5, executor=2)
    assert set(with_executor) == STEP_KEYS | {"executor"} and with_executor["executor"] == 2
    assert ev["event"] == "step"
    assert (ev["step"], ev["phase"], ev["images"]) == (3, "measured", 128)
    assert ev["duration"] == pytest.approx(0.25)
    assert ev["loss"] == pytest.approx(1.5)
    assert worker.step_event(0, "warmup", 1.0, 2.0, 64, 0.1)["phase"] == "warmup"


def test_step_event_rejects_unknown_phase():
    with pytest.raises(ValueError):
        worker.step_event(0, "train", 1.0, 2.0, 64, 0.1)


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_step_event_non_finite_loss_is_null(loss):
    ev = worker.step_event(0, "warmup", 1.0, 2.0, 64, loss)
    assert ev["loss"] is None
    out = io.StringIO()
    worker.emit(ev, out)  # must still be strict JSON
    assert json.loads(out.getvalue())["loss"] is None


def test_done_and_error_events():
    done = worker.done_event(99.5, 40)
    assert done == {"event": "done", "time": 99.5, "steps": 40}
    err = worker.error_event(RuntimeError("peer gone"))
    assert set(err) == ERROR_KEYS
    assert err == {"event": "error", "type": "RuntimeError", "message": "peer gone"}


def test_emit_writes_one_json_line():
    out = io.StringIO()
    worker.emit(worker.done_event(1.0, 2), out)
    worker.emit(worker.step_event(0, "warmup", 1.0, 2.0, 64, 0.5), out)
    lines = out.getvalue().split("\n")
    assert lines[-1] == ""  # every event ends with a newline
    assert [json.loads(line)["event"] for line in lines[:-1]] == ["done", "step"]


def test_make_tf_config():
    addrs = ["127.0.0.1:1111", "127.0.0.1:2222"]
    cfg = json.loads(worker.make_tf_config(addrs, 1))
    assert cfg == {"cluster": {"worker": addrs}, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ValueError):
        worker.make_tf_config(addrs, 2)
    with pytest.raises(ValueError):
        worker.make_tf_config([], 0)


# ---------------------------------------------------------------------------
# Process-level checks that need no TensorFlow
# ---------------------------------------------------------------------------


def _env(tf_config: str | None = None) -> dict[str, str]:
    """Child environment: repo importable, TF_CONFIG set or removed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    return env


def test_import_does_not_import_tensorflow():
    code = ("import sys, netbench.jobs.worker; "
            "sys.exit(1 if 'tensorflow' in sys.modules or 'keras' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_cli_usage_error_exits_2_with_clean_stdout():
    proc = subprocess.run([sys.executable, "-m", "netbench.jobs.worker", "--batch-size", "0"],
                          env=_env(), timeout=60, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "--batch-size" in proc.stderr


# ---------------------------------------------------------------------------
# Real TensorFlow runs (loopback only)
# ---------------------------------------------------------------------------


def test_every_strategy_has_a_training_loop():
    from netbench.model.job import STRATEGIES

    assert set(worker.LOOPS) == set(STRATEGIES)
    assert all(callable(loop) for loop in worker.LOOPS.values())


def test_the_harness_emits_typed_events_as_their_wire_objects():
    from netbench.jobs import events as ev

    out = io.StringIO()
    worker.emit(ev.Done(time=1.5, steps=3), out)
    assert json.loads(out.getvalue()) == worker.done_event(1.5, 3)
