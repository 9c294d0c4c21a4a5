"""Who waits for whom: the per-rank attribution's arithmetic (pure, over typed step events)."""

from __future__ import annotations

import pytest

from netbench.jobs import events as ev
from netbench.jobs import stragglers
from netbench.model.job import JobSpec

NODES = ("n1", "n2", "n3")


def step(worker, number, duration, compute=None, phase="measured", wait=None, role="worker", executor=None,
         extra=()):
    comm = None if compute is None else duration - compute - (wait or 0.0)
    return ev.Step(step=number, phase=phase, duration=duration, worker=worker, role=role, compute=compute,
                   comm=comm, wait=wait, executor=executor, extra=extra)


def sync_run(slow_compute=0.3, fast_compute=0.1, comm=0.02, steps=10):
    """Two ranks that leave every step together: rank 1 computes longer, rank 0 waits for it."""
    events = []
    for k in range(steps):
        duration = slow_compute + comm
        events += [step(0, k, duration, compute=fast_compute), step(1, k, duration, compute=slow_compute)]
    return events


def test_the_rank_whose_computation_ended_last_is_the_straggler_and_the_others_wait_for_it():
    found = stragglers.attribute(sync_run(), JobSpec(strategy="allreduce", batch_size=8), NODES)
    assert found.mode == stragglers.SYNC and found.aligned_steps == 10
    assert (found.straggler, found.straggler_node, found.straggler_share) == (1, "n2", 1.0)
    # rank 0 waited 0.2 s of its 0.32 s step for rank 1: tails 0.22 and 0.02
    assert found.wait_share == pytest.approx(0.2 / 0.32)
    assert found.rank_of(0).waited_mean_s == pytest.approx(0.2) and found.rank_of(1).waited_mean_s == 0
    assert (found.rank_of(0).last_share, found.rank_of(1).last_share) == (0.0, 1.0)
    record = found.to_record()
    assert stragglers.sentence(record) == "n2 was the last to finish in 100 % of steps; the others waited 62 % of their step"
    cells = stragglers.csv_cells(record)
    assert (cells["straggler"], cells["straggler_share"], cells["wait_share"], cells["dropped_gradients"]) == \
        ("n2", 1.0, 0.625, "")


def test_the_share_counts_steps_each_rank_was_last_and_clock_offsets_do_not_matter():
    events = []
    for k in range(10):  # rank 2 is last in 7 steps, rank 0 in 3; each process has its own clock
        slow = 2 if k < 7 else 0
        for r in range(3):
            compute = 0.3 if r == slow else 0.1
            events.append(ev.Step(step=k, duration=0.32, compute=compute, comm=0.32 - compute, worker=r,
                                  start=1000.0 * r + k, end=1000.0 * r + k + 0.32))
    found = stragglers.attribute(events, JobSpec(strategy="ps-sync"), NODES)
    assert (found.straggler_node, found.straggler_share) == ("n3", pytest.approx(0.7))
    assert found.rank_of(0).last_share == pytest.approx(0.3) and found.rank_of(1).last_share == 0


def test_steps_not_every_rank_reported_and_warmup_are_left_out():
    events = sync_run(steps=4) + [step(0, 4, 0.5, compute=0.4)]  # rank 1 never reported step 4
    events += [step(0, 99, 5.0, compute=0.1, phase="warmup"), step(1, 99, 5.0, compute=4.9, phase="warmup")]
    found = stragglers.attribute(events, JobSpec(strategy="allreduce"), NODES)
    assert found.aligned_steps == 4 and found.straggler == 1


def test_fused_steps_are_attributed_from_the_calibration_steps_or_not_at_all():
    fused = [step(r, k, 0.3) for k in range(5) for r in (0, 1)]
    calibration = [step(r, 5 + k, 0.32, compute=0.3 if r == 0 else 0.1, phase="calibration")
                   for k in range(3) for r in (0, 1)]
    found = stragglers.attribute(fused + calibration, JobSpec(strategy="allreduce"), NODES)
    assert (found.straggler_node, found.source, found.aligned_steps) == ("n1", "calibration", 3)
    unknown = stragglers.attribute(fused, JobSpec(strategy="allreduce"), NODES)
    assert unknown.straggler is None and stragglers.sentence(unknown.to_record()) is None
    assert [r.steps for r in unknown.ranks] == [5, 5]  # per-rank step times all the same


def test_own_pace_strategies_name_the_slowest_rate_and_the_spread():
    events = [step(0, k, 0.1, compute=0.09, wait=0.0) for k in range(20)]
    events += [step(1, k, 0.25, compute=0.24, wait=0.0) for k in range(8)]
    found = stragglers.attribute(events, JobSpec(strategy="ps-async", batch_size=10), NODES)
    assert found.mode == stragglers.OWN_PACE and found.straggler_share is None
    assert (found.straggler_node, found.rate_spread) == ("n2", pytest.approx(2.5))
    assert [r.images_per_sec for r in found.ranks] == pytest.approx([100.0, 40.0])
    assert stragglers.sentence(found.to_record()) == \
        "n2 trained at the lowest rate: 40.0 images/s against 100.0 (2.5x)"
    even = [step(r, k, 0.1, compute=0.09) for k in range(5) for r in (0, 1)]
    assert stragglers.attribute(even, JobSpec(strategy="gosgd"), NODES).straggler is None


def test_ps_sync_with_backup_workers_runs_at_its_own_pace_and_counts_dropped_gradients():
    dropped = (("dropped", True),)
    events = [step(0, k, 0.1, compute=0.09, wait=0.0, extra=(("dropped", False),)) for k in range(10)]
    events += [step(1, k, 0.4, compute=0.39, wait=0.0, extra=dropped if k % 2 else ()) for k in range(4)]
    found = stragglers.attribute(events, JobSpec(strategy="ps-sync", batch_size=10), NODES, backup_workers=1)
    assert found.mode == stragglers.OWN_PACE and found.straggler_node == "n2"
    assert [r.dropped for r in found.ranks] == [0, 2]
    assert stragglers.csv_cells(found.to_record())["dropped_gradients"] == 2


def test_tf_ps_ranks_are_the_coordinators_executors_and_one_rank_names_nobody():
    events = [step(0, k, 0.1, role="coordinator", executor=0 if k % 3 else 1) for k in range(9)]
    found = stragglers.attribute(events, JobSpec(strategy="ps", batch_size=10), NODES)
    assert [(r.rank, r.steps) for r in found.ranks] == [(0, 6), (1, 3)] and found.straggler_node == "n2"
    alone = [step(0, k, 0.1, compute=0.05) for k in range(5)]
    assert stragglers.attribute(alone, JobSpec(strategy="allreduce"), NODES) is None
    assert stragglers.csv_cells(None) == {name: "" for name in stragglers.COLUMNS}


def test_record_events_are_read_as_typed_events():
    records = [ev.to_record(e) for e in sync_run(steps=3)]
    assert stragglers.attribute(records, JobSpec(strategy="allreduce"), NODES).straggler == 1


def test_ranks_tied_in_every_step_name_nobody():
    tied = [step(r, k, 0.3, compute=0.15) for k in range(5) for r in (0, 1)]
    found = stragglers.attribute(tied, JobSpec(strategy="allreduce"), NODES)
    assert found.straggler is None and found.wait_share == 0 and found.aligned_steps == 5
    assert stragglers.csv_cells(found.to_record())["straggler"] == ""


def test_a_run_record_and_its_row_name_the_straggler_and_the_terminal_says_so(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from netbench import console
    from netbench.cli import render as ui
    from netbench.experiment.runner import SweepConfig, make_result
    from netbench.jobs.launch import JobOutcome
    from netbench.model.profile import Profile
    from netbench.model.run import Run

    job = JobSpec(strategy="allreduce", batch_size=8, warmup=0, steps=10)
    run = Run(index=0, profile=Profile(name="d1ms", delay_us=1000), repeat=0, job=job, workers=2)
    result = make_result(run, "userspace", JobOutcome("ok", tuple(sync_run())), 0.0, 1.0, nodes=("n1", "n2"))
    assert result.stragglers["straggler_node"] == "n2" and len(result.stragglers["ranks"]) == 2
    row = result.csv_row()
    assert (row["straggler"], row["straggler_share"], row["wait_share"]) == ("n2", 1.0, 0.625)
    out = io.StringIO()
    monkeypatch.setattr(console, "out", Console(file=out, width=300, highlight=False, soft_wrap=True))
    config = SweepConfig(sweep_id="s", runs=(run,), job=job, workers=2, output=tmp_path)
    with ui.SweepView(config) as view:
        view.run_started(run)
        view.run_finished(run, result)
    assert "n2 was the last to finish in 100 % of steps; the others waited 62 % of their step" in out.getvalue()


def test_the_report_has_a_row_per_run_with_its_straggler_and_each_ranks_step(tmp_path):
    from netbench.experiment.runner import make_result
    from netbench.experiment.store import ResultStore
    from netbench.jobs.launch import JobOutcome
    from netbench.model.profile import Profile
    from netbench.model.run import Run
    from netbench.report.document import Table, to_markdown
    from netbench.report.stragglers import straggler_blocks
    from netbench.report.summary import write_report

    store = ResultStore(tmp_path / "out")
    store.create()
    assert straggler_blocks(tmp_path / "out") == []  # no runs, no section
    job = JobSpec(strategy="allreduce", batch_size=8, warmup=0, steps=10)
    for index, delay in enumerate((1000, 10_000)):
        run = Run(index=index, profile=Profile(name=f"d{delay // 1000}ms", delay_us=delay), repeat=0, job=job,
                  workers=2)
        store.add(make_result(run, "userspace", JobOutcome("ok", tuple(sync_run())), 0.0, 1.0, nodes=("n1", "n2")))
    blocks = straggler_blocks(tmp_path / "out")
    table = next(b for b in blocks if isinstance(b, Table))
    assert table.rows[0] == ("r000", "allreduce", "d1ms", "n2", "100 %", "62 %", "1.00x", "n1 320.0 ms, n2 320.0 ms")
    assert len(table.rows) == 2
    written = write_report(tmp_path / "out", tmp_path / "report")
    assert "## Who waits for whom" in (tmp_path / "report" / "report.md").read_text()
    assert "Who waits for whom" in to_markdown(blocks) and written.files


def test_a_users_job_through_track_is_attributed_per_rank_as_a_synchronous_one():
    from netbench.jobs.launch import JobOutcome
    from netbench.experiment.runner import make_result
    from netbench.model.command_job import UserCommand
    from netbench.model.job import command_spec
    from netbench.model.profile import Profile
    from netbench.model.run import Run

    job = command_spec(JobSpec(warmup=0, steps=10), UserCommand(argv=("python", "train.py")), 2)
    assert stragglers.mode_of(job) == stragglers.SYNC
    # each rank's track events (compute and comm from track.computed()), kept apart by rank
    events = [ev.received(ev.Step(step=k, duration=0.32, compute=0.3 if rank else 0.1,
                                  comm=0.02 if rank else 0.22, images=16), rank, "worker", 0.0)
              for k in range(10) for rank in (0, 1)]
    run = Run(index=0, profile=Profile(name="d1ms", delay_us=1000), repeat=0, job=job, workers=2)
    result = make_result(run, "userspace", JobOutcome("ok", tuple(events)), 0.0, 1.0, nodes=("n1", "n2"))
    assert stragglers.sentence(result.stragglers).startswith("n2 was the last to finish in 100 % of steps")


def test_fused_steps_that_say_when_their_computation_ended_are_attributed_themselves():
    """netbench's TensorFlow worker times the end of a fused step's computation inside the
    compiled step (`computed`): a default all-reduce sweep names who finished last from its
    measured steps, no split and no calibration needed; the split columns stay empty."""
    fused = [ev.Step(step=k, duration=0.32, computed=0.3 if r == 1 else 0.1, worker=r, role="worker")
             for k in range(6) for r in (0, 1)]
    found = stragglers.attribute(fused, JobSpec(strategy="allreduce"), NODES)
    assert (found.straggler_node, found.source, found.aligned_steps) == ("n2", "measured", 6)
    assert found.wait_share == pytest.approx(0.2 / 0.32)
    assert found.rank_of(0).compute_mean_s is None  # a fused step is no compute/comm split


def test_a_fused_steps_end_of_computation_travels_on_the_wire_and_in_the_record():
    import json

    event = ev.step_event(3, ev.PHASE_MEASURED, 10.0, 10.5, 64, 0.7, computed=0.31)
    back = ev.parse_line(json.dumps(ev.to_wire(event)))
    assert back.computed == 0.31 and back.compute is None and back.computation == 0.31
    assert ev.from_record(ev.to_record(back)).computed == 0.31
    assert "computed" not in ev.to_wire(ev.step_event(3, ev.PHASE_MEASURED, 10.0, 10.5, 64, 0.7))


def test_the_harness_reports_a_fused_steps_end_of_computation_when_the_framework_gives_it():
    import io
    import json

    from netbench.jobs.harness.loop import timed_update

    out = io.StringIO()

    def split():
        raise AssertionError("a fused step")

    timed_update(0, ev.PHASE_MEASURED, ev.STEP_FUSED, split, lambda: (5.0, 5.4, 0.9, 5.25), 64, out)
    timed_update(1, ev.PHASE_MEASURED, ev.STEP_FUSED, split, lambda: (6.0, 6.4, 0.9), 64, out)  # torch's: no time
    timed_update(2, ev.PHASE_MEASURED, ev.STEP_FUSED, split, lambda: (7.0, 7.4, 0.9, 9.0), 64, out)  # outside: none
    said = [json.loads(line) for line in out.getvalue().splitlines()]
    assert said[0]["computed"] == pytest.approx(0.25) and said[0]["compute"] is None
    assert "computed" not in said[1] and "computed" not in said[2]
