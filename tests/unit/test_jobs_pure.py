"""Pure parts of the training modes: step analysis, datasets, model shapes, launch roles."""

from __future__ import annotations

import numpy as np
import pytest

from netbench.jobs import analysis
from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets
from netbench.model.job import JobSpec
from netbench.jobs.harness.models import check_input, format_input_shape, parse_input_shape
from netbench.jobs.harness.ps import task_of


def step(worker, number, duration, phase="measured", role="worker", compute=None, comm=None, executor=None):
    return ev.Step(step=number, phase=phase, duration=duration, worker=worker, role=role,
                   compute=compute, comm=comm, executor=executor)


# ---------------------------------------------------------------- analysis


def test_sync_per_worker_rates_count_accumulated_batches():
    job = JobSpec(strategy="allreduce-accum", batch_size=10, accum_steps=4)
    events = [step(0, 0, 9.0, "warmup"), step(0, 1, 0.5), step(0, 2, 0.5), step(1, 1, 1.0), step(1, 2, 1.0)]
    assert analysis.per_worker_images_per_sec(events, job, 2) == pytest.approx((80.0, 40.0))
    plain = JobSpec(batch_size=10)
    assert analysis.per_worker_images_per_sec(events, plain, 2) == pytest.approx((20.0, 10.0))


def test_ps_reference_is_the_coordinator_and_rates_come_from_executors():
    job = JobSpec(strategy="ps", batch_size=8)
    events = [ev.Start(worker=0, role="worker"), ev.Start(worker=0, role="ps"),
              ev.Start(worker=0, role="coordinator", params=5, model_bytes=20, input_shape=(28, 28, 1), classes=7),
              step(0, 0, 3.0, "warmup", role="coordinator", executor=1),
              step(0, 1, 0.25, role="coordinator", executor=0), step(0, 2, 0.25, role="coordinator", executor=1),
              step(0, 3, 0.5, role="coordinator", executor=0)]
    ref = analysis.reference_events(events, job)
    assert [e.role for e in ref] == ["coordinator"] * 5
    # window 1.0 s: worker 0 completed 2 steps, worker 1 one (its warm-up step does not count)
    assert analysis.per_worker_images_per_sec(events, job, 2) == pytest.approx((16.0, 8.0))
    assert analysis.model_facts(events, job) == {"params": 5, "model_bytes": 20, "input_shape": "28x28x1",
                                                  "classes": 7}


def test_events_without_role_are_workers():
    job = JobSpec(batch_size=4)
    events = [ev.Step(step=0, phase="measured", duration=0.5, worker=0)]
    assert analysis.reference_events(events, job) == events
    assert analysis.per_worker_images_per_sec(events, job, 1) == pytest.approx((8.0,))


def test_run_record_objects_read_as_events():
    job = JobSpec(batch_size=4)
    records = [{"event": "step", "step": 1, "phase": "measured", "duration": 0.25, "worker": 0},
               {"event": "step", "step": 0, "phase": "measured", "duration": 0.5, "worker": 0},
               {"event": "step", "step": 0, "phase": "measured", "duration": 9.0, "worker": 1}]
    assert analysis.measured_durations(records, job) == [0.5, 0.25]
    assert analysis.per_worker_images_per_sec(records, job, 1) == pytest.approx((32 / 3,))


def test_images_per_sec_needs_time():
    assert analysis.images_per_sec(64, 0.5) == 128.0
    assert analysis.images_per_sec(64, 0.0) is None


def test_phase_times_and_idleness_over_measured_steps():
    job = JobSpec()
    events = [step(0, 0, 5.0, "warmup", compute=1.0, comm=4.0),
              step(0, 1, 1.0, compute=0.25, comm=0.75), step(1, 1, 1.0, compute=0.75, comm=0.25),
              step(0, 2, 1.0, compute=0.5, comm=0.5)]
    times = analysis.phase_times(events, job)
    assert times.compute_mean_s == pytest.approx(0.5)
    assert times.comm_mean_s == pytest.approx(0.5)
    assert times.idle_ratio == pytest.approx(0.5)
    assert analysis.phase_times([step(0, 1, 1.0)], job) is None  # no split recorded
    assert analysis.phase_times([step(0, 1, 1.0, compute=0.0, comm=0.0)], job) is None


def test_idleness_of_ps_is_the_coordinators_record():
    job = JobSpec(strategy="ps")
    events = [step(0, 1, 0.1, role="coordinator", compute=0.2, comm=0.6, executor=0),
              step(0, 1, 0.1, role="worker", compute=1.0, comm=0.0)]
    assert analysis.phase_times(events, job).idle_ratio == pytest.approx(0.75)


# ---------------------------------------------------------------- datasets


def test_npz_uint8_images_are_scaled_and_get_a_channel(tmp_path):
    path = tmp_path / "mnist.npz"
    x = np.arange(6 * 4 * 4, dtype=np.uint8).reshape(6, 4, 4)
    np.savez(path, x_train=x, y_train=np.array([0, 1, 2, 0, 1, 2], dtype=np.uint8), x_test=x)
    data = datasets.load(None, str(path), None)
    assert data.x.shape == (6, 4, 4, 1) and data.x.dtype == np.float32
    assert data.x.max() == pytest.approx(95 / 255)
    assert data.classes == 3 and data.y.dtype == np.int32 and data.input_shape == (4, 4, 1)


def test_npz_labels_of_shape_n_by_1_are_flattened(tmp_path):
    path = tmp_path / "cifar.npz"
    np.savez(path, x_train=np.zeros((4, 2, 2, 3), np.float32), y_train=np.array([[1], [3], [0], [2]]))
    data = datasets.load_npz(str(path))
    assert data.y.tolist() == [1, 3, 0, 2] and data.classes == 4


@pytest.mark.parametrize("arrays, message", [
    ({"x_train": np.zeros((3, 2))}, "missing y_train"),
    ({"x_train": np.zeros((3, 2)), "y_train": np.zeros(2)}, "3 examples but y_train has 2"),
    ({"x_train": np.zeros((3, 2)), "y_train": np.array([0.5, 1, 2])}, "integer class labels"),
    ({"x_train": np.zeros((3, 2)), "y_train": np.array([-1, 1, 2])}, "label -1 is negative"),
    ({"x_train": np.zeros((2, 2)), "y_train": np.zeros((2, 3))}, "one integer label per example"),
])
def test_bad_npz_names_the_file_and_the_problem(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(datasets.DataError, match=message) as info:
        datasets.load_npz(str(path))
    assert str(path) in str(info.value)


def test_check_source(tmp_path):
    datasets.check_source("synthetic")
    datasets.check_source(str(tmp_path))
    with pytest.raises(datasets.DataError, match="no such file or folder"):
        datasets.check_source(str(tmp_path / "missing.npz"))
    other = tmp_path / "data.csv"
    other.write_text("1,2\n")
    with pytest.raises(datasets.DataError, match="not an .npz"):
        datasets.check_source(str(other))


def test_class_folders_need_two_classes_with_images(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.png").write_bytes(b"")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("x")
    with pytest.raises(datasets.DataError, match="at least two class folders"):
        datasets.class_folders(str(tmp_path))
    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "b.JPG").write_bytes(b"")
    assert [name for name, _ in datasets.class_folders(str(tmp_path))] == ["cat", "dog"]


def test_shards_are_disjoint_and_cover_the_data():
    data = datasets.Dataset(np.arange(10, dtype=np.float32).reshape(10, 1), np.arange(10, dtype=np.int32), 10)
    shards = [datasets.shard(data, i, 3) for i in range(3)]
    seen = sorted(int(v) for s in shards for v in s.y)
    assert seen == list(range(10))
    assert shards[1].y.tolist() == [1, 4, 7]
    with pytest.raises(datasets.DataError, match="fewer than the 20 workers"):
        datasets.shard(data, 0, 20)


def test_batches_are_whole_and_wrap_a_small_shard():
    data = datasets.Dataset(np.arange(5, dtype=np.float32).reshape(5, 1), np.arange(5, dtype=np.int32), 5)
    out = datasets.batches(data, 2)
    assert [b[1].tolist() for b in out] == [[0, 1], [2, 3]]
    small = datasets.batches(data, 8)
    assert len(small) == 1 and small[0][1].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


def test_synthetic_data_is_seeded():
    a = datasets.synthetic((3, 3, 1), 4, 6, seed=1)
    b = datasets.synthetic((3, 3, 1), 4, 6, seed=1)
    c = datasets.synthetic((3, 3, 1), 4, 6, seed=2)
    assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, c.x)
    assert a.x.shape == (6, 3, 3, 1) and a.y.max() < 4


# ---------------------------------------------------------------- models and roles


@pytest.mark.parametrize("text, shape", [("32x32x3", (32, 32, 3)), ("784", (784,)), (" 28X28x1 ", (28, 28, 1))])
def test_parse_input_shape(text, shape):
    assert parse_input_shape(text) == shape
    assert parse_input_shape(format_input_shape(shape)) == shape


@pytest.mark.parametrize("text", ["", "32x", "axb", "0x3", "-1"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(ValueError):
        parse_input_shape(text)


@pytest.mark.parametrize("model, shape, classes, message", [
    ("cnn", (784,), 10, "needs an image shape"),
    ("mobilenetv2", (16, 16, 3), 10, "at least 32x32"),
    ("mlp", (784,), 1, "at least 2"),
    ("alexnet", (32, 32, 3), 10, "unknown model"),
])
def test_check_input_rejects(model, shape, classes, message):
    with pytest.raises(ValueError, match=message):
        check_input(model, shape, classes)


def test_check_input_accepts_any_shape_for_the_mlp():
    check_input("mlp", (28, 28, 1), 10)
    check_input("resnet18", (8, 8, 1), 2)


def test_ps_role_from_tf_config():
    assert task_of('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}') == \
        ("ps", 0, {"ps": ["a:1"]})
    with pytest.raises(ValueError, match="TF_CONFIG"):
        task_of("")


def test_farewell_waits_for_every_peer_then_lingers_for_the_last_small_collective():
    """A worker leaves a collective job only after two barriers (the first proves every peer
    finished its earlier transfers) and a linger of four timed barriers, capped."""
    from netbench.jobs.harness.strategy import FAREWELL_LINGER_MAX_S, farewell

    now = [100.0]
    calls, slept = [], []

    def barrier():
        calls.append(now[0])
        now[0] += 0.05  # each small collective takes 50 ms here

    linger = farewell(barrier, sleep=slept.append, clock=lambda: now[0])
    assert len(calls) == 2
    assert linger == pytest.approx(0.1 + 4 * 0.05) and slept == [linger]

    def slow_barrier():
        now[0] += 10.0

    assert farewell(slow_barrier, sleep=slept.append, clock=lambda: now[0]) == FAREWELL_LINGER_MAX_S


def test_an_own_pace_strategys_images_per_sec_is_the_sum_of_its_workers_rates():
    from netbench import stats as measure
    from netbench.jobs import analysis
    from netbench.model.job import JobSpec

    # the chief steps every 10 ms (64 images), the straggler every 40 ms: the cluster trains
    # 6,400 + 1,600 images/s, not twice the chief's 6,400
    from netbench.jobs import events as ev

    chief = measure.step_stats([0.01] * 20, 128)
    stats = dict(chief.__dict__)
    asynchronous = JobSpec(strategy="ps-async", batch_size=64)
    events = [ev.Step(step=k, phase="measured", duration=0.01, worker=0) for k in range(20)]
    events += [ev.Step(step=k, phase="measured", duration=0.04, worker=1) for k in range(5)]
    out = analysis.cluster_throughput(stats, events, asynchronous, 2)
    assert out["images_per_sec"] == pytest.approx(8000.0) and out["mean_s"] == stats["mean_s"]
    assert out["images_per_sec_stderr"] == pytest.approx(stats["images_per_sec_stderr"] * 8000 / 12800)
    # a synchronous strategy's workers leave each step together: the chief's steps say it
    assert analysis.cluster_throughput(stats, events, JobSpec(strategy="ps-sync", batch_size=64), 2) == stats
    # a worker without measured steps: nothing to sum
    assert analysis.cluster_throughput(stats, events[:20], asynchronous, 2) == stats


def test_fashion_mnist_fits_only_a_model_that_takes_flat_samples_and_both_entry_points_refuse_the_rest(tmp_path):
    from click.testing import CliRunner

    from netbench.cli import app as cli

    datasets.check_fits("mlp", datasets.FASHION_MNIST)
    datasets.check_fits("cnn", datasets.SYNTHETIC)  # other sources are checked once loaded
    with pytest.raises(datasets.DataError, match="model cnn needs images HxWxC, and fashion-mnist gives 784 values"):
        datasets.check_fits("cnn", datasets.FASHION_MNIST)
    # it was a failure in every worker at run time; now the flag, or the playbook's key, before anything starts
    result = CliRunner().invoke(cli.main, ["sweep", "--model", "resnet18", "--data", "fashion-mnist", "--latency",
                                           "1ms", "--dry-run"])
    assert result.exit_code != 0 and "flag --model: model resnet18 needs images" in result.output, result.output
    book = tmp_path / "b.yaml"
    book.write_text("name: b\nfactors:\n  latency: [1ms]\nfixed:\n  model: cnn\n  data: fashion-mnist\n  workers: 2\n")
    result = CliRunner().invoke(cli.main, ["run", str(book), "--output", str(tmp_path / "out")])
    assert result.exit_code != 0 and f"{book}: fixed.model: model cnn needs images" in result.output, result.output
    assert not (tmp_path / "out").exists()
