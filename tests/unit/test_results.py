"""netbench.experiment.store (CSV rows, the results folder) and runner.make_result."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from netbench.model.job import JobSpec
from netbench.jobs.launch import JobOutcome
from netbench.model.profile import Profile
from netbench.model.run import Run
from netbench.experiment.store import CSV_COLUMNS, SCHEMA_VERSION, ResultStore, RunResult, write_json
from netbench.experiment.runner import make_result

PROFILE = Profile(name="wan", delay_us=10_000, jitter_us=1_500, loss=0.01, rate_bps=250_000_000)
STATS = {"steps": 30, "mean_s": 0.1234567891, "median_s": 0.12, "p90_s": 0.15, "stderr_s": 0.001,
         "jitter_s": 0.002, "images_per_sec": 1037.1234567, "images_per_sec_stderr": 8.4444}


def result(run_id="r000", **overrides) -> RunResult:
    fields = dict(run_id=run_id, profile=PROFILE.to_record(), backend="netem", strategy="allreduce", model="mlp",
                  batch_size=64, workers=2, repeat=1, warmup_steps=10, status="ok", stats=STATS)
    fields.update(overrides)
    return RunResult(**fields)


def test_csv_row_has_exactly_the_columns():
    assert list(result().csv_row()) == list(CSV_COLUMNS)


def test_csv_row_values():
    row = result().csv_row()
    assert (row["run_id"], row["profile"], row["backend"], row["strategy"], row["model"]) == \
        ("r000", "wan", "netem", "allreduce", "mlp")
    assert (row["delay_ms"], row["jitter_ms"], row["rate_mbit"], row["loss_pct"]) == (10.0, 1.5, 250.0, 1.0)
    assert (row["batch_size"], row["global_batch_size"], row["workers"], row["repeat"]) == (64, 128, 2, 1)
    assert row["images_per_sec"] == 1037.123 and row["images_per_sec_stderr"] == 8.444
    assert row["step_time_mean_s"] == 0.123457
    assert (row["step_time_median_s"], row["step_time_p90_s"]) == (0.12, 0.15)
    assert (row["warmup_steps"], row["steps"], row["status"], row["error"]) == (10, 30, "ok", "")


def test_csv_row_of_a_failed_unlimited_run():
    p = Profile(name="d1ms", delay_us=1_000).to_record()
    row = result(profile=p, stats=None, status="timeout", error="no step for 60s").csv_row()
    assert row["rate_mbit"] == ""
    assert row["images_per_sec"] == "" and row["step_time_mean_s"] == ""
    assert row["steps"] == 0
    assert (row["status"], row["error"]) == ("timeout", "no step for 60s")


def test_store_writes_header_then_rows(tmp_path):
    store = ResultStore(tmp_path / "out")
    store.create()
    with open(store.csv_path, newline="") as fh:
        assert next(csv.reader(fh)) == list(CSV_COLUMNS)
    store.add(result("r000"))
    store.add(result("r001", status="failed", stats=None, error="worker 1 exited with 1"))
    store.create()  # a second create must not write a second header or truncate
    rows = store.read_rows()
    assert [r["run_id"] for r in rows] == ["r000", "r001"]
    assert rows[0]["images_per_sec"] == "1037.123" and rows[0]["delay_ms"] == "10.0"
    assert rows[1]["status"] == "failed" and rows[1]["error"] == "worker 1 exited with 1"
    assert store.csv_path.read_text().count("run_id,") == 1
    record = json.loads((store.runs_dir / "r001.json").read_text())
    assert record["run_id"] == "r001" and record["schema_version"] == SCHEMA_VERSION
    assert record["profile"]["delay_us"] == 10_000
    assert store.logs_dir.is_dir()


def test_store_manifest_and_atomic_json(tmp_path):
    store = ResultStore(tmp_path)
    store.create()
    store.write_manifest({"sweep_id": "s1", "path": Path("/x")})
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"sweep_id": "s1", "path": "/x"}
    write_json(tmp_path / "a.json", [1, 2])
    assert not list(tmp_path.glob("*.tmp"))


# ---------------------------------------------------------------- make_result


def run(workers=2, batch=32, warmup=2) -> Run:
    """Run r004 (repeat 1) with its own job and worker count, as designs resolve them."""
    return Run(index=4, profile=PROFILE, repeat=1, job=JobSpec(batch_size=batch, warmup=warmup, steps=3),
               workers=workers)


def steps(worker, warmup, measured):
    events = [{"event": "step", "phase": "warmup", "step": i, "duration": d, "worker": worker}
              for i, d in enumerate(warmup)]
    events += [{"event": "step", "phase": "measured", "step": len(warmup) + i, "duration": d, "worker": worker}
               for i, d in enumerate(measured)]
    return events


def test_make_result_excludes_warmup_and_uses_global_batch():
    events = steps(0, [5.0, 3.0], [0.1, 0.2, 0.3]) + steps(1, [5.0, 3.0], [0.2, 0.2, 0.2])
    r = make_result(run(), "userspace", JobOutcome("ok", tuple(events)), 10.0, 20.0)
    assert r.status == "ok" and r.error == ""
    assert r.stats["steps"] == 3
    assert r.stats["mean_s"] == pytest.approx(0.2)  # the 5 s and 3 s warm-up steps are excluded
    assert r.stats["images_per_sec"] == pytest.approx(2 * 32 / 0.2)
    assert r.per_worker_images_per_sec == pytest.approx((32 / 0.2, 32 / 0.2))
    assert (r.run_id, r.repeat, r.backend, r.workers, r.batch_size, r.warmup_steps) == \
        ("r004", 1, "userspace", 2, 32, 2)
    assert r.profile == PROFILE.to_record()
    assert len(r.events) == len(events) and (r.started, r.ended) == (10.0, 20.0)


def test_make_result_per_worker_numbers_differ():
    events = steps(0, [], [0.1, 0.1]) + steps(1, [], [0.4, 0.4]) + steps(2, [], [0.2, 0.2])
    r = make_result(run(workers=3, batch=10), "netem", JobOutcome("ok", tuple(events)), 0, 1)
    assert r.per_worker_images_per_sec == pytest.approx((100.0, 25.0, 50.0))
    assert r.stats["images_per_sec"] == pytest.approx(30 / 0.1)  # the chief's steps, global batch


def test_make_result_failed_when_no_measured_steps():
    events = steps(0, [1.0, 1.0], []) + [{"event": "ready", "worker": 0}]
    r = make_result(run(), "netem", JobOutcome("ok", tuple(events)), 0, 1)
    assert r.status == "failed"
    assert "no measured steps" in r.error
    assert r.stats is None
    assert r.csv_row()["images_per_sec"] == ""


def test_make_result_keeps_an_earlier_failure():
    r = make_result(run(), "netem", JobOutcome("timeout", (), "no step for 60s"), 0, 1)
    assert (r.status, r.error, r.stats) == ("timeout", "no step for 60s", None)


def test_make_result_uses_only_the_chief_for_stats():
    events = steps(1, [], [0.5, 0.5]) + steps(0, [], [0.25, 0.25])
    r = make_result(run(batch=8), "netem", JobOutcome("ok", tuple(events)), 0, 1)
    assert r.stats["mean_s"] == pytest.approx(0.25)


# ---------------------------------------------------------------- a sweep's folder is its own


def test_a_new_or_empty_folder_starts_at_run_zero(tmp_path):
    from netbench.experiment.store import first_run_index

    assert first_run_index(tmp_path / "new", append=False) == 0
    (tmp_path / "empty").mkdir()
    assert first_run_index(tmp_path / "empty", append=False) == 0


def test_a_folder_with_results_is_refused_unless_appending(tmp_path):
    from netbench.experiment.store import ResultsError, first_run_index

    store = ResultStore(tmp_path)
    store.create()
    store.add(result("r000"))
    store.add(result("r004"))
    with pytest.raises(ResultsError, match=f"^{tmp_path}: already holds results") as info:
        first_run_index(tmp_path, append=False)
    assert "--append" in info.value.hint
    assert first_run_index(tmp_path, append=True) == 5  # after every run recorded there: none is overwritten


def test_any_file_makes_a_folder_non_empty(tmp_path):
    from netbench.experiment.store import ResultsError, first_run_index

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ResultsError):
        first_run_index(tmp_path, append=False)
    assert first_run_index(tmp_path, append=True) == 0


def test_the_runner_keeps_summaries_of_stored_runs_not_their_events(tmp_path):
    """The run records on disk keep every step event; the controller, over a long sweep,
    keeps only each run's summary (the returned records have no events)."""
    from tests.fakes.sweep import SyntheticTestbed

    from netbench.state.journal import Journal
    from netbench.experiment.runner import SweepConfig, run_sweep

    heard = []

    class Observer:
        def __getattr__(self, name):
            return lambda *args: heard.append((name, args))

    job = JobSpec(warmup=2, steps=5)
    runs = tuple(Run(index=i, profile=Profile(name=f"d{i}", delay_us=1000 * (i + 1)), repeat=1, job=job, workers=2)
                 for i in range(3))
    # one launch per point: each record holds its own launch's warm-up
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out", isolate=True)
    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    results = run_sweep(config, Observer(), testbed=testbed)
    assert [r.status for r in results] == ["ok"] * 3 and testbed.finished
    assert all(r.events == () and r.stats["steps"] == 5 for r in results)
    stored = json.loads((tmp_path / "out" / "runs" / "r000.json").read_text())
    assert sum(1 for e in stored["events"] if e["event"] == "step") == 2 * 7  # two workers, warm-up kept
    finished = [args[1] for name, args in heard if name == "run_finished"]
    assert len(finished[0].events) == 2 * 9  # the observer hears the whole record as the run ends


# ---------------------------------------------------------------- the store reads what it wrote

def test_the_store_owns_playbook_records_statuses_and_log_folders(tmp_path):
    store = ResultStore(tmp_path / "out")
    assert store.read_playbook() is None and store.statuses() == {} and store.record_paths() == []
    store.write_playbook({"name": "p", "seed": 3}, "factors: {latency: [1ms]}\n")
    assert store.read_playbook() == {"name": "p", "seed": 3}
    assert (tmp_path / "out" / "playbook.yaml").read_text() == "factors: {latency: [1ms]}\n"
    store.write_playbook({"name": "p", "seed": 3, "sessions": []})  # the copy of the playbook is kept
    assert store.read_playbook()["sessions"] == [] and (tmp_path / "out" / "playbook.yaml").exists()
    store.create()
    store.add(result("r001", status="timeout"))
    store.add(result("r000"))
    (store.runs_dir / "r002.json").write_text("{torn")
    assert [p.name for p in store.record_paths()] == ["r000.json", "r001.json", "r002.json"]
    assert store.statuses() == {"r000": "ok", "r001": "timeout"}
    assert store.log_dir("r001") == tmp_path / "out" / "logs" / "r001"


def test_an_unreadable_playbook_record_is_refused_with_a_hint(tmp_path):
    from netbench.experiment.store import ResultsError

    (tmp_path / "playbook.json").write_text("{")
    with pytest.raises(ResultsError, match=r"playbook\.json: unreadable: ") as err:
        ResultStore(tmp_path).read_playbook()
    assert err.value.hint == "give another folder with --output"


class _Crash(BaseException):
    """A controller killed halfway through storing a run."""


def _resume(directory, run):
    """What a resumed sweep does with one point: run it again unless a record says it was done."""
    store = ResultStore(directory)
    store.create()
    if run.run_id not in store.statuses():
        store.add(run)
    return store


@pytest.mark.parametrize("crash_in", ["record", "row"])
def test_a_crash_while_storing_a_run_never_leaves_it_twice_after_resume(tmp_path, monkeypatch, crash_in):
    import csv as csv_module

    from netbench.experiment import store as store_module

    out = tmp_path / "out"
    store = ResultStore(out)
    store.create()
    store.add(result("r000"))

    def crash(*args, **kwargs):
        raise _Crash()

    with monkeypatch.context() as patch:
        if crash_in == "record":
            patch.setattr(store_module, "write_json", crash)
        else:
            patch.setattr(csv_module.DictWriter, "writerows", crash)
            patch.setattr(csv_module.DictWriter, "writerow", crash)
        with pytest.raises(_Crash):
            store.add(result("r001"))
    resumed = _resume(out, result("r001"))
    _resume(out, result("r001"))  # and a second resume changes nothing
    assert [row["run_id"] for row in resumed.read_rows()] == ["r000", "r001"]
    assert sorted(resumed.statuses()) == ["r000", "r001"]


def test_a_row_an_older_netbench_wrote_without_its_record_is_replaced_when_the_run_is_repeated(tmp_path):
    out = tmp_path / "out"
    store = ResultStore(out)
    store.create()
    store.add(result("r000"))
    store.add(result("r001", status="failed", error="first try"))
    (out / "runs" / "r001.json").unlink()  # the row was written first, then the controller died
    resumed = _resume(out, result("r001"))
    rows = resumed.read_rows()
    assert [row["run_id"] for row in rows] == ["r000", "r001"] and rows[1]["status"] == "ok"
