"""Calibrations kept and reused: the key (everything a calibration measured), the age and
kernel rules, the cache folder, and a sweep's calibrate() reusing, with the measurements faked."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from netbench.experiment import calibration_cache as cc
from netbench.experiment import predict
from netbench.experiment.store import CSV_COLUMNS, RunResult
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.model.run import Run

HOST = cc.Host(machine_id="m1", kernel="6.1.0", cpus=2, python="3.11.2", netbench="0.1.0",
               frameworks=(("tensorflow-cpu", "2.21.0"),))
PLACE = {"testbed": "embedded", "backend": "tbf", "congestion_control": "cubic"}


def key(kind="compute", measured=None, place=None, host=HOST) -> cc.Key:
    measured = measured if measured is not None else predict.compute_measured(JobSpec(model="mlp"), 2)
    return cc.make_key(kind, measured, place if place is not None else PLACE, host)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_id_is_stable_and_changes_with_everything_the_calibration_measured():
    base = cc.calibration_id(key())
    assert base == cc.calibration_id(key()) and base.startswith("compute-") and len(base) == len("compute-") + 12
    # the same key from its JSON (a cache file's) names the same calibration
    assert cc.calibration_id(key().to_json()) == base
    others = [
        key(measured=predict.compute_measured(JobSpec(model="cnn"), 2)),
        key(measured=predict.compute_measured(JobSpec(model="mlp", batch_size=32), 2)),
        key(measured=predict.compute_measured(JobSpec(model="mlp"), 4)),  # processes and nodes
        key(measured=predict.compute_measured(JobSpec(model="mlp", framework="torch"), 2)),
        key(place={**PLACE, "backend": "userspace"}),
        key(place={**PLACE, "congestion_control": "bbr"}),
        key(host=replace(HOST, kernel="6.8.0")),
        key(host=replace(HOST, cpus=16)),
        key(host=replace(HOST, machine_id="m2")),
        key(host=replace(HOST, netbench="0.2.0")),
        key(host=replace(HOST, frameworks=(("tensorflow-cpu", "2.22.0"),))),
        key("allreduce", predict.allreduce_measured(2)),
        key("allreduce", predict.allreduce_measured(2, framework="torch")),
    ]
    ids = {cc.calibration_id(k) for k in others}
    assert base not in ids and len(ids) == len(others)
    assert predict.allreduce_measured(2) != predict.allreduce_measured(4)
    with pytest.raises(ValueError):
        cc.make_key("gpu", {}, PLACE, HOST)


def entry(k: cc.Key, measured_at: float) -> cc.Entry:
    return cc.Entry(id=cc.calibration_id(k), key=k.to_json(), measured_at=measured_at, value={"compute_s": 0.01})


def test_a_calibration_is_reused_within_24_hours_on_the_same_kernel_only():
    k, now = key(), 1_000_000.0
    assert cc.MAX_AGE_S == 24 * 3600
    assert cc.refusal(entry(k, now - 3600), k, now) is None
    assert cc.refusal(entry(k, now - cc.MAX_AGE_S + 1), k, now) is None
    assert "over the 24 h limit" in cc.refusal(entry(k, now - cc.MAX_AGE_S - 1), k, now)
    assert "future" in cc.refusal(entry(k, now + 60), k, now)
    # a file of another kernel (copied, or the key's kernel edited) is never reused
    other_kernel = key(host=replace(HOST, kernel="6.8.0"))
    assert "kernel 6.8.0" in cc.refusal(entry(other_kernel, now), k, now)
    assert cc.refusal(replace(entry(k, now), schema=cc.SCHEMA + 1), k, now).startswith("written by another")
    assert cc.refusal(entry(key(place={**PLACE, "backend": "htb"}), now), k, now) == "measured something else"
    assert cc.refusal(entry(k, now - 7200), k, now, max_age_s=3600) is not None


def test_the_cache_keeps_a_calibration_and_finds_it_again(tmp_path):
    clock = Clock()
    cache = cc.CalibrationCache(tmp_path / "cal", clock=clock)
    k = key()
    assert cache.lookup(k) == (None, "none cached")
    stored, unkept = cache.store(k, {"compute_s": 0.0123, "model_bytes": 42}, {"seconds": 5.0})
    assert unkept is None and stored.id == cc.calibration_id(k)
    on_disk = json.loads((tmp_path / "cal" / f"{stored.id}.json").read_text())
    assert on_disk["schema"] == cc.SCHEMA and on_disk["key"]["host"]["kernel"] == "6.1.0"
    clock.now += 3600
    found, why = cache.lookup(k)
    assert why == "" and found.value == {"compute_s": 0.0123, "model_bytes": 42} and found.facts == {"seconds": 5.0}
    clock.now += cc.MAX_AGE_S
    assert cache.lookup(k)[0] is None and "h old" in cache.lookup(k)[1]
    (tmp_path / "cal" / f"{stored.id}.json").write_text("{torn")
    assert cache.lookup(k)[0] is None and "unreadable" in cache.lookup(k)[1]


def test_a_cache_that_cannot_be_written_keeps_nothing_and_fails_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = cc.CalibrationCache(blocker / "cal", clock=Clock())
    stored, unkept = cache.store(key(), {"compute_s": 1.0}, {})
    assert unkept is not None and "not kept" in unkept and stored.id == cc.calibration_id(key())
    assert cache.lookup(key())[0] is None


def test_the_cache_folder_comes_from_the_environment(tmp_path):
    assert cc.default_folder({"NETBENCH_CACHE_DIR": "/c", "NETBENCH_STATE_DIR": "/s"}) == cc.Path("/c")
    assert cc.default_folder({"NETBENCH_STATE_DIR": "/s"}) == cc.Path("/s/calibrations")
    assert cc.default_folder({"XDG_CACHE_HOME": "/x"}) == cc.Path("/x/netbench/calibrations")
    assert cc.default_folder({}).parts[-3:] == (".cache", "netbench", "calibrations")


def test_the_host_facts_name_this_machine():
    host = cc.host_facts()
    assert host.machine_id and host.kernel and host.cpus >= 1 and host.netbench


# calibrate() with the measurements faked: the first sweep measures, the second reuses

class FakeMeasures:
    def __init__(self, monkeypatch) -> None:
        from netbench.experiment import exchange_calibration
        from netbench.model.collective import AlphaBeta

        self.calls: list[str] = []

        def collective(testbed, workers, log_dir, port, ranks_per_node=1, framework="tensorflow"):
            self.calls.append(f"allreduce/{workers}" + ("" if framework == "tensorflow" else f"/{framework}"))
            alpha = 0.0015 if framework == "tensorflow" else 0.0005
            return AlphaBeta(alpha, 2e-9), {"alpha_s": alpha, "beta_s_per_byte": 2e-9, "seconds": 3.0}

        def compute(testbed, job, workers, log_dir, port):
            self.calls.append(f"compute/{job.model}")
            return predict.Compute(0.002, 2_678_824), {"compute_s": 0.002, "model_bytes": 2_678_824, "seconds": 4.0}

        def exchange(testbed, log_dir, port):
            self.calls.append("exchange")
            return exchange_calibration.Exchange(0.0002, 1.5e-9, 4 << 20), {"seconds": 1.0}

        def base(testbed, job, workers, log_dir, port):
            self.calls.append(f"base/{job.strategy}")
            return 0.011, {"step_s": 0.011, "steps": 30, "seconds": 6.0}

        from netbench.experiment import base_calibration

        monkeypatch.setattr(base_calibration, "measure", base)
        monkeypatch.setattr(predict, "measure_collective", collective)
        monkeypatch.setattr(predict, "measure_compute", compute)
        monkeypatch.setattr(exchange_calibration, "measure", exchange)


def runs() -> tuple[Run, ...]:
    profile = Profile(name="p", delay_us=10_000, rate_bps=100_000_000)
    return (Run(index=0, profile=profile, repeat=0, job=JobSpec(strategy="allreduce", model="mlp"), workers=2),
            Run(index=1, profile=profile, repeat=0, job=JobSpec(strategy="ps-sync", model="mlp"), workers=2))


def test_a_second_sweep_with_the_same_key_reuses_the_calibrations_and_says_so(tmp_path, monkeypatch):
    fakes, clock = FakeMeasures(monkeypatch), Clock()
    reuse = predict.Reuse(place=PLACE, host=HOST, cache=cc.CalibrationCache(tmp_path, clock=clock))
    first_notes: list[str] = []
    first, record = predict.calibrate(runs(), None, tmp_path / "logs", first_notes.append, reuse=reuse)
    assert sorted(fakes.calls) == ["allreduce/2", "base/ps-sync", "compute/mlp", "exchange"]
    assert not any("reused" in n for n in first_notes) and not record["errors"]
    assert any("ps-sync base step 11.0 ms" in n for n in first_notes)
    assert record["collective"]["2"]["reused"] is False and record["collective"]["2"]["id"].startswith("allreduce-")
    clock.now += 600
    fakes.calls.clear()
    second_notes: list[str] = []
    second, record = predict.calibrate(runs(), None, tmp_path / "logs", second_notes.append, reuse=reuse)
    assert fakes.calls == []  # nothing measured again
    assert sum("reused" in n for n in second_notes) == 4 and "measured 10 min ago" in second_notes[0]
    assert record["exchange"]["reused"] is True and record["compute"]["mlp/b64///synthetic/w2"]["reused"] is True
    assert second == first  # the same fits, the same ids
    # each run records the calibrations its prediction used: the exchange one for ps-sync only
    result = RunResult(run_id="r000", profile=runs()[0].profile.to_record(), backend="tbf", strategy="allreduce",
                       model="mlp", batch_size=64, workers=2, repeat=0, warmup_steps=1, status="ok")
    plain, exchange = (predict.annotate(result, run, second) for run in runs())
    assert plain.calibration_id.count("+") == 1 and plain.calibration_id.startswith("compute-")
    assert exchange.calibration_id.count("+") == 3 and second.ids["exchange"] in exchange.calibration_id
    assert exchange.calibration_id.split("+")[-1].startswith("base-") and second.base  # the base step's id too
    assert "calibration_id" in CSV_COLUMNS and plain.csv_row()["calibration_id"] == plain.calibration_id
    # --recalibrate measures everything again and keeps the new ones
    fakes.calls.clear()
    predict.calibrate(runs(), None, tmp_path / "logs", [].append, reuse=replace(reuse, recalibrate=True))
    assert sorted(fakes.calls) == ["allreduce/2", "base/ps-sync", "compute/mlp", "exchange"]


def test_an_old_or_other_kernel_calibration_is_measured_again(tmp_path, monkeypatch):
    fakes, clock = FakeMeasures(monkeypatch), Clock()
    reuse = predict.Reuse(place=PLACE, host=HOST, cache=cc.CalibrationCache(tmp_path, clock=clock))
    predict.calibrate(runs()[:1], None, tmp_path / "logs", [].append, reuse=reuse)
    clock.now += cc.MAX_AGE_S + 1
    fakes.calls.clear()
    notes: list[str] = []
    predict.calibrate(runs()[:1], None, tmp_path / "logs", notes.append, reuse=reuse)
    assert sorted(fakes.calls) == ["allreduce/2", "compute/mlp"] and any("over the 24 h limit" in n for n in notes)
    fakes.calls.clear()  # another kernel: another key, so nothing of the old one's is found
    predict.calibrate(runs()[:1], None, tmp_path / "logs", [].append,
                      reuse=replace(reuse, host=replace(HOST, kernel="6.8.0")))
    assert sorted(fakes.calls) == ["allreduce/2", "compute/mlp"]


def test_without_a_cache_every_calibration_is_measured_and_still_named(tmp_path, monkeypatch):
    fakes = FakeMeasures(monkeypatch)
    reuse = predict.Reuse(place=PLACE, host=HOST, cache=None)
    for _ in range(2):
        predictor, record = predict.calibrate(runs()[:1], None, tmp_path / "logs", [].append, reuse=reuse)
    assert fakes.calls.count("compute/mlp") == 2 and predictor.ids["allreduce/w2"].startswith("allreduce-")
    # no host facts (a caller that keys nothing): measured, no ids
    predictor, _ = predict.calibrate(runs()[:1], None, tmp_path / "logs", [].append)
    assert predictor.ids == {} and predictor.calibration_id(runs()[0]) is None


def test_a_torch_jobs_all_reduce_is_calibrated_with_gloo_apart_from_tensorflows(tmp_path, monkeypatch):
    # torch's DDP all-reduces with gloo: TensorFlow's collective ops' overhead (4 processes on 2
    # cores: 17.6 ms against gloo's few) would stand in for it
    fakes = FakeMeasures(monkeypatch)
    profile = Profile(name="p", delay_us=1_000)
    both = [Run(index=i, profile=profile, repeat=0, job=JobSpec(strategy="allreduce", model="mlp", framework=f),
                workers=2) for i, f in enumerate(("tensorflow", "torch"))]
    notes: list[str] = []
    predictor, record = predict.calibrate(both, None, tmp_path / "logs", notes.append,
                                          reuse=predict.Reuse(place=PLACE, host=HOST, cache=None))
    assert sorted(c for c in fakes.calls if c.startswith("allreduce")) == ["allreduce/2", "allreduce/2/torch"]
    assert set(record["collective"]) == {"2", "torch/2"} and any("over 2 workers with gloo" in n for n in notes)
    tf, torch = (predictor.inputs(run) for run in both)
    assert (tf.overhead_s, torch.overhead_s) == (0.0015, 0.0005)
    assert predictor.ids["allreduce/wtorch/2"] in predictor.calibration_id(both[1])


# what a calibration measured on: the device and GPUs, and links that were not shaped

def test_a_cuda_calibration_is_keyed_apart_from_a_cpu_one_and_by_the_hosts_gpus(tmp_path):
    torch = JobSpec(model="mlp", framework="torch")
    cuda = JobSpec(model="mlp", framework="torch", device="cuda", gpus_per_node=1)
    cpu_key, cuda_key = key(measured=predict.compute_measured(torch, 2)), key(measured=predict.compute_measured(cuda, 2))
    assert cc.calibration_id(cpu_key) != cc.calibration_id(cuda_key)
    cache = cc.CalibrationCache(tmp_path, clock=Clock())
    cache.store(cpu_key, {"compute_s": 0.01, "model_bytes": 1}, {})
    assert cache.lookup(cuda_key) == (None, "none cached")  # a --device cuda sweep measures its own
    from netbench.experiment import base_calibration

    ps = JobSpec(strategy="ps-sync")
    assert base_calibration.measured(ps, 2)["device"] == "cpu"
    h100 = replace(HOST, gpus=("0: NVIDIA H100 80GB HBM3, 81559 MiB", "driver 550.54"))
    h200 = replace(HOST, gpus=("0: NVIDIA H200, 143771 MiB", "driver 550.54"))
    ids = {cc.calibration_id(key(measured=predict.compute_measured(cuda, 2), host=h)) for h in (HOST, h100, h200)}
    assert len(ids) == 3
    assert cc.host_facts(gpus=lambda: h100.gpus).gpus == h100.gpus


def test_the_gpu_identity_comes_from_nvidia_smi_where_there_is_one(monkeypatch):
    from types import SimpleNamespace

    from netbench import proc
    from netbench.experiment import gpus

    assert gpus.smi_identity(which=lambda name: None) == ()
    out = "0, NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n1, NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n"
    monkeypatch.setattr(proc, "run", lambda argv, **kw: SimpleNamespace(returncode=0, stdout=out, stderr=""))
    assert gpus.smi_identity(which=lambda name: "/usr/bin/nvidia-smi") == (
        "0: NVIDIA H100 80GB HBM3, 81559 MiB", "1: NVIDIA H100 80GB HBM3, 81559 MiB", "driver 550.54.15")


def test_calibrations_are_cached_only_when_made_on_unshaped_links():
    """A `netbench apply 10ms` before a sweep: the embedded testbed clears it before calibrating
    (noted) and the key says "unshaped"; a target that cannot say what its links hold caches nothing."""
    from types import SimpleNamespace

    from netbench.experiment import runner

    config = SimpleNamespace(recalibrate=False)
    notes: list[str] = []
    shaped = SimpleNamespace(kind="embedded", unshaped_links=lambda: True)
    links = runner.calibration_links(shaped, notes.append)
    assert links == "unshaped" and len(notes) == 1 and "cleared" in notes[0]
    reuse = runner.calibration_reuse(config, shaped, "tbf", "cubic", links)
    assert reuse.cache is not None and reuse.place["links"] == "unshaped"
    assert runner.calibration_links(SimpleNamespace(kind="embedded", unshaped_links=lambda: False), notes.append) \
        == "unshaped" and len(notes) == 1  # nothing to clear: nothing said
    unknown = SimpleNamespace(kind="embedded")  # no unshaped_links: what its links hold is unknown
    links = runner.calibration_links(unknown, notes.append)
    reuse = runner.calibration_reuse(config, unknown, "tbf", "cubic", links)
    assert links is None and reuse.cache is None and reuse.place["links"] == "as found"


def test_the_embedded_testbed_clears_what_a_netbench_apply_left_before_calibrating(tmp_path):
    import ipaddress

    from netbench.emulation import backends
    from netbench.emulation.executor import Executor
    from netbench.model.topology import plan_topology
    from netbench.state.journal import Journal
    from netbench.testbed.embedded import EmbeddedTestbed
    from tests.fakes.netlink import make_fakes

    journal = Journal(tmp_path)
    qdiscs, iptables, engines, _ = make_fakes()
    testbed = EmbeddedTestbed(journal, "rateonly")
    testbed.topology = plan_topology(2, ipaddress.ip_network("10.213.0.0/24"))
    testbed.executor = Executor(journal=journal, qdiscs=qdiscs, iptables=iptables, engines=engines)
    assert testbed.unshaped_links() is False  # nothing held
    applied = Profile(name="applied", rate_bps=100_000_000)  # what `netbench apply --bandwidth 100mbit` leaves
    testbed.executor.apply(backends.plan_network(applied, testbed.topology, "rateonly", seed=0))
    held = testbed.executor.held()
    assert held.roots and qdiscs.read(testbed.topology.nodes[0].netns, testbed.topology.nodes[0].ifname)
    assert testbed.unshaped_links() is True
    assert not testbed.executor.held().roots
    assert [qdiscs.read(n.netns, n.ifname) for n in testbed.topology.nodes] == [None, None]  # the links unshaped


def test_a_sweep_over_links_a_netbench_apply_left_shaped_calibrates_them_unshaped(tmp_path, monkeypatch):
    """The getting-started tour applies 10 ms, then sweeps with --predict: the calibrations must
    not measure (and keep for a day) the 10 ms. The sweep's testbed here is the embedded one's
    logic (its unshaped_links) over fake adapters, with the measurements faked."""
    from netbench.emulation import backends
    from netbench.experiment.runner import SweepConfig, run_sweep
    from netbench.state.journal import Journal
    from netbench.testbed.embedded import EmbeddedTestbed
    from tests.fakes.sweep import SyntheticTestbed

    class Applied(SyntheticTestbed):
        kind = "embedded"
        unshaped_links = getattr(EmbeddedTestbed, "unshaped_links", None)  # the embedded testbed's own

        def start(self):
            topology = super().start()  # a testbed that is up, left shaped by `netbench apply --latency 10ms`
            self.executor.apply(backends.plan_network(Profile(name="applied", delay_us=10_000), topology,
                                                      self.backend, seed=0))
            return topology

    fakes = FakeMeasures(monkeypatch)
    testbed = Applied(Journal(tmp_path / "state"))
    held_when_measured = []
    measure_compute = predict.measure_compute

    def compute(tb, job, workers, log_dir, port):
        held_when_measured.append(bool(testbed.executor.held().engines or testbed.executor.held().roots))
        return measure_compute(tb, job, workers, log_dir, port)

    monkeypatch.setattr(predict, "measure_compute", compute)
    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path / "cache"))
    notes: list[str] = []

    class Observer:
        def __getattr__(self, name):
            return (lambda text: notes.append(text)) if name == "note" else (lambda *args: None)

    job = JobSpec(warmup=1, steps=3)
    runs = (Run(index=0, profile=Profile(name="d1ms", delay_us=1000), repeat=0, job=job, workers=2),)
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out", isolate=True,
                         predict=True)
    run_sweep(config, Observer(), testbed=testbed)
    assert "compute/mlp" in fakes.calls and held_when_measured == [False]  # measured on unshaped links
    assert any("cleared" in n for n in notes), notes
    kept = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*.json")]
    assert kept and all(entry["key"]["place"]["links"] == "unshaped" for entry in kept)
