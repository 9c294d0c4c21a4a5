"""Pure tier: the metric catalogue, the state a sweep feeds, the collector, the exporter and
its target file, with fake state and a fake network reader. Runs promtool on a real exposition."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import prometheus_client
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netbench.cli.app import main
from netbench.errors import UsageError
from netbench.metrics import catalogue
from netbench.metrics.collector import NetbenchCollector
from netbench.metrics.exporter import MetricsExporter, check_address, target_entry
from netbench.metrics.network import NetworkReader
from netbench.metrics.state import MetricsObserver, MetricsState, ObserverTee
from netbench.model.profile import Profile
from netbench.model.topology import plan_topology
from tests.fakes.metrics_network import engine_stats

ROOT = Path(__file__).resolve().parents[2]
BOUNDED_LABELS = {"version", "python", "sweep", "backend", "model", "strategy", "state", "status", "run",
                  "repeat", "profile", "phase", "worker", "node", "interface", "direction", "reason",
                  "launch", "point", "src", "dst", "mechanism", "rank", "over"}
# over: catalogue.ENGINE_LATE_OVER; launch: the sweep's launches; point: position/points in one; src, dst: the testbed's nodes (an ordered
# pair of a per-pair topology); mechanism: catalogue.PAIR_MECHANISMS; rank: the run's workers (ranks)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fake_links(netns: str) -> list[dict]:
    base = 100 if netns.endswith("n1") else 200
    return [{"interface": "eth0",
             "stats": {"rx_bytes": base * 10, "tx_bytes": base * 20, "rx_packets": base, "tx_packets": base + 1,
                       "rx_dropped": 0, "tx_dropped": 2},
             "qdisc": {"drops": 3, "overlimits": 4, "backlog": 1500, "qlen": 1}}]


def fake_engine(state_dir, switch_netns, position):
    """Each node's engine shapes per destination: one row, toward the other node."""
    other = f"10.213.0.{2 - position}"
    pairs = [{"dst": other, "delay_us": 25_000, "jitter_us": 0, "loss": 0.001, "rate_bps": 100_000_000,
              "packets": 500, "accepted": 490, "dropped": 4, "overlimits": 6, "queue_depth": 0, "max_queue_depth": 9}]
    return engine_stats(queue_depth=5 + position, received=900, accepted=880, dropped=9, pairs=pairs)


def fed_state(clock: Clock | None = None) -> tuple[MetricsState, NetworkReader]:
    """A state that has seen a sweep start, a profile applied, warm-up and measured steps, one run
    end and the next run start with its chief up."""
    clock = clock or Clock()
    state = MetricsState(clock=clock)
    topology = plan_topology(2, __import__("ipaddress").ip_network("10.213.0.0/24"))
    network = NetworkReader(Path("/nonexistent"), read_links=fake_links, read_engine=fake_engine, cache_s=0,
                            topology=topology)
    state.sweep_started("sweep-1", "userspace", "mlp", "allreduce", runs=2, workers=2, batch_size=32)
    state.run_started("r000", 0)
    state.ranks_started(2, aligned=True, nodes=("n1", "n2"))
    state.launch_point(0, 1, 2)
    state.profile_applied("d10ms-r250mbit", 10_000, 1_000, 250_000_000, 0.01)
    for worker in (0, 1):
        state.worker_event({"event": "start", "worker": worker})
        state.worker_event({"event": "step", "worker": worker, "phase": "warmup", "duration": 2.0})
        for k in range(4):  # worker 1 computes longer: worker 0 waits for it
            state.worker_event({"event": "step", "worker": worker, "step": k, "phase": "measured", "duration": 0.04,
                                "compute": 0.01 + 0.02 * worker, "comm": 0.03 - 0.02 * worker})
    state.measured_window("r000", 1001.5, 1002.25)
    state.run_finished("ok", "d10ms-r250mbit", 1600.0)
    state.run_started("r001", 0)
    state.launch_point(0, 2, 2)
    state.worker_event({"event": "start", "worker": 0})
    state.worker_event({"event": "step", "worker": 0, "phase": "measured", "duration": 0.04})
    return state, network


def scrape(state: MetricsState, network: NetworkReader | None = None) -> dict:
    registry = CollectorRegistry()
    registry.register(NetbenchCollector(state, network))
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}, text


def samples(families: dict, name: str) -> dict:
    """{frozenset(labels): value} of one sample name."""
    out = {}
    for family in families.values():
        for sample in family.samples:
            if sample.name == name:
                out[frozenset(sample.labels.items())] = sample.value
    return out


# ---------------------------------------------------------------- catalogue

def test_catalogue_follows_prometheus_conventions():
    names = [m.name for m in catalogue.CATALOGUE]
    assert len(names) == len(set(names))
    for metric in catalogue.CATALOGUE:
        assert re.fullmatch(r"netbench_[a-z0-9_]+", metric.name), metric.name
        assert metric.help.endswith("."), metric.name
        assert (metric.type == "counter") == metric.name.endswith("_total"), metric.name
        assert (metric.type == "info") == metric.name.endswith("_info"), metric.name
        assert set(metric.labels) <= BOUNDED_LABELS, metric.name
        if "time" in metric.name or "duration" in metric.name or "delay" in metric.name:
            assert metric.name.removesuffix("_total").endswith("_seconds"), metric.name
        for unit in ("milliseconds", "bits", "percent", "mbit"):
            assert unit not in metric.name, metric.name  # base units only


def test_every_catalogue_metric_is_exposed_with_its_type_and_labels():
    state, network = fed_state()
    families, _ = scrape(state, network)
    for metric in catalogue.CATALOGUE:
        # the text format has no info type: an info metric is a gauge named ..._info with value 1
        family = families.get(metric.name if metric.type == "info" else metric.family)
        assert family is not None, metric.name
        assert family.type == ("gauge" if metric.type == "info" else metric.type), metric.name
        if metric.type == "info":
            assert {s.value for s in family.samples} == {1.0}, metric.name
        assert family.samples, f"{metric.name} has no sample in a fully fed state"
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            if metric.type == "info":
                assert labels == set(metric.labels), metric.name
            else:
                assert labels == set(metric.labels), (metric.name, labels)
    exposed = {s.name for f in families.values() for s in f.samples}
    assert exposed <= catalogue.series_names() | {f"{m.family}_created" for m in catalogue.CATALOGUE}


def test_profile_gauges_in_base_units():
    state, network = fed_state()
    families, _ = scrape(state)
    assert samples(families, "netbench_profile_delay_seconds") == {frozenset(): 0.01}
    assert samples(families, "netbench_profile_jitter_seconds") == {frozenset(): 0.001}
    assert samples(families, "netbench_profile_rate_bytes_per_second") == {frozenset(): 250e6 / 8}
    assert samples(families, "netbench_profile_loss_ratio") == {frozenset(): 0.01}
    assert samples(families, "netbench_profile_applied_timestamp_seconds") == {frozenset(): 1000.0}


def test_profile_change_removes_the_old_label_set():
    clock = Clock()
    state, _ = fed_state(clock)
    clock.now = 1050.0
    state.profile_applied("d100ms", 100_000, 0, None, 0.0)
    families, _ = scrape(state)
    assert samples(families, "netbench_profile_active") == {frozenset({("profile", "d100ms")}): 1.0}
    assert samples(families, "netbench_profile_rate_bytes_per_second") == {frozenset(): 0.0}  # no limit
    assert samples(families, "netbench_profile_applied_timestamp_seconds") == {frozenset(): 1050.0}
    assert samples(families, "netbench_profile_applications_total") == {frozenset(): 2.0}
    # every profile of the sweep keeps its last application time: a scraper that first comes now
    # still annotates both changes
    assert samples(families, "netbench_profile_last_applied_timestamp_seconds") == {
        frozenset({("profile", "d10ms-r250mbit")}): 1000.0, frozenset({("profile", "d100ms")}): 1050.0}


def test_steps_samples_and_histogram_by_phase():
    state, _ = fed_state()
    families, _ = scrape(state)
    steps = samples(families, "netbench_steps_total")
    assert steps[frozenset({("phase", "warmup"), ("worker", "0")})] == 1
    assert steps[frozenset({("phase", "measured"), ("worker", "1")})] == 4
    assert samples(families, "netbench_samples_total")[frozenset({("phase", "measured"), ("worker", "0")})] == 160
    buckets = samples(families, "netbench_step_duration_seconds_bucket")
    measured0 = {dict(k)["le"]: v for k, v in buckets.items() if ("phase", "measured") in k and ("worker", "0") in k}
    assert measured0["0.03"] == 0 and measured0["0.05"] == 5 and measured0["+Inf"] == 5
    warmup0 = {dict(k)["le"]: v for k, v in buckets.items() if ("phase", "warmup") in k and ("worker", "0") in k}
    assert warmup0["1.0"] == 0 and warmup0["2.5"] == 1
    count = samples(families, "netbench_step_duration_seconds_count")
    assert count[frozenset({("phase", "measured"), ("worker", "0")})] == 5
    assert samples(families, "netbench_warmups_completed_total") == {frozenset(): 2.0}  # r000 and r001


def test_run_images_per_second_uses_measured_chief_steps():
    state = MetricsState(clock=Clock())
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=1, workers=2, batch_size=32)
    state.run_started("r000", 0)
    state.worker_event({"event": "step", "worker": 0, "phase": "warmup", "duration": 5.0})
    families, _ = scrape(state)
    assert samples(families, "netbench_run_images_per_second") == {}  # warm-up only: nothing yet
    for duration in (0.1, 0.3):
        state.worker_event({"event": "step", "worker": 0, "phase": "measured", "duration": duration})
    state.worker_event({"event": "step", "worker": 1, "phase": "measured", "duration": 9.0})  # not the chief
    families, _ = scrape(state)
    assert samples(families, "netbench_run_images_per_second")[frozenset()] == pytest.approx(64 / 0.2)
    assert samples(families, "netbench_sweep_state")[frozenset({("state", "measured")})] == 1


def test_warmup_end_stays_until_the_next_run_gets_past_warm_up():
    """A short run's end of warm-up must survive the next run's start (Prometheus scrapes every
    second or two; the next run's start-up takes seconds), and be replaced by that run's own."""
    clock = Clock(1000.0)
    state = MetricsState(clock=clock)
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=2, workers=1, batch_size=32)
    state.run_started("r000", 0)
    families, _ = scrape(state)
    assert samples(families, "netbench_run_warmup_end_timestamp_seconds") == {}
    state.worker_event({"event": "step", "worker": 0, "phase": "warmup", "duration": 1.0})
    clock.now = 1001.0
    state.worker_event({"event": "step", "worker": 0, "phase": "measured", "duration": 0.01})
    state.run_finished("ok", "a", 3200.0)
    clock.now = 1001.2
    state.run_started("r001", 0)
    state.worker_event({"event": "step", "worker": 0, "phase": "warmup", "duration": 1.0})
    families, _ = scrape(state)
    assert samples(families, "netbench_run_warmup_end_timestamp_seconds") == {frozenset(): 1001.0}
    clock.now = 1005.0
    state.worker_event({"event": "step", "worker": 0, "phase": "measured", "duration": 0.01})
    families, _ = scrape(state)
    assert samples(families, "netbench_run_warmup_end_timestamp_seconds") == {frozenset(): 1005.0}


def test_worker_up_heartbeat_and_progress():
    clock = Clock()
    state = MetricsState(clock=clock)
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=2, workers=2, batch_size=8)
    state.run_started("r000", 0)
    families, _ = scrape(state)
    assert set(samples(families, "netbench_worker_up").values()) == {0}
    clock.now = 1010.0
    state.worker_event({"event": "start", "worker": 1})
    families, _ = scrape(state)
    assert samples(families, "netbench_worker_up")[frozenset({("worker", "1")})] == 1
    assert samples(families, "netbench_worker_heartbeat_timestamp_seconds") == {frozenset({("worker", "1")}): 1010.0}
    state.worker_event({"event": "done", "worker": 1})
    state.run_finished("timeout", "p", None)
    families, _ = scrape(state)
    assert set(samples(families, "netbench_worker_up").values()) == {0}
    assert samples(families, "netbench_sweep_progress_ratio") == {frozenset(): 0.5}
    assert samples(families, "netbench_sweep_runs_completed_total")[frozenset({("status", "timeout")})] == 1
    assert samples(families, "netbench_result_images_per_second") == {}  # a timeout has no throughput
    state.run_started("r001", 0)
    state.run_finished("ok", "p", 10.0)
    families, _ = scrape(state)
    assert samples(families, "netbench_sweep_state")[frozenset({("state", "finished")})] == 1


def test_network_counters_and_engines_from_the_reader():
    state, network = fed_state()
    families, _ = scrape(state, network)
    tx = samples(families, "netbench_interface_bytes_total")
    assert tx[frozenset({("node", "n1"), ("interface", "eth0"), ("direction", "transmit")})] == 2000
    assert tx[frozenset({("node", "n2"), ("interface", "eth0"), ("direction", "receive")})] == 2000
    assert samples(families, "netbench_qdisc_backlog_bytes")[frozenset({("node", "n1"), ("interface", "eth0")})] == 1500
    assert samples(families, "netbench_engine_queue_depth_packets") == {frozenset({("node", "n1")}): 5,
                                                                        frozenset({("node", "n2")}): 6}


def test_network_reader_counts_failed_namespaces_and_caches():
    calls = []

    def flaky(netns):
        calls.append(netns)
        if netns.endswith("n2"):
            raise OSError("namespace gone")
        return fake_links(netns)

    topology = plan_topology(2, __import__("ipaddress").ip_network("10.213.0.0/24"))
    reader = NetworkReader(Path("/nonexistent"), read_links=flaky, read_engine=lambda *a: None, cache_s=60,
                           topology=topology)
    first = reader.sample()
    assert [i.node for i in first.interfaces] == ["n1"] and first.read_errors == 1 and first.engines == ()
    assert reader.sample() is first and len(calls) == 2  # cached: no second read
    assert NetworkReader(Path("/x")).sample().interfaces == ()  # no topology yet


def test_observer_feeds_state_and_tee_passes_calls_on():
    state = MetricsState(clock=Clock())
    observer = MetricsObserver(state)
    heard = []

    class Recorder:
        def __getattr__(self, name):
            return lambda *a: heard.append(name)

    profile = Profile(name="wan", delay_us=10_000, rate_bps=100_000_000)
    job = SimpleNamespace(model="mlp", strategy="allreduce", batch_size=16, accum_steps=1)
    run = SimpleNamespace(run_id="r000", repeat=0, profile=profile, job=job, workers=1)  # a run's own, always set
    config = SimpleNamespace(sweep_id="s", runs=(run,), workers=1, job=job)
    tee = ObserverTee(Recorder(), observer)
    tee.sweep_started(config, SimpleNamespace(name="userspace"), SimpleNamespace())
    tee.run_started(run)
    tee.profile_applied(run)
    tee.step(run, {"event": "step", "worker": 0, "phase": "measured", "duration": 0.5})
    tee.run_finished(run, SimpleNamespace(status="ok", stats={"images_per_sec": 32.0}))
    assert heard == ["sweep_started", "run_started", "profile_applied", "step", "run_finished"]
    families, _ = scrape(state)
    assert samples(families, "netbench_result_images_per_second") == {frozenset({("profile", "wan")}): 32.0}
    assert samples(families, "netbench_profile_rate_bytes_per_second") == {frozenset(): 12.5e6}
    assert samples(families, "netbench_samples_total")[frozenset({("phase", "measured"), ("worker", "0")})] == 16


def test_samples_follow_the_runs_own_job_and_accumulation():
    """A playbook run carries its own job; under allreduce-accum one step is k batches."""
    from netbench.model.job import JobSpec

    state = MetricsState(clock=Clock())
    observer = MetricsObserver(state)
    profile = Profile(name="lan")
    accum = JobSpec(strategy="allreduce-accum", batch_size=8, accum_steps=4)
    run = SimpleNamespace(run_id="r000", repeat=0, profile=profile, job=accum, workers=1)
    observer.sweep_started(SimpleNamespace(sweep_id="s", runs=(run,), workers=1, job=JobSpec(batch_size=16)),
                           SimpleNamespace(name="userspace"), SimpleNamespace())
    observer.run_started(run)
    observer.step(run, {"event": "step", "worker": 0, "phase": "measured", "duration": 0.5})
    families, _ = scrape(state)
    assert samples(families, "netbench_samples_total")[frozenset({("phase", "measured"), ("worker", "0")})] == 32


# ---------------------------------------------------------------- exporter

def test_exporter_serves_its_own_registry_and_writes_the_target_file(tmp_path):
    state, network = fed_state()
    exporter = MetricsExporter(0, state=state, network=network, state_path=tmp_path)
    exporter.start()
    try:
        assert exporter.url.startswith("http://127.0.0.1:") and exporter.port > 0
        targets = json.loads(exporter.target_file.read_text())
        assert targets == [{"targets": [f"127.0.0.1:{exporter.port}"], "labels": {"job": "netbench"}}]
        assert exporter.target_file.parent == tmp_path / "targets"
        assert [p.name for p in exporter.target_file.parent.iterdir()] == [exporter.target_file.name]
        body = urllib.request.urlopen(exporter.url, timeout=5).read().decode()
        assert 'netbench_profile_active{profile="d10ms-r250mbit"} 1.0' in body
        assert "netbench_profile_delay_seconds 0.01" in body
        # never the process-wide registry
        assert not [n for n in prometheus_client.REGISTRY._names_to_collectors if n.startswith("netbench")]
    finally:
        exporter.stop()
    assert not exporter.target_file.exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(exporter.url, timeout=2)


def test_busy_port_is_an_error_naming_the_flag(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        exporter = MetricsExporter(port, state_path=tmp_path)
        with pytest.raises(UsageError, match=r"^flag --metrics-port: cannot serve metrics on 127.0.0.1:\d+"):
            exporter.start()
    assert not (tmp_path / "targets").exists() or not list((tmp_path / "targets").iterdir())


def test_address_checks_and_target_hosts():
    assert check_address("0.0.0.0") == "0.0.0.0"
    assert check_address("::1") == "::1"
    with pytest.raises(UsageError, match="flag --metrics-address: 'localhost' is not an IP address"):
        check_address("localhost")
    assert target_entry("::1", 9464, {})[0]["targets"] == ["[::1]:9464"]


@pytest.mark.parametrize("args, message", [
    (["--metrics-address", "127.0.0.1"], "flag --metrics-address needs --metrics-port"),
    (["--metrics-port", "9464", "--metrics-address", "nowhere"], "flag --metrics-address: 'nowhere' is not an IP"),
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--metrics-wait", "15s"], "flag --metrics-wait needs --metrics-port"),
    (["--metrics-port", "0", "--metrics-wait", "soon"], "flag --metrics-wait:"),
])
@pytest.mark.parametrize("command", [["sweep", "--latency", "1ms"], ["run", "playbooks/smoke.yaml"]])
def test_cli_rejects_bad_metrics_flags(args, message, command):
    result = CliRunner().invoke(main, [*command, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) <= 3


def test_promtool_finds_nothing_to_fix_in_a_served_exposition(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: 'make install' installs Debian's prometheus package"
    state, network = fed_state()
    exporter = MetricsExporter(0, state=state, network=network, state_path=tmp_path)
    exporter.start()
    try:
        body = urllib.request.urlopen(exporter.url, timeout=5).read()
    finally:
        exporter.stop()
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result


def test_promtool_check_metrics_can_fail():
    """The promtool check above would catch a convention break: a counter without _total."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: 'make install' installs Debian's prometheus package"
    bad = b"# HELP netbench_bad_seconds_count A counter.\n# TYPE netbench_bad_seconds_count counter\nnetbench_bad_seconds_count 1\n"
    result = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True, timeout=60)
    assert result.returncode != 0 or result.stdout.strip() or result.stderr.strip()


def test_the_docs_metrics_reference_is_generated_from_the_catalogue():
    """docs/hooks.py writes the metrics reference (docs/reference/metrics.md's marker) from the
    catalogue: every metric, its type, labels and help."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.MARKER in (ROOT / "docs" / "reference" / "metrics.md").read_text()
    table = hooks.metrics_table()
    for metric in catalogue.CATALOGUE:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{metric.name}` |"))
        assert f"| {metric.type} |" in row and all(f"`{label}`" in row for label in metric.labels), row


def test_wait_for_scrape_is_true_once_something_scraped(tmp_path):
    import threading

    state, network = fed_state()
    exporter = MetricsExporter(0, state=state, network=network, state_path=tmp_path)
    exporter.start()
    try:
        assert exporter.wait_for_scrape(0.2) is False  # nobody scrapes
        later = threading.Timer(0.2, lambda: urllib.request.urlopen(exporter.url, timeout=5).read())
        later.start()
        assert exporter.wait_for_scrape(30) is True
        later.join()
    finally:
        exporter.stop()


def test_stop_waits_for_one_more_scrape_only_when_something_scrapes(tmp_path):
    import threading
    import time

    state, network = fed_state()
    quiet = MetricsExporter(0, state=state, network=network, state_path=tmp_path)
    quiet.start()
    started = time.monotonic()
    quiet.stop(final_scrape_s=5)
    assert time.monotonic() - started < 1  # nobody scrapes: no wait
    watched = MetricsExporter(0, state=state, network=network, state_path=tmp_path)
    watched.start()
    urllib.request.urlopen(watched.url, timeout=5).read()
    later = threading.Timer(0.5, lambda: urllib.request.urlopen(watched.url, timeout=5).read())
    later.start()
    started = time.monotonic()
    watched.stop(final_scrape_s=10)
    later.join()
    assert 0.4 < time.monotonic() - started < 5 and watched.collector.scrapes == 2


@pytest.mark.parametrize("job, workers", [
    ({"strategy": "allreduce", "batch_size": 8}, 3),  # another batch and worker count than the sweep's
    ({"strategy": "allreduce-accum", "batch_size": 8, "accum_steps": 4}, 2),  # k batches per step
    ({"strategy": "ps", "batch_size": 16, "ps": 1}, 3),  # one worker's batch per step
    ({"strategy": "single", "batch_size": 32}, 1),
])
def test_live_images_per_second_follows_each_runs_own_job(job, workers):
    """A playbook run's live images/s comes from its own job, through the function the
    terminal view uses (cluster.images_per_step), not from the sweep's batch x workers."""
    from netbench.model.job import JobSpec, images_per_step
    from netbench.cli.render import SweepView

    state = MetricsState(clock=Clock())
    observer = MetricsObserver(state)
    spec = JobSpec(**job)
    run = SimpleNamespace(run_id="r000", repeat=0, profile=Profile(name="lan"), job=spec, workers=workers)
    config = SimpleNamespace(sweep_id="s", runs=(run,), workers=2, job=JobSpec(batch_size=64))
    observer.sweep_started(config, SimpleNamespace(name="userspace"), SimpleNamespace())
    observer.run_started(run)
    for duration in (0.1, 0.3):
        observer.step(run, {"event": "step", "worker": 0, "phase": "measured", "duration": duration})
    families, _ = scrape(state)
    expected = images_per_step(spec, workers) / 0.2
    assert samples(families, "netbench_run_images_per_second")[frozenset()] == pytest.approx(expected)
    measured0 = frozenset({("phase", "measured"), ("worker", "0")})
    assert samples(families, "netbench_samples_total")[measured0] == 2 * images_per_step(spec, 1)
    view = SweepView(config)
    shown = []
    view.progress = SimpleNamespace(update=lambda task, **kw: shown.append(kw.get("info", "")))
    view.step(run, {"event": "step", "worker": 0, "step": 5, "phase": "measured", "duration": 0.2})
    assert f"{expected:,.0f} img/s" in shown[-1]


def test_live_mean_keeps_no_per_step_history():
    """The live images/s is a running mean: the state is as big after 20,000 steps as after 1,000."""
    import pickle

    state = MetricsState(clock=Clock())
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=1, workers=1, batch_size=32)
    state.run_started("r000", 0)

    def size() -> int:
        return len(pickle.dumps({k: v for k, v in vars(state).items() if k not in ("_lock", "_clock")}))

    for _ in range(1_000):
        state.worker_event({"event": "step", "worker": 0, "phase": "measured", "duration": 0.25})
    before = size()
    for _ in range(19_000):
        state.worker_event({"event": "step", "worker": 0, "phase": "measured", "duration": 0.25})
    assert size() - before < 64
    families, _ = scrape(state)
    assert samples(families, "netbench_run_images_per_second")[frozenset()] == pytest.approx(32 / 0.25)


@pytest.mark.parametrize("blocked", ["folder is a file", "permission denied"])
def test_a_controller_that_may_not_write_the_target_file_serves_and_warns(tmp_path, monkeypatch, blocked):
    """A non-root controller (a sweep over an inventory) cannot write /run/netbench/targets:
    it serves all the same, with a warning, instead of crashing after the server started."""
    from netbench.metrics import exporter as exporter_module

    state, network = fed_state()
    state_path = tmp_path / "state"
    if blocked == "folder is a file":
        state_path.write_text("")
    else:
        def refuse(path, data):
            raise PermissionError(13, "Permission denied", str(path))
        monkeypatch.setattr(exporter_module, "write_atomic", refuse)
    exporter = MetricsExporter(0, state=state, network=network, state_path=state_path)
    exporter.start()
    try:
        assert exporter.target_file is None
        (warning,) = exporter.warnings
        assert warning.startswith(f"no Prometheus file_sd target file: cannot write in {state_path / 'targets'}: ")
        assert exporter.url in warning
        assert "netbench_profile_delay_seconds 0.01" in urllib.request.urlopen(exporter.url, timeout=5).read().decode()
    finally:
        exporter.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(exporter.url, timeout=2)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_target_files_of_gone_controllers_are_removed_and_live_ones_kept(tmp_path):
    from netbench import proc
    from netbench.metrics.exporter import remove_stale_targets, target_name

    targets = tmp_path / "targets"
    targets.mkdir()
    dead = _dead_pid()
    mine = targets / target_name(__import__("os").getpid())
    for path in (targets / f"netbench-{dead}-12345.json", targets / f"netbench-{dead}.json",  # killed; older name
                 # pid 1 lives, but it is not the process that wrote this one
                 targets / f"netbench-1-{proc.start_time(1) + 1}.json",
                 mine, targets / "other.json"):
        path.write_text("[]")
    removed = remove_stale_targets(targets)
    assert sorted(p.name for p in targets.iterdir()) == sorted([mine.name, "other.json"])
    assert len(removed) == 3 and all(line.startswith("metrics target file ") for line in removed)


def test_reset_removes_the_target_file_a_killed_controller_left(tmp_path, monkeypatch):
    from netbench.state import reset as reset_module
    from netbench.state.journal import Journal

    monkeypatch.setattr(reset_module.local, "list_netbench_netns", lambda: [])  # never touch real namespaces
    (tmp_path / "targets").mkdir()
    left = tmp_path / "targets" / f"netbench-{_dead_pid()}-777.json"
    left.write_text("[]")
    removed = reset_module.reset(Journal(tmp_path))
    assert not left.exists() and removed == [f"metrics target file {left} (controller {left.name.split('-')[1]} is gone)"]


def test_a_new_controller_sweeps_up_target_files_of_killed_ones(tmp_path):
    (tmp_path / "targets").mkdir()
    left = tmp_path / "targets" / f"netbench-{_dead_pid()}-777.json"
    left.write_text("[]")
    state, network = fed_state()
    exporter = MetricsExporter(0, state=state, network=network, state_path=tmp_path)
    exporter.start()
    try:
        assert [p.name for p in (tmp_path / "targets").iterdir()] == [exporter.target_file.name]
    finally:
        exporter.stop()


def test_the_sweep_view_shows_the_exporters_warning(tmp_path, monkeypatch, capsys):
    from netbench.cli import experiment as cli
    from netbench.experiment import runner

    (tmp_path / "state").write_text("")  # a state dir this controller cannot use
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(runner, "run_sweep", lambda config, observer, testbed=None: [])
    from netbench.model.job import JobSpec

    config = runner.SweepConfig(sweep_id="s", runs=(), job=JobSpec(), workers=2, output=tmp_path / "out")
    assert cli._run_with_view(config, 0, None) == []
    out = capsys.readouterr().out
    assert "warning: no Prometheus file_sd target file: cannot write in" in " ".join(out.split())


def test_the_final_scrape_is_one_begun_after_stop_and_whole(tmp_path):
    """A scrape already under way when the sweep ends may hold the state from before its last
    changes (the last point's window): stop waits for one begun later and produced whole."""
    import time

    state, network = fed_state()
    exporter = MetricsExporter(0, state=state, network=network, state_path=tmp_path)
    exporter.start()
    urllib.request.urlopen(exporter.url, timeout=5).read()
    exporter.collector.scrapes += 1  # a scrape has begun and not finished when stop is called

    def the_begun_one_finishes():
        time.sleep(0.1)
        exporter.collector.completed += 1  # it completes while stop waits, but it began before

    finisher = threading.Thread(target=the_begun_one_finishes)
    finisher.start()
    started = time.monotonic()
    exporter.stop(final_scrape_s=0.6)
    finisher.join()
    # no scrape begun after stop completes: stop waits its whole limit instead of taking the begun one
    assert time.monotonic() - started >= 0.6
    assert exporter.collector.completed == 2


def test_each_rank_shows_its_step_its_time_outside_computation_and_how_often_it_finished_last():
    state, network = fed_state()
    families, _ = scrape(state, network)
    values = {name: {(s.labels["rank"], s.labels["node"]): s.value for s in families[name].samples}
              for name in ("netbench_rank_step_seconds", "netbench_rank_waiting_seconds", "netbench_rank_last_ratio")}
    assert values["netbench_rank_step_seconds"] == pytest.approx({("0", "n1"): 0.04, ("1", "n2"): 0.04})
    # rank 0 spent 0.03 s of each step outside its computation (waiting for rank 1), rank 1 0.01 s
    assert values["netbench_rank_waiting_seconds"] == pytest.approx({("0", "n1"): 0.03, ("1", "n2"): 0.01})
    assert values["netbench_rank_last_ratio"] == {("0", "n1"): 0.0, ("1", "n2"): 1.0}


def test_an_own_pace_run_counts_no_one_last_and_a_rank_that_has_not_reported_a_step_waits():
    from netbench.jobs import events as ev
    from netbench.metrics.ranks import RankTimes

    own = RankTimes(workers=2, aligned=False)
    for worker in (0, 1):
        own.add(worker, ev.Step(step=0, duration=0.1, compute=0.05 * (worker + 1)))
    assert [v[2] for v in own.view().values()] == [None, None]
    sync = RankTimes(workers=2, aligned=True)
    sync.add(0, ev.Step(step=0, duration=0.1, compute=0.02))
    assert sync.compared == 0 and sync.view()[0][2] is None
    sync.add(1, ev.Step(step=0, duration=0.1, compute=0.09))
    assert sync.compared == 1 and sync.view()[1][2] == 1.0


def test_fused_steps_feed_the_who_waits_metrics_with_their_end_of_computation():
    """The default sweep's fused all-reduce steps carry no split but their `computed`: the
    who-waits panels (waiting, finished last) had no data in the sweep most users start with."""
    from netbench.jobs import events as ev
    from netbench.metrics.ranks import RankTimes

    fused = RankTimes(workers=2, aligned=True)
    for k in range(4):
        fused.add(0, ev.Step(step=k, duration=0.1, computed=0.02))
        fused.add(1, ev.Step(step=k, duration=0.1, computed=0.09))
    view = fused.view()
    assert view[0][1] == pytest.approx(0.08) and view[1][1] == pytest.approx(0.01)
    assert (view[0][2], view[1][2]) == (0.0, 1.0)
