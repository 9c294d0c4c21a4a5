"""The benchmark processes' shared edge (jobs/harness/emit.py): timing calls after a warm-up,
the timings' events, and TF_CONFIG's workers."""

from __future__ import annotations

import io
import json

from netbench.jobs import events as ev
from netbench.jobs.harness.emit import emit_timings, tf_config_workers, time_calls


def test_time_calls_runs_the_warmup_untimed_then_times_each_rep():
    calls: list[int] = []
    times = time_calls(lambda: calls.append(1), warmup=2, reps=3)
    assert len(calls) == 5 and len(times) == 3 and all(t >= 0 for t in times)


def test_emit_timings_writes_the_body_with_its_times_then_a_step_of_their_total():
    stream = io.StringIO()
    emit_timings({"event": "exchange", "bytes": 64}, [0.5, 0.25], 7, stream)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first == {"event": "exchange", "bytes": 64, "times": [0.5, 0.25]}
    step = ev.from_record(second)
    assert (step.step, step.phase, step.images) == (7, "exchange", 0)
    assert step.duration == 0.75 and abs(step.end - step.start - 0.75) < 1e-6


def test_tf_config_workers_reads_the_cluster_or_falls_back(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"index": 1}}))
    assert tf_config_workers() == (["a:1", "b:2"], 1)
    monkeypatch.delenv("TF_CONFIG")
    assert tf_config_workers(("127.0.0.1:0",)) == (["127.0.0.1:0"], 0) and tf_config_workers() == ([], 0)
