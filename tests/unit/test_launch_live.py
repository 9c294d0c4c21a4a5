"""What observers, the metrics, the dashboards and the live view say about launches: each
point's launch and place in it (Observer.launch_point) and its measured window
(Observer.window), on the synthetic testbed of tests/fakes/sweep.py."""

from __future__ import annotations

import io
import inspect
import json
import re
import time
from types import SimpleNamespace

import pytest

from netbench.experiment import runner
from netbench.experiment.launch import Settle, plan_launches
from netbench.experiment.runner import SweepConfig, run_sweep
from netbench.jobs import events as ev
from netbench.metrics import catalogue, dashboards, lint
from netbench.metrics.state import MetricsObserver, MetricsState, ObserverTee
from netbench.model import design
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.state.journal import Journal
from tests.fakes.sweep import SyntheticTestbed
from tests.unit.test_metrics import samples, scrape

JOB = JobSpec(warmup=2, steps=5)


def _runs(delays=(1, 2, 3)):
    levels = design.SweepLevels(delay_us=tuple(1000 * d for d in delays))
    return design.plan_sweep(Profile(name="base"), levels, 1, JOB, 2)


def _config(tmp_path, runs, **kw):
    kw.setdefault("settle", Settle(steps=3, seconds=0.0))
    return SweepConfig(sweep_id="s", runs=tuple(runs), job=JOB, workers=2, output=tmp_path / "out",
                       order_seed=7, order="random", **kw)


class Heard:
    """An observer that logs every call by name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a: self.calls.append((name, a))

    def of(self, name: str) -> list[tuple]:
        return [a for n, a in self.calls if n == name]


def _chief_measured(tmp_path, run_id) -> list[dict]:
    record = json.loads((tmp_path / "out" / "runs" / f"{run_id}.json").read_text())
    return sorted((e for e in record["events"] if e["event"] == "step" and e["phase"] == "measured"
                   and e.get("role", "worker") == "worker" and e["worker"] == 0), key=lambda e: e["step"])


def _check_windows(tmp_path, heard: Heard, before: float, after: float) -> None:
    """Every ok point's window: heard once, before its run_finished, inside the sweep, and as
    long as its record's chief measured steps (from the first's start to the last's arrival)."""
    windows = {a[0].run_id: a[1:] for a in heard.of("window")}
    for run, result in heard.of("run_finished"):
        if result.status != "ok":
            continue
        start, end = windows[run.run_id]
        steps = _chief_measured(tmp_path, run.run_id)
        first, last = steps[0], steps[-1]
        # (an isolated stand-in's steps arrive at once: its first "began" a duration before)
        assert before - first["duration"] < start < end < after
        assert end - start == pytest.approx(last["recv"] - (first["recv"] - first["duration"]), abs=1e-3)
    for index, (name, args) in enumerate(heard.calls):
        if name == "window":
            finished = next(a[0].run_id for n, a in heard.calls[index:] if n == "run_finished")
            assert finished == args[0].run_id  # the window comes before its point's end


# ---------------------------------------------------------------- the observer hooks

def test_every_observer_has_every_hook():
    hooks = {name for name, _ in inspect.getmembers(runner.Observer, inspect.isfunction)
             if not name.startswith("_")}
    assert {"launch_point", "window"} <= hooks
    from netbench.cli.render import SweepView

    for implementation in (runner._Quiet, MetricsObserver, SweepView):
        missing = {h for h in hooks if not callable(getattr(implementation, h, None))}
        assert not missing, (implementation.__name__, missing)
    runner._Quiet().launch_point(None, 0, 1, 1)
    runner._Quiet().window(None, 1.0, 2.0)


def test_a_shared_launch_tells_each_points_place_and_window(tmp_path):
    heard = Heard()
    before = time.time()
    results = run_sweep(_config(tmp_path, _runs()), heard, testbed=SyntheticTestbed(Journal(tmp_path / "state")))
    after = time.time()
    assert [r.status for r in results] == ["ok"] * 3
    order = [r.run_id for r in plan_launches(_runs(), 7, "random")[0].runs]
    assert [(a[0].run_id, *a[1:]) for a in heard.of("launch_point")] == \
        [(run_id, 0, k, 3) for k, run_id in enumerate(order, 1)]
    # each point's place comes right after its start, before its profile is applied
    names = [n for n, _ in heard.calls if n in ("run_started", "launch_point", "profile_applied", "window",
                                                  "run_finished")]
    assert names == ["run_started", "launch_point", "profile_applied", "window", "run_finished"] * 3
    assert [a[0].run_id for a in heard.of("window")] == order
    _check_windows(tmp_path, heard, before, after)


def test_a_relaunch_numbers_its_points_afresh(tmp_path):
    # the chief dies after 12 steps in every launch: the first launch's second point fails
    heard = Heard()
    testbed = SyntheticTestbed(Journal(tmp_path / "state"), chief_stops_after=12)
    before = time.time()
    results = run_sweep(_config(tmp_path, _runs()), heard, testbed=testbed)
    after = time.time()
    assert [r.status for r in results] == ["ok", "failed", "ok"]
    assert [a[1:] for a in heard.of("launch_point")] == [(0, 1, 3), (0, 2, 3), (1, 1, 1)]
    _check_windows(tmp_path, heard, before, after)
    assert {results[0].run_id, results[2].run_id} <= {a[0].run_id for a in heard.of("window")}


def test_an_isolated_point_is_point_1_of_1_of_no_shared_launch(tmp_path):
    heard = Heard()
    before = time.time()
    results = run_sweep(_config(tmp_path, _runs(), isolate=True), heard,
                        testbed=SyntheticTestbed(Journal(tmp_path / "state")))
    after = time.time()
    assert [r.status for r in results] == ["ok"] * 3
    assert [(a[0].run_id, *a[1:]) for a in heard.of("launch_point")] == \
        [("r000", None, 1, 1), ("r001", None, 1, 1), ("r002", None, 1, 1)]
    assert [a[0].run_id for a in heard.of("window")] == ["r000", "r001", "r002"]
    _check_windows(tmp_path, heard, before, after)


# ---------------------------------------------------------------- metrics

def test_a_sweep_exposes_each_points_launch_place_and_window(tmp_path):
    state = MetricsState()
    metrics = MetricsObserver(state)
    states: list[tuple[str, str]] = []  # (chief step's phase, the sweep state after it)

    class Watch:
        def __getattr__(self, name):
            return lambda *a: None

        def step(self, run, event):
            if isinstance(event, ev.Step) and event.worker == 0 and event.role == "worker":
                states.append((event.phase, state.snapshot().state))

    heard = Heard()
    results = run_sweep(_config(tmp_path, _runs()), ObserverTee(heard, metrics, Watch()),
                        testbed=SyntheticTestbed(Journal(tmp_path / "state")))
    assert [r.status for r in results] == ["ok"] * 3
    families, _ = scrape(state)
    order = [r.run_id for r in plan_launches(_runs(), 7, "random")[0].runs]
    windows = {a[0].run_id: a[1:] for a in heard.of("window")}
    for name, edge in (("netbench_measured_window_start_timestamp_seconds", 0),
                       ("netbench_measured_window_end_timestamp_seconds", 1)):
        assert samples(families, name) == {
            frozenset({("run", run_id), ("launch", "0"), ("point", f"{k}/3")}): windows[run_id][edge]
            for k, run_id in enumerate(order, 1)}
    assert samples(families, "netbench_run_info") == {
        frozenset({("run", order[-1]), ("repeat", "0"), ("launch", "0"), ("point", "3/3")}): 1.0}
    settling = {s for phase, s in states if phase == "settle"}
    assert settling == {"settle"}  # the sweep says it settles while the chief's steps settle
    assert {s for phase, s in states if phase == "measured"} == {"measured"}


def test_exposition_of_launch_labels_and_windows():
    state = MetricsState(clock=lambda: 1000.0)
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=2, workers=2, batch_size=32)
    state.run_started("r000", 1)
    state.launch_point(None, 1, 1)
    state.measured_window("r000", 1001.5, 1002.25)
    state.run_started("r001", 1)
    state.launch_point(4, 2, 5)
    state.measured_window("r001", 1003.0, 1004.0)
    families, text = scrape(state)
    assert samples(families, "netbench_run_info") == {
        frozenset({("run", "r001"), ("repeat", "1"), ("launch", "4"), ("point", "2/5")}): 1.0}
    assert samples(families, "netbench_measured_window_start_timestamp_seconds") == {
        frozenset({("run", "r000"), ("launch", "isolated"), ("point", "1/1")}): 1001.5,
        frozenset({("run", "r001"), ("launch", "4"), ("point", "2/5")}): 1003.0}
    assert samples(families, "netbench_measured_window_end_timestamp_seconds") == {
        frozenset({("run", "r000"), ("launch", "isolated"), ("point", "1/1")}): 1002.25,
        frozenset({("run", "r001"), ("launch", "4"), ("point", "2/5")}): 1004.0}
    for name in ("netbench_measured_window_start_timestamp_seconds", "netbench_measured_window_end_timestamp_seconds"):
        assert f"# TYPE {name} gauge" in text
    assert "settle" in catalogue.SWEEP_STATES


# ---------------------------------------------------------------- dashboards

def test_dashboards_mark_each_measured_window_and_name_launch_and_point():
    by_uid = {d["uid"]: d for d in (build() for build in dashboards.DASHBOARDS.values())}
    training = by_uid["netbench-training"]
    annotations = {a["name"]: a for a in training["annotations"]["list"]}
    for name, metric in (("Measured window start", "netbench_measured_window_start_timestamp_seconds"),
                         ("Measured window end", "netbench_measured_window_end_timestamp_seconds")):
        annotation = annotations[name]
        assert annotation["enable"] and annotation["useValueForTime"]
        assert [n for n, _ in lint.metric_names(annotation["expr"])] == [metric]
        assert annotation["expr"].endswith("* 1000")  # Grafana wants the event's time in ms
        assert {"run", "launch", "point"} <= set(re.findall(r"{{(\w+)}}", annotation["titleFormat"]))
    for dashboard in by_uid.values():  # every title's labels are labels the query returns
        for annotation in dashboard["annotations"]["list"]:
            if annotation.get("builtIn"):
                continue
            labels = {label for n, _ in lint.metric_names(annotation["expr"])
                      for label in catalogue.BY_NAME[n].labels} | {"instance"}
            assert set(re.findall(r"{{(\w+)}}", annotation["titleFormat"])) <= labels, annotation["name"]
    for uid in ("netbench-overview", "netbench-training"):
        run_panel = next(p for p in by_uid[uid]["panels"] if p["title"] == "Run")
        legend = run_panel["targets"][0]["legendFormat"]
        assert "{{launch}}" in legend and "{{point}}" in legend
        assert lint.metric_names(run_panel["targets"][0]["expr"])[0][0] == "netbench_run_info"


# ---------------------------------------------------------------- the live view

class Shown:
    """A stand-in for rich's Progress: the description and info of every update."""

    def __init__(self) -> None:
        self.description, self.info = "", ""
        self.infos: list[str] = []

    def update(self, task, description=None, info=None):
        if description is not None:
            self.description = description
        if info is not None:
            self.info = info
            self.infos.append(info)

    def advance(self, task):
        pass


def _view(monkeypatch, runs):
    from rich.console import Console

    from netbench import console
    from netbench.cli.render import SweepView

    out = io.StringIO()
    monkeypatch.setattr(console, "out", Console(file=out, width=300, highlight=False, soft_wrap=True))
    view = SweepView(SimpleNamespace(runs=runs, sweep_id="s"))
    shown = Shown()
    view.progress = SimpleNamespace(update=shown.update, advance=shown.advance,
                                    console=Console(file=out, width=300, highlight=False, soft_wrap=True))
    return view, shown, out


def _result(run, launch):
    return SimpleNamespace(status="ok", stats={"images_per_sec": 1234.5}, error="", launch=launch)


def _step(k, phase):
    return ev.Step(step=k, phase=phase, start=0.0, end=0.01, duration=0.01, worker=0, role="worker")


def test_the_live_view_names_the_launch_and_point_and_says_it_settles(monkeypatch):
    runs = [SimpleNamespace(run_id=f"r00{i}", repeat=0, profile=Profile(name=f"d{i}ms"), job=JOB, workers=2)
            for i in range(2)]
    view, shown, out = _view(monkeypatch, runs)
    view.run_started(runs[0])
    view.launch_point(runs[0], 0, 1, 2)
    assert shown.description == "r000 d0ms (launch 0, point 1/2)"
    view.profile_applied(runs[0])
    assert shown.info == "starting workers"  # a launch's first point starts its processes
    view.step(runs[0], _step(0, "warmup"))
    view.step(runs[0], _step(2, "measured"))
    view.window(runs[0], 1.0, 2.0)
    view.run_finished(runs[0], _result(runs[0], 0))
    view.run_started(runs[1])
    view.launch_point(runs[1], 0, 2, 2)
    assert shown.description == "r001 d1ms (launch 0, point 2/2)"
    view.profile_applied(runs[1])
    assert shown.info == "settling after the change"
    view.step(runs[1], _step(8, "settle"))
    assert shown.info.startswith("step 8 (settling)")
    view.step(runs[1], _step(12, "measured"))
    assert shown.info.startswith("step 12 (measured)")
    view.run_finished(runs[1], _result(runs[1], 0))
    lines = out.getvalue().splitlines()
    assert "  r000 d0ms (repeat 0, launch 0, point 1/2): 1,234.5 img/s" in lines
    assert "  r001 d1ms (repeat 0, launch 0, point 2/2): 1,234.5 img/s" in lines


def test_the_live_view_of_isolated_points_and_a_relaunch(monkeypatch):
    runs = [SimpleNamespace(run_id=f"r00{i}", repeat=0, profile=Profile(name=f"d{i}ms"), job=JOB, workers=2)
            for i in range(2)]
    view, shown, out = _view(monkeypatch, runs)
    view.run_started(runs[0])
    view.launch_point(runs[0], None, 1, 1)
    assert shown.description == "r000 d0ms"
    view.profile_applied(runs[0])
    view.step(runs[0], _step(3, "measured"))
    view.run_finished(runs[0], _result(runs[0], None))
    view.run_started(runs[1])
    view.launch_point(runs[1], 1, 1, 1)  # a new launch after a failure: its processes start anew
    view.profile_applied(runs[1])
    assert shown.info == "starting workers"
    view.run_finished(runs[1], _result(runs[1], 1))
    lines = out.getvalue().splitlines()
    assert "  r000 d0ms (repeat 0): 1,234.5 img/s" in lines
    assert "  r001 d1ms (repeat 0, launch 1, point 1/1): 1,234.5 img/s" in lines


def test_the_live_view_shows_the_interval_narrowing_and_refreshes_at_most_every_tenth_second(monkeypatch):
    from dataclasses import replace

    from netbench.cli import render

    run = SimpleNamespace(run_id="r000", repeat=0, profile=Profile(name="d0ms"), job=replace(JOB, precision=0.02),
                          workers=2)
    view, shown, _ = _view(monkeypatch, [run])
    clock = [100.0]
    monkeypatch.setattr(render.time, "monotonic", lambda: clock[0])
    view.run_started(run)
    view.step(run, _step(0, "measured"))
    assert shown.info.startswith("step 0 (measured)") and "±" not in shown.info  # too few steps for an interval
    for k in range(1, 40):
        view.step(run, _step(k, "measured"))
    assert shown.info.startswith("step 0 (measured)")  # the same run and phase: no sooner than REFRESH_S
    clock[0] += 2 * render.REFRESH_S
    view.step(run, _step(40, "measured"))
    assert shown.info.startswith("step 40 (measured)") and "of 2% (41 steps)" in shown.info
