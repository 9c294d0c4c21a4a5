"""netbench.track, the module a user's job imports: its step events, its stop request, its Keras
callback, and that it stays silent outside netbench."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types

from netbench.jobs import events as ev

ENV = {"NETBENCH_RANK": "1", "NETBENCH_WORLD_SIZE": "2", "NETBENCH_WARMUP": "2"}


def fresh_track(monkeypatch, env: dict):
    """A new instance of the module, reading `env` as its environment at import."""
    for name in ("NETBENCH_RANK", "NETBENCH_WORLD_SIZE", "NETBENCH_WARMUP", "NETBENCH_CONTROL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.find_spec("netbench.track")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def events_of(text: str) -> list[ev.Event]:
    return [e for e in (ev.parse_line(line) for line in text.splitlines()) if e is not None]


def test_steps_are_the_workers_events_warm_up_first_with_the_clusters_images(monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="9.9"))
    track = fresh_track(monkeypatch, ENV)
    print("partial line without newline", end="", flush=True)
    for _ in range(3):
        with track.step(images=32):
            pass
    loaded, *got = events_of(capfd.readouterr().out)
    assert isinstance(loaded, ev.Other) and loaded.name == "track-loaded"  # said at import
    assert dict(loaded.fields_)["task_index"] == 1
    assert isinstance(got[0], ev.Start) and got[0].task_index == 1 and got[0].num_workers == 2
    assert dict(got[0].extra)["framework"] == "torch 9.9" and dict(got[0].extra)["source"] == "track"
    steps = got[1:]
    assert [(s.step, s.phase, s.images) for s in steps] == [(0, "warmup", 64), (1, "warmup", 64), (2, "measured", 64)]
    assert all(s.end >= s.start and s.duration == s.end - s.start for s in steps)


def test_stop_is_requested_on_the_step_count_the_control_file_gives(monkeypatch, capfd, tmp_path):
    control = tmp_path / "control"
    track = fresh_track(monkeypatch, {**ENV, "NETBENCH_CONTROL": str(control)})
    answers = []
    for number in range(6):
        with track.step(images=1):
            pass
        if number == 1:
            control.write_text("4\n")
        answers.append(track.stop_requested())
    assert answers == [False, False, False, True, True, True]  # true once 4 steps are done
    asked = [e for e in events_of(capfd.readouterr().out) if isinstance(e, ev.Other)]
    assert [e.name for e in asked] == ["track-loaded", "stop-checked"]  # each said once


def test_outside_netbench_it_writes_nothing_and_never_asks_to_stop(monkeypatch, capfd):
    track = fresh_track(monkeypatch, {})
    with track.step(images=8):
        pass
    assert not track.active() and not track.stop_requested()
    assert capfd.readouterr().out == ""


def test_the_keras_callback_builds_on_the_loaded_keras_and_stops_fit(monkeypatch, capfd, tmp_path):
    class Callback:
        def __init__(self):
            self.model = None

    fake = types.SimpleNamespace(callbacks=types.SimpleNamespace(Callback=Callback), __version__="2.0")
    monkeypatch.setitem(sys.modules, "tf_keras", fake)
    control = tmp_path / "control"
    control.write_text("2")
    track = fresh_track(monkeypatch, {**ENV, "NETBENCH_CONTROL": str(control)})
    callback = track.keras_callback(images_per_batch=16)
    callback.model = types.SimpleNamespace(stop_training=False)
    assert isinstance(callback, Callback)
    for batch in range(2):
        callback.on_train_batch_begin(batch)
        callback.on_train_batch_end(batch)
        assert callback.model.stop_training == (batch == 1)
    steps = [e for e in events_of(capfd.readouterr().out) if isinstance(e, ev.Step)]
    assert [s.images for s in steps] == [32, 32]


def test_it_imports_without_any_framework_or_the_rest_of_netbench():
    code = ("import sys; from netbench import track; "
            "print(sorted(m for m in sys.modules if m.startswith(('netbench', 'tensorflow', 'torch', 'keras'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['netbench', 'netbench.track']"


def test_computed_splits_a_step_into_computation_and_communication_and_only_that_step(monkeypatch, capfd):
    import time

    track = fresh_track(monkeypatch, ENV)
    with track.step(images=8):
        time.sleep(0.02)
        track.computed()
        time.sleep(0.01)
    with track.step(images=8):  # not marked: no split
        pass
    steps = [e for e in events_of(capfd.readouterr().out) if isinstance(e, ev.Step)]
    first, second = steps
    assert first.compute >= 0.02 and first.comm >= 0.01
    assert abs(first.compute + first.comm - first.duration) < 1e-9
    assert second.compute is None and second.comm is None
