"""Pure tier: the generated dashboards match the committed JSON and pass the lint; the
provisioning, compose and Prometheus files fit together; promtool accepts the config."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import yaml

from netbench.metrics import dashboards, lint
from netbench.metrics.exporter import targets_dir

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"


def generated() -> list[dict]:
    return [build() for build in dashboards.DASHBOARDS.values()]


def test_committed_json_equals_the_generator(tmp_path):
    written = dashboards.write_all(tmp_path)
    committed = sorted(p.name for p in (GRAFANA / "dashboards").glob("*.json"))
    assert committed == sorted(p.name for p in written), "run: make dashboards (or the generator) and commit"
    for path in written:
        assert path.read_text() == (GRAFANA / "dashboards" / path.name).read_text(), \
            f"{path.name} is stale: python -m netbench.metrics.dashboards grafana/dashboards"


def test_dashboards_pass_the_lint():
    assert lint.lint(generated()) == []


def test_dashboards_cover_what_the_issue_asks_for():
    by_uid = {d["uid"]: d for d in generated()}
    assert set(by_uid) == {"netbench-overview", "netbench-training", "netbench-network", "netbench-sweep"}
    for dashboard in by_uid.values():
        names = {a["name"] for a in dashboard["annotations"]["list"]}
        assert {"Profile changes", "Warm-up end"} <= names
        exprs = [q.expr for q in lint.queries(dashboard) if q.kind == "panel"]
        assert all("rate(" not in e or "$__rate_interval" in e for e in exprs), dashboard["uid"]
    kinds = {p["type"] for p in by_uid["netbench-training"]["panels"]}
    assert {"heatmap", "bargauge", "timeseries"} <= kinds
    network = " ".join(q.expr for q in lint.queries(by_uid["netbench-network"]))
    for metric in ("netbench_profile_delay_seconds", "netbench_profile_jitter_seconds",
                   "netbench_profile_rate_bytes_per_second", "netbench_profile_loss_ratio",
                   "netbench_interface_bytes_total", "netbench_interface_packets_total",
                   "netbench_interface_drops_total", "netbench_qdisc_drops_total", "netbench_qdisc_overlimits_total",
                   "netbench_qdisc_backlog_bytes", "netbench_engine_queue_depth_packets"):
        assert metric in network, metric


def test_lint_finds_each_kind_of_problem():
    bad = copy.deepcopy(generated()[:2])
    bad[1]["uid"] = bad[0]["uid"]
    panels = bad[0]["panels"]
    panels[1]["id"] = panels[0]["id"]
    panels[0]["fieldConfig"]["defaults"].pop("unit")
    panels[2]["targets"][0]["expr"] = "netbench_steps_total"
    panels[3]["targets"][0]["expr"] = "rate(netbench_no_such_metric_total[1m])"
    panels[4]["datasource"] = {"type": "prometheus", "uid": "fixed"}
    bad[1]["templating"]["list"] = [v for v in bad[1]["templating"]["list"] if v["type"] != "datasource"]
    problems = "\n".join(lint.lint(bad))
    for expected in ("duplicate dashboard uid", "duplicate panel id", "no unit",
                     "counter netbench_steps_total outside rate() or increase()",
                     "netbench_no_such_metric_total is not in the metric catalogue",
                     "does not use the datasource variable", "no Prometheus datasource variable"):
        assert expected in problems, expected


def test_metric_scanner_skips_functions_labels_and_modifiers():
    expr = ('sum by (le, node) (rate(netbench_step_duration_seconds_bucket{node=~"n1|up"}[5m])) '
            '* on(instance) group_left(profile) netbench_profile_active offset 1m')
    assert [n for n, _ in lint.metric_names(expr)] == ["netbench_step_duration_seconds_bucket",
                                                         "netbench_profile_active"]
    assert lint.label_values("label_values(netbench_steps_total{a=\"b\"}, worker)") == \
        ('netbench_steps_total{a="b"}', "worker")


def mounts(volumes: list[str]) -> dict[str, str]:
    """{source: target} of compose "source:target[:mode]" volume entries."""
    return {entry.split(":")[0]: entry.split(":")[1] for entry in volumes}


def test_provisioning_compose_and_prometheus_fit_together():
    datasource = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://localhost:9090"
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/netbench.yml").read_text())["providers"][0]
    compose = yaml.safe_load((GRAFANA / "docker-compose.yml").read_text())["services"]
    grafana_mounts = mounts(compose["grafana"]["volumes"])
    assert grafana_mounts["./dashboards"] == provider["options"]["path"]
    assert grafana_mounts["./provisioning"] == "/etc/grafana/provisioning"
    prom_mounts = mounts(compose["prometheus"]["volumes"])
    for source in [*grafana_mounts, *prom_mounts]:
        if source.startswith("./"):
            assert (GRAFANA / source).exists(), source
    assert "--web.listen-address=127.0.0.1:9090" in compose["prometheus"]["command"]
    assert all(s.get("network_mode") == "host" for s in compose.values())  # scrapes 127.0.0.1
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] in ("1s", "2s")
    job = config["scrape_configs"][0]
    glob = job["file_sd_configs"][0]["files"][0]
    assert glob == str(targets_dir(Path("/run/netbench")) / "*.json")
    assert prom_mounts[str(Path(glob).parent)] == str(Path(glob).parent)


def test_promtool_accepts_the_shipped_config():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: 'make install' installs Debian's prometheus package"
    result = subprocess.run([promtool, "check", "config", "--syntax-only", str(GRAFANA / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_promtool_rejects_a_broken_config(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: 'make install' installs Debian's prometheus package"
    broken = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    broken["global"]["scrape_timeout"] = "5s"  # longer than the interval: invalid
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(broken))
    result = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0


def test_every_dashboard_is_valid_json_with_stable_uid():
    for path in (GRAFANA / "dashboards").glob("*.json"):
        data = json.loads(path.read_text())
        assert path.stem == data["uid"], path
