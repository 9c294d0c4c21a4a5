"""End-to-end tier: Debian's Prometheus, with the shipped config, scrapes a real sweep run
with --metrics-port; then every panel, variable and annotation query of the dashboards must
return data, and the throughput it recorded must move with the profile (root, TensorFlow); and
in the sweep most users start with (`--latency` levels only, the fused all-reduce step, a
shared launch) every metric the dashboards use has samples, the who-waits ones included."""

from __future__ import annotations

import csv
import json
import math
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from netbench.metrics import dashboards, lint
from tests.conftest import NETBENCH, netbench_processes

pytestmark = [pytest.mark.root, pytest.mark.tf]

ROOT = Path(__file__).resolve().parents[2]
RATE_INTERVAL = "5s"  # what Grafana makes of $__rate_interval with a 1 s scrape interval
ALL = ".+"  # each query variable's "All" value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    """Debian's prometheus on loopback with the shipped config, watching the test's target files."""

    def __init__(self, tmp: Path, targets: Path) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: 'make install' installs Debian's prometheus package"
        config = yaml.safe_load((ROOT / "grafana" / "prometheus.yml").read_text())
        config["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(targets / "*.json")]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(tmp / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200:
                    return
            except OSError:
                assert self.proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
                time.sleep(0.2)
        pytest.fail("prometheus not ready within 60 s")

    def wait_for_discovery(self, targets: Path) -> None:
        """Wait until Prometheus's first file_sd sync (up to ~7 s after start), as for a Prometheus
        that was already running: a placeholder target (Prometheus itself) must become active."""
        targets.mkdir(parents=True, exist_ok=True)
        placeholder = targets / "placeholder.json"
        host = self.url.removeprefix("http://")
        placeholder.write_text(json.dumps([{"targets": [host], "labels": {"job": "placeholder"}}]))
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                if any(t["labels"].get("job") == "placeholder" for t in self.api("targets")["activeTargets"]):
                    return
                time.sleep(0.2)
            pytest.fail("prometheus did not pick up a file_sd target within 60 s")
        finally:
            placeholder.unlink()

    def api(self, path: str, **params) -> object:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def range(self, expr: str, start: float, end: float, step: str = "1s") -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def substitute(expr: str, range_s: int) -> str:
    for name, value in (("$__rate_interval", RATE_INTERVAL), ("$__range", f"{range_s}s"), ("$instance", ALL),
                        ("$node", ALL), ("$worker", ALL), ("$src", ALL), ("$dst", ALL)):
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def has_values(result: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


@pytest.fixture
def prometheus(tmp_path, state_dir):
    server = Prometheus(tmp_path, state_dir / "targets")
    server.wait_for_discovery(state_dir / "targets")
    yield server
    server.stop()


def test_prometheus_scrapes_a_sweep_and_every_dashboard_query_returns_data(clean_machine, state_dir, tmp_path,
                                                                           prometheus):
    started = time.time()
    out = tmp_path / "results"
    sweep = subprocess.run([*NETBENCH, "sweep", "--latency", "1,40ms", "--bandwidth", "500mbit", "--warmup", "3",
                            "--steps", "8", "--precision", "off", "--batch-size", "32", "--metrics-port", "0", "--metrics-wait", "60s",
                            "--output", str(out)],
                           capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    assert "metrics: http://127.0.0.1:" in sweep.stdout
    assert list((state_dir / "targets").glob("*")) == []  # the target file is gone with the server
    end = time.time()
    range_s = int(end - started) + 1

    # every query the dashboards make returns data from this real run
    empty = []
    for dashboard in (build() for build in dashboards.DASHBOARDS.values()):
        for query in lint.queries(dashboard):
            if "netbench_pair_" in query.expr:
                # the per-pair row has data only under a per-pair topology, which this sweep does not
                # apply (tests/unit/test_metrics_pairs.py scrapes one under each backend)
                continue
            if query.kind == "variable":
                selector, label = lint.label_values(query.expr)
                values = prometheus.api(f"label/{label}/values", **{"match[]": substitute(selector, range_s)},
                                        start=started, end=end)
                if not values:
                    empty.append(query.where)
                continue
            # annotations at a fine step: the sweep's last scrape (the last point's window) lands
            # less than a second before `end`, between two evaluations of a 1 s grid
            result = prometheus.range(substitute(query.expr, range_s), started, end,
                                      step="0.1" if query.kind == "annotation" else "1s")
            if not has_values(result):
                empty.append(f"{query.where}: {query.expr}")
            elif query.kind == "annotation":  # values are event times in ms, within the sweep
                times = {float(v) / 1000 for series in result for _, v in series["values"]}
                assert all(started <= t <= end for t in times), (query.where, times, started, end)
                assert len(times) == 2, (query.where, times)  # two runs: two profiles, two warm-up ends
    assert empty == [], "queries without data:\n" + "\n".join(empty)

    # the numbers are the sweep's: both profiles, one active at a time, throughput falls with delay
    def scalar(expr: str) -> float:
        result = prometheus.api("query", query=expr, time=end)["result"]
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    window = f"[{range_s}s]"
    assert scalar(f"max_over_time(netbench_profile_delay_seconds{window})") == 0.04
    assert scalar(f"min_over_time(netbench_profile_delay_seconds{window})") == 0.001
    assert scalar(f"max_over_time(netbench_profile_rate_bytes_per_second{window})") == 500e6 / 8
    assert scalar(f"max_over_time(count(netbench_profile_active)[{range_s}s:1s])") == 1.0
    # the userspace backend's two shapers both carried the training traffic: tbf for the rate,
    # a delay engine per node for the delay
    assert scalar(f"sum(max_over_time(netbench_qdisc_packets_total{window}))") > 0
    assert scalar(f"sum(max_over_time(netbench_engine_released_packets_total{window}))") > 0
    # and each engine's lateness reached Prometheus: the sum and the counts over 1 and 10 ms (a
    # real engine's counters; their values are this host's and not asserted)
    assert scalar(f"count(max_over_time(netbench_engine_lateness_seconds_total{window}) >= 0)") >= 2
    overs = prometheus.api("query", query=f"count by (over) (max_over_time(netbench_engine_late_releases_total{window}))",
                           time=end)["result"]
    assert sorted(r["metric"]["over"] for r in overs) == ["10ms", "1ms"]
    results = prometheus.api("query", query=f"max_over_time(netbench_result_images_per_second[{range_s}s])",
                             time=end)["result"]
    by_profile = {r["metric"]["profile"]: float(r["value"][1]) for r in results}
    with open(out / "results.csv", newline="") as fh:
        rows = {row["profile"]: float(row["images_per_sec"]) for row in csv.DictReader(fh)}
    assert by_profile == pytest.approx(rows, rel=1e-4)
    # throughput falls with delay; and a 40 ms point's step (one all-reduce: at least one round
    # trip of 80 ms) cannot beat that bound however busy or idle the machine's CPUs are
    assert by_profile["d40ms-r500mbit"] < by_profile["d1ms-r500mbit"], by_profile
    assert 2 * 32 / by_profile["d40ms-r500mbit"] >= 0.080, by_profile
    measured = prometheus.api("query", query=f'max_over_time(netbench_steps_total{{phase="measured",worker="0"}}'
                                             f"[{range_s}s])", time=end)["result"]
    assert [float(r["value"][1]) for r in measured] == [16.0]  # 8 measured steps in each of 2 runs
    assert netbench_processes() == []


def dashboard_metrics() -> set[str]:
    """Every netbench metric a shipped dashboard queries: the generator's dashboards and the
    committed JSON files (tests/unit/test_dashboards.py keeps the two equal)."""
    built = [build() for build in dashboards.DASHBOARDS.values()]
    shipped = [json.loads(path.read_text()) for path in sorted((ROOT / "grafana" / "dashboards").glob("*.json"))]
    names = {name for dashboard in built + shipped for query in lint.queries(dashboard)
             for name, _ in lint.metric_names(query.expr) if name.startswith("netbench_")}
    # a histogram is queried by its series; the exporter's metric is the histogram's name
    return {name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for name in names}


def test_every_metric_the_dashboards_use_has_samples_in_a_default_sweep(clean_machine, state_dir, tmp_path,
                                                                       prometheus):
    """netbench sweep --latency 1,10,100ms, shortened to two points and a short window: the fused
    all-reduce step in a shared launch. Its who-waits metrics had no samples (the fused step
    reported no computation). Two families describe shaping such a sweep may not do, and are
    asked for only where it does: the per-pair ones (a per-pair topology: test_metrics_pairs.py
    scrapes them) and, under the userspace backend, the root qdisc's (netbench installs one for
    a rate only; the test above shapes a rate and asks for them)."""
    started = time.time()
    out = tmp_path / "results"
    sweep = subprocess.run([*NETBENCH, "sweep", "--latency", "1,10ms", "--warmup", "3", "--steps", "8",
                            "--precision", "off", "--metrics-port", "0", "--metrics-wait", "60s",
                            "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    names = {n for n in dashboard_metrics() if not n.startswith("netbench_pair_")}
    if json.loads((out / "manifest.json").read_text())["backend"] != "netem":  # no qdisc without a rate
        names = {n for n in names if not n.startswith("netbench_qdisc_")}
    assert {"netbench_rank_waiting_seconds", "netbench_rank_last_ratio", "netbench_step_duration_seconds"} <= names
    found = prometheus.api("label/__name__/values", **{"match[]": '{__name__=~"netbench_.+"}'},
                           start=started, end=time.time())  # the names with a sample in the sweep's time
    exported = {name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for name in found}
    assert sorted(names - exported) == [], f"{len(names - exported)} of {len(names)} without a sample: {sorted(names - exported)}"
