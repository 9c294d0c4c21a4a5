"""Typed step events: the harness writes them, the controller parses each line once, run
records keep the JSON they always kept."""

from __future__ import annotations

import json
import math

import pytest

from netbench.jobs import events as ev

START = ev.start_event(1, 4, 123, 10.5, "2.21.0", "mlp", 669706, 64, strategy="allreduce-accum",
                       accum_steps=4, model_bytes=2678824, input_shape=(784,), classes=10)
EVERY_KIND = [
    START,
    ev.step_event(3, "measured", 10.0, 10.25, 128, 1.5, compute=0.2, comm=0.05),
    ev.step_event(4, "warmup", 10.25, 10.5, 64, math.nan),
    ev.step_event(5, "measured", 10.5, 11.0, 8, 0.7, compute=0.1, comm=0.3, executor=2),
    ev.Done(time=99.5, steps=40),
    ev.error_event(RuntimeError("peer gone")),
    ev.Resources(time=1.0, cpu_s=2.5, rss_bytes=1024, rx_bytes=10, tx_bytes=20),
]


@pytest.mark.parametrize("event", EVERY_KIND, ids=lambda e: e.kind)
def test_every_kind_round_trips_on_the_wire_and_in_the_record(event):
    line = json.dumps(ev.to_wire(event), allow_nan=False)
    parsed = ev.parse_line(line.encode())
    assert parsed == event
    kept = ev.received(parsed, 1, "worker", 7.5)
    assert (kept.worker, kept.role, kept.recv) == (1, "worker", 7.5)
    record = json.loads(json.dumps(ev.to_record(kept)))
    assert ev.from_record(record) == kept
    assert (record["worker"], record["role"], record["recv"]) == (1, "worker", 7.5)


def test_a_record_keeps_todays_json_key_for_key_and_in_order():
    # as the controller stored events before they were typed: the worker's keys, then
    # worker, role (a start event's own role keeps its place) and recv
    step = {"compute": 0.2, "comm": 0.05, "event": "step", "step": 3, "phase": "measured", "start": 10.0,
            "end": 10.25, "duration": 0.25, "images": 128, "loss": 1.5, "worker": 0, "role": "worker", "recv": 3.0}
    start = {**ev.to_wire(START), "worker": 1, "recv": 2.0}
    assert list(start)[1] == "role"
    for record in (step, start, {"event": "done", "time": 1.0, "steps": 2, "worker": 0, "role": "ps", "recv": 1.5}):
        assert json.dumps(ev.to_record(ev.from_record(record))) == json.dumps(record)


def test_unknown_keys_and_kinds_are_kept_for_the_record():
    record = {"event": "step", "step": 1, "phase": "measured", "duration": 0.5, "future": [1, 2], "worker": 0}
    event = ev.from_record(record)
    assert isinstance(event, ev.Step) and dict(event.extra) == {"future": [1, 2]}
    assert ev.to_record(event)["future"] == [1, 2]
    other = ev.parse_line('{"event": "checkpoint", "path": "/x"}')
    assert isinstance(other, ev.Other) and other.kind == "checkpoint"
    assert ev.to_wire(other) == {"event": "checkpoint", "path": "/x"}


def test_an_unknown_version_is_an_error_event_naming_it():
    event = ev.parse_line('{"v": 2, "event": "step", "step": 0}')
    assert isinstance(event, ev.Error) and event.type == ev.UNSUPPORTED_VERSION and event.unreadable
    assert "version 2" in event.message and '"step"' in event.message
    assert ev.parse_line('{"v": 1, "event": "done", "time": 1, "steps": 2}') == ev.Done(time=1.0, steps=2)


@pytest.mark.parametrize("line, what", [
    ('{"event": "step", "step": 1', "not JSON"),
    ('{"step": 1}', "no event kind"),
    ('{"event": "step", "step": "one"}', "unreadable step event"),
    ('{"event": "start", "input_shape": 7}', "unreadable start event"),
])
def test_a_malformed_line_is_an_error_event_naming_it(line, what):
    event = ev.parse_line(line)
    assert isinstance(event, ev.Error) and event.type == ev.MALFORMED
    assert what in event.message and line[:20] in event.message.replace("'", '"')


def test_stray_output_is_not_an_event():
    assert ev.parse_line("WARNING: tensorflow says hello") is None
    assert ev.parse_line(b"\n") is None


def test_step_phase_is_checked_and_a_diverged_loss_is_none():
    with pytest.raises(ValueError):
        ev.step_event(0, "train", 1.0, 2.0, 64, 0.1)
    assert ev.step_event(0, "warmup", 1.0, 2.0, 64, math.inf).loss is None
    assert ev.step_event(0, "warmup", 1.0, 2.0, 64, 0.1).duration == pytest.approx(1.0)


def test_the_live_metrics_read_typed_events():
    from netbench.metrics.state import MetricsState

    state = MetricsState(clock=lambda: 100.0)
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=1, workers=2, batch_size=32)
    state.run_started("r000", 0)
    state.worker_event(ev.Start(worker=1, role="worker"))
    for k, duration in enumerate((5.0, 0.1, 0.3)):
        state.worker_event(ev.Step(step=k, phase="warmup" if k == 0 else "measured", duration=duration,
                                   worker=0, role="worker"))
    snap = state.snapshot()
    assert snap.run_images_per_s == pytest.approx(64 / 0.2)  # measured chief steps, global batch
    assert snap.steps[("measured", "0")] == 2 and snap.workers_up["1"] == 1
    state.worker_event(ev.Done(worker=1, role="worker"))
    assert state.snapshot().workers_up["1"] == 0
