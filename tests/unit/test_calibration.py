"""The calibration phase (split steps after a fused run's measured window): the events carry
it, and nothing that counts measured steps counts it; the split is read from it when the
measured steps carry none."""

from __future__ import annotations

import json

import pytest

from netbench.jobs import analysis
from netbench.jobs import events as ev
from netbench.jobs import worker
from netbench.metrics.state import MetricsState
from netbench.model.job import JobSpec


def step(worker_index, number, duration, phase="measured", compute=None, comm=None):
    return ev.Step(step=number, phase=phase, duration=duration, worker=worker_index, role="worker",
                   compute=compute, comm=comm)


def fused_run() -> list[ev.Event]:
    """A fused run of 2 workers: 1 warm-up, 2 measured steps (no split), 2 calibration steps."""
    out: list[ev.Event] = []
    for w in (0, 1):
        out += [ev.Start(worker=w, role="worker", step=ev.STEP_FUSED), step(w, 0, 9.0, "warmup"),
                step(w, 1, 0.5), step(w, 2, 0.25),
                step(w, 3, 4.0, "calibration", compute=1.0, comm=3.0),
                step(w, 4, 2.0, "calibration", compute=1.0, comm=1.0)]
    return out


def test_the_calibration_phase_is_an_event_phase_and_never_measured():
    made = ev.step_event(7, ev.PHASE_CALIBRATION, 1.0, 1.5, 128, 0.3, compute=0.2, comm=0.3)
    parsed = ev.parse_line(json.dumps(ev.to_wire(made)))
    assert parsed == made and parsed.phase == "calibration"
    assert not parsed.measured and parsed.calibration
    assert (parsed.compute, parsed.comm) == (0.2, 0.3)
    with pytest.raises(ValueError, match="calibration"):
        ev.step_event(0, "train", 1.0, 2.0, 64, 0.1)  # the message names every phase
    # a phase a later version adds is read, and is not measured either
    later = ev.from_record({"event": "step", "step": 1, "phase": "cooldown", "duration": 1.0})
    assert isinstance(later, ev.Step) and not later.measured and not later.calibration


def test_the_start_event_says_which_step_ran_and_older_records_say_nothing():
    start = ev.start_event(0, 2, 1, 0.0, "2.21", "mlp", 10, 64, step=ev.STEP_FUSED)
    wire = ev.to_wire(start)
    assert wire["step"] == "fused"
    assert ev.from_record(wire) == start
    old = {k: v for k, v in wire.items() if k != "step"}
    assert ev.from_record(old).step is None
    assert "step" not in ev.to_wire(ev.from_record(old))  # an older record is written back as it was


def test_analysis_counts_only_measured_steps_and_takes_the_split_from_calibration():
    job = JobSpec(batch_size=4)
    events = fused_run()
    assert analysis.measured_durations(events, job) == [0.5, 0.25]
    assert analysis.per_worker_images_per_sec(events, job, 2) == pytest.approx((8 / 0.75, 8 / 0.75))
    times = analysis.phase_times(events, job)
    assert times.source == "calibration"
    assert times.compute_mean_s == pytest.approx(1.0) and times.comm_mean_s == pytest.approx(2.0)
    assert times.idle_ratio == pytest.approx(4 / 6)
    assert analysis.step_kind(events, job) == "fused"
    # the same from a run record's JSON objects
    records = [ev.to_record(e) for e in events]
    assert analysis.phase_times(records, job) == times
    assert analysis.measured_durations(records, job) == [0.5, 0.25]


def test_analysis_prefers_the_split_of_the_measured_steps():
    job = JobSpec(batch_size=4)
    events = [ev.Start(worker=0, role="worker", step=ev.STEP_SPLIT),
              step(0, 0, 1.0, compute=0.75, comm=0.25),
              step(0, 1, 4.0, "calibration", compute=1.0, comm=3.0)]
    times = analysis.phase_times(events, job)
    assert (times.source, times.idle_ratio) == ("measured", pytest.approx(0.25))
    assert analysis.step_kind(events, job) == "split"
    assert analysis.step_kind([step(0, 0, 1.0)], job) is None  # an older record does not say


def test_live_metrics_do_not_count_calibration_steps():
    state = MetricsState(clock=lambda: 100.0)
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=1, workers=2, batch_size=32)
    state.run_started("r000", 0)
    for event in fused_run():
        state.worker_event(event)
    snap = state.snapshot()
    assert snap.steps == {("warmup", "0"): 1, ("measured", "0"): 2, ("warmup", "1"): 1, ("measured", "1"): 2}
    assert snap.state == "measured"
    assert snap.run_images_per_s == pytest.approx(64 * 2 / 0.75)


def test_the_worker_takes_the_step_kind_and_calibration_steps():
    args = worker.parse_args([])
    assert (args.step, args.calibration_steps) == ("fused", 5)
    args = worker.parse_args(["--step", "split", "--calibration-steps", "0"])
    assert (args.step, args.calibration_steps) == ("split", 0)
    with pytest.raises(SystemExit):
        worker.parse_args(["--step", "both"])
    with pytest.raises(SystemExit):
        worker.parse_args(["--calibration-steps", "-1"])
