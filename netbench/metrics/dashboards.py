"""Grafana dashboards for netbench's metrics, generated as plain dicts; every panel's Prometheus
query, and the training dashboard's per-rank row, are built typed with Grafana's SDK
(grafana-foundation-sdk: metrics/sdk.py, metrics/rank_panels.py).

`python -m netbench.metrics.dashboards grafana/dashboards` (or `make dashboards`) writes one
JSON file per dashboard; a test regenerates them and compares with the committed files.
Every query filters on the `$instance` variable (one per netbench process Prometheus
scrapes), every panel has a unit, every uid is fixed, and counters appear only inside
rate() or increase().
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from netbench.metrics import rank_panels, sdk

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
IMAGES_PER_S = "suffix: img/s"
SEL = 'instance=~"$instance"'


def _variables(*extra: dict) -> dict:
    datasource = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                  "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}
    instance = _query_variable("instance", "Sweep", "label_values(netbench_sweep_info, instance)")
    return {"list": [datasource, instance, *extra]}


def _query_variable(name: str, label: str, query: str) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "definition": query, "query": {"query": query, "refId": f"{name}-variable"},
            "includeAll": True, "allValue": ".+", "multi": True, "refresh": 2, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0, "options": []}


NODE_VARIABLE = _query_variable("node", "Node", f"label_values(netbench_interface_bytes_total{{{SEL}}}, node)")
PAIR_SERIES = "netbench_pair_configured_delay_seconds"
SRC_VARIABLE = _query_variable("src", "Pair from", f"label_values({PAIR_SERIES}{{{SEL}}}, src)")
DST_VARIABLE = _query_variable("dst", "Pair to", f'label_values({PAIR_SERIES}{{{SEL}, src=~"$src"}}, dst)')
WORKER_VARIABLE = _query_variable("worker", "Worker", f"label_values(netbench_steps_total{{{SEL}}}, worker)")

ANNOTATIONS = {"list": [
    {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
     "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
    # the series' value is the event's time in ms (useValueForTime): exact, and never missed when
    # the first scrape comes after the event (each profile keeps its own series for the sweep)
    {"name": "Profile changes", "datasource": DATASOURCE, "enable": True, "iconColor": "orange",
     "expr": f"netbench_profile_last_applied_timestamp_seconds{{{SEL}}} * 1000",
     "useValueForTime": True, "step": "10s", "titleFormat": "profile {{profile}}", "tagKeys": "profile",
     "textFormat": "profile applied"},
    {"name": "Warm-up end", "datasource": DATASOURCE, "enable": True, "iconColor": "green",
     "expr": f"netbench_run_warmup_end_timestamp_seconds{{{SEL}}} * 1000"
             f" * on(instance) group_left(run) netbench_run_info{{{SEL}}}",
     "useValueForTime": True, "step": "10s", "titleFormat": "warm-up done: {{run}}", "tagKeys": "run",
     "textFormat": "measured steps begin"},
    # each point's measured window, from its exact start and end (one series per run, kept for
    # the sweep): the steps between a change and the window's start settle and are not measured
    {"name": "Measured window start", "datasource": DATASOURCE, "enable": True, "iconColor": "blue",
     "expr": f"netbench_measured_window_start_timestamp_seconds{{{SEL}}} * 1000",
     "useValueForTime": True, "step": "10s", "tagKeys": "run,launch",
     "titleFormat": "measured window of {{run}} starts (launch {{launch}}, point {{point}})",
     "textFormat": "first measured step of the point"},
    {"name": "Measured window end", "datasource": DATASOURCE, "enable": True, "iconColor": "purple",
     "expr": f"netbench_measured_window_end_timestamp_seconds{{{SEL}}} * 1000",
     "useValueForTime": True, "step": "10s", "tagKeys": "run,launch",
     "titleFormat": "measured window of {{run}} ends (launch {{launch}}, point {{point}})",
     "textFormat": "last measured step of the point"},
]}

RUN_LEGEND = "{{run}} (repeat {{repeat}}, launch {{launch}}, point {{point}})"
RUN_HELP = ("The run in progress, its launch (one start of the job's processes; isolated: a launch of its "
            "own) and its point within the launch.")


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    """A panel's Prometheus query, built with Grafana's SDK (metrics/sdk.py)."""
    return sdk.as_dict(sdk.query(expr, legend, ref, instant, fmt))


class Layout:
    """Places panels left to right on Grafana's 24-column grid and numbers them."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.x = self.y = self.row_h = 0

    def add(self, title: str, kind: str, targets: list[dict], unit: str, w: int = 8, h: int = 8,
            description: str = "", options: dict | None = None, defaults: dict | None = None) -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel = {"id": len(self.panels) + 1, "title": title, "type": kind, "datasource": DATASOURCE,
                 "description": description, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
                 "targets": targets, "fieldConfig": {"defaults": {"unit": unit, **(defaults or {})}, "overrides": []},
                 "options": options or {}}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def place(self, panel: dict, w: int = 8, h: int = 8) -> None:
        """A panel built elsewhere (metrics/rank_panels.py: Grafana's SDK), numbered and placed here."""
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append({**panel, "id": len(self.panels) + 1, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h}})
        self.x += w
        self.row_h = max(self.row_h, h)

    def row(self, title: str, description: str = "") -> None:
        """A row header across the grid: the panels added next go below it."""
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append({"id": len(self.panels) + 1, "title": title, "type": "row", "collapsed": False,
                            "description": description, "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
                            "panels": []})
        self.y += 1


def _stat(text_mode: str = "value") -> dict:
    return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": text_mode, "colorMode": "value", "graphMode": "none", "justifyMode": "auto"}


def _dashboard(uid: str, title: str, layout: Layout, variables: dict, description: str) -> dict:
    return {"uid": uid, "title": title, "description": description, "tags": ["netbench"],
            "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
            "refresh": "5s", "time": {"from": "now-30m", "to": "now"}, "timezone": "",
            "annotations": ANNOTATIONS, "templating": variables, "panels": layout.panels,
            "links": [{"title": "netbench", "type": "dashboards", "tags": ["netbench"], "asDropdown": True}]}


def _measured_rate(by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return (f'sum{grouping} (rate(netbench_samples_total{{{SEL}, phase="measured", worker=~"$worker"}}'
            f"[$__rate_interval]))")


def overview() -> dict:
    lay = Layout()
    lay.add("Sweep state", "stat", [target(f"netbench_sweep_state{{{SEL}}} == 1", "{{state}}")], "none", w=4, h=4,
            options=_stat("name"), description="What the sweep is doing now.")
    lay.add("Active profile", "stat", [target(f"netbench_profile_active{{{SEL}}}", "{{profile}}")], "none", w=6,
            h=4, options=_stat("name"), description="The profile on every link now.")
    lay.add("Run", "stat", [target(f"netbench_run_info{{{SEL}}}", RUN_LEGEND)], "none", w=4,
            h=4, options=_stat("name"), description=RUN_HELP)
    lay.add("Images/sec now", "stat", [target(_measured_rate().replace(', worker=~"$worker"', ""))], IMAGES_PER_S,
            w=5, h=4, options=_stat(), description="All workers' measured images over the last rate interval.")
    lay.add("Images/sec since warm-up", "stat", [target(f"netbench_run_images_per_second{{{SEL}}}")], IMAGES_PER_S,
            w=5, h=4, options=_stat(), description="Global batch / mean measured step time of the run so far.")
    lay.add("Workers up", "stat", [target(f"sum(netbench_worker_up{{{SEL}}})", "up"),
                                   target(f"count(netbench_worker_up{{{SEL}}})", "workers", ref="B")],
            "none", w=4, h=4, options=_stat(), description="Workers whose process runs and reports.")
    lay.add("Sweep progress", "gauge", [target(f"netbench_sweep_progress_ratio{{{SEL}}}")], "percentunit", w=4,
            h=4, options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            defaults={"min": 0, "max": 1}, description="Runs ended over runs planned.")
    lay.add("Delay (one-way)", "stat", [target(f"netbench_profile_delay_seconds{{{SEL}}}")], "s", w=4, h=4,
            options=_stat())
    lay.add("Jitter", "stat", [target(f"netbench_profile_jitter_seconds{{{SEL}}}")], "s", w=4, h=4, options=_stat())
    lay.add("Rate limit", "stat", [target(f"netbench_profile_rate_bytes_per_second{{{SEL}}} * 8")], "bps", w=4,
            h=4, options=_stat(), description="0: no limit.",
            defaults={"mappings": [{"type": "value", "options": {"0": {"text": "unlimited"}}}]})
    lay.add("Loss", "stat", [target(f"netbench_profile_loss_ratio{{{SEL}}}")], "percentunit", w=4, h=4,
            options=_stat())
    lay.add("Images/sec", "timeseries", [target(_measured_rate().replace(', worker=~"$worker"', ""), "now"),
                                         target(f"netbench_run_images_per_second{{{SEL}}}", "run since warm-up",
                                                ref="B")],
            IMAGES_PER_S, w=24, h=9, description="Throughput while the profile changes (see the annotations).")
    return _dashboard("netbench-overview", "netbench / Overview", lay, _variables(WORKER_VARIABLE),
                      "State, active profile and throughput of a running sweep.")


def training() -> dict:
    lay = Layout()
    lay.add("Run", "stat", [target(f"netbench_run_info{{{SEL}}}", RUN_LEGEND)], "none", w=12, h=3,
            options=_stat("name"), description=RUN_HELP)
    lay.add("Sweep state", "stat", [target(f"netbench_sweep_state{{{SEL}}} == 1", "{{state}}")], "none", w=12,
            h=3, options=_stat("name"),
            description="settle: the steps after a change of profile, before the point's measured window.")
    lay.add("Images/sec per worker", "timeseries", [target(_measured_rate("worker"), "worker {{worker}}")],
            IMAGES_PER_S, w=12, description="Measured images each worker trains on per second.")
    buckets = f'netbench_step_duration_seconds_bucket{{{SEL}, phase="measured", worker=~"$worker"}}'
    lay.add("Step time quantiles", "timeseries",
            [target(f"histogram_quantile({q}, sum by (le) (rate({buckets}[$__rate_interval])))", f"p{int(q * 100)}",
                    ref=ref) for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))],
            "s", w=12, description="Quantiles of measured step durations (histogram).")
    selector = f'{{{SEL}, phase="measured", worker=~"$worker"}}'
    lay.add("Mean step time", "timeseries",
            [target(f"sum by (worker) (rate(netbench_step_duration_seconds_sum{selector}[$__rate_interval]))"
                    f" / sum by (worker) (rate(netbench_step_duration_seconds_count{selector}[$__rate_interval]))",
                    "worker {{worker}}")], "s", w=12)
    lay.add("Step time heatmap", "heatmap",
            [target(f"sum by (le) (increase({buckets}[$__rate_interval]))", "{{le}}", fmt="heatmap")], "s", w=12,
            options={"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1,
                     "color": {"mode": "scheme", "scheme": "Oranges"}})
    lay.add("Throughput by profile", "bargauge",
            [target(f"netbench_result_images_per_second{{{SEL}}}", "{{profile}}", instant=True)], IMAGES_PER_S, w=12,
            options={"orientation": "horizontal", "displayMode": "basic",
                     "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            description="Images/sec of the last completed run of each profile.")
    lay.add("Steps/sec by phase", "timeseries",
            [target(f'sum by (phase) (rate(netbench_steps_total{{{SEL}, worker="0"}}[$__rate_interval]))',
                    "{{phase}}")], "suffix: steps/s", w=12, description="The chief worker's step rate.")
    lay.row(rank_panels.ROW, description=rank_panels.ROW_HELP)
    for panel, width in rank_panels.panels():
        lay.place(panel, w=width)
    return _dashboard("netbench-training", "netbench / Training", lay, _variables(WORKER_VARIABLE),
                      "Per-worker throughput and step-time distribution.")


def network() -> dict:
    lay = Layout()
    node = f'{SEL}, node=~"$node"'
    lay.add("Delay and jitter (configured)", "timeseries",
            [target(f"netbench_profile_delay_seconds{{{SEL}}}", "delay"),
             target(f"netbench_profile_jitter_seconds{{{SEL}}}", "jitter", ref="B")], "s", w=8)
    lay.add("Rate limit (configured)", "timeseries",
            [target(f"netbench_profile_rate_bytes_per_second{{{SEL}}} * 8", "rate")], "bps", w=8,
            description="0: no limit.")
    lay.add("Loss (configured)", "timeseries", [target(f"netbench_profile_loss_ratio{{{SEL}}}", "loss")],
            "percentunit", w=8)
    lay.add("Interface throughput", "timeseries",
            [target(f"sum by (node, direction) (rate(netbench_interface_bytes_total{{{node}}}[$__rate_interval])) * 8",
                    "{{node}} {{direction}}")], "bps", w=12)
    lay.add("Interface packets", "timeseries",
            [target(f"sum by (node, direction) (rate(netbench_interface_packets_total{{{node}}}[$__rate_interval]))",
                    "{{node}} {{direction}}")], "pps", w=12)
    lay.add("Interface drops", "timeseries",
            [target(f"sum by (node, direction) (rate(netbench_interface_drops_total{{{node}}}[$__rate_interval]))",
                    "{{node}} {{direction}}")], "pps", w=8)
    _shaper_panels(lay, node)
    _pair_panels(lay)
    return _dashboard("netbench-network", "netbench / Network", lay,
                      _variables(NODE_VARIABLE, SRC_VARIABLE, DST_VARIABLE),
                      "The configured profile and what the testbed's interfaces, qdiscs and delay engines saw.")


QDISC = "netbench's root qdisc on each node's interface (tbf for a rate, or netem/htb under the netem backend)"
ENGINE = "each node's delay engine and the kernel NFQUEUE that feeds it (userspace backend, when a profile has delay, \
jitter or loss)"


def _right_axis(ref: str, unit: str) -> dict:
    return {"matcher": {"id": "byFrameRefID", "options": ref},
            "properties": [{"id": "unit", "value": unit}, {"id": "custom.axisPlacement", "value": "right"}]}


def _shaper_panels(lay: Layout, node: str) -> None:
    """Queues, drops and packets of what shapes the links: one target per mechanism, so each panel
    shows what the active backend has (the qdisc for a rate or netem, the delay engine for delay)."""
    lay.add("Drops and overlimits (qdisc, delay engine)", "timeseries",
            [target(f"sum by (node) (rate(netbench_qdisc_drops_total{{{node}}}[$__rate_interval]))",
                    "{{node}} qdisc drops"),
             target(f"sum by (node) (rate(netbench_qdisc_overlimits_total{{{node}}}[$__rate_interval]))",
                    "{{node}} qdisc overlimits", ref="B"),
             target(f"sum by (node, reason) (rate(netbench_engine_drops_total{{{node}}}[$__rate_interval]))",
                    "{{node}} delay engine drops: {{reason}}", ref="C")], "pps", w=8,
            description=f"Qdisc: {QDISC}. Delay engine: {ENGINE}; drops by reason (loss, the kernel queue "
                        "or the engine's socket full).")
    lay.add("Queued packets (qdisc, delay engine)", "timeseries",
            [target(f"sum by (node) (netbench_qdisc_backlog_packets{{{node}}})", "{{node}} qdisc"),
             target(f"netbench_engine_queue_depth_packets{{{node}}}", "{{node}} delay engine", ref="B"),
             target(f"netbench_engine_kernel_queue_packets{{{node}}}", "{{node}} delay engine: kernel NFQUEUE",
                    ref="C"),
             target(f"sum by (node) (netbench_qdisc_backlog_bytes{{{node}}})", "{{node}} qdisc bytes", ref="D")],
            "short", w=8,
            description=f"Packets held now. Qdisc: {QDISC} (its bytes on the right axis). Delay engine: {ENGINE}; "
                        "the engine holds packets for their release time, the kernel queue those not yet read.")
    lay.panels[-1]["fieldConfig"]["overrides"].append(_right_axis("D", "decbytes"))
    lay.add("Packets through the shapers (qdisc, delay engine)", "timeseries",
            [target(f"sum by (node) (rate(netbench_qdisc_packets_total{{{node}}}[$__rate_interval]))",
                    "{{node}} qdisc sent"),
             target(f"rate(netbench_engine_received_packets_total{{{node}}}[$__rate_interval])",
                    "{{node}} delay engine received", ref="B"),
             target(f"rate(netbench_engine_released_packets_total{{{node}}}[$__rate_interval])",
                    "{{node}} delay engine released", ref="C")], "pps", w=12,
            description=f"Qdisc: {QDISC}. Delay engine: {ENGINE}.")
    released = f"sum by (node) (rate(netbench_engine_released_packets_total{{{node}}}[$__rate_interval]))"
    lay.add("Delay engine lateness (added to the configured delay)", "timeseries",
            [target(f"sum by (node) (rate(netbench_engine_lateness_seconds_total{{{node}}}[$__rate_interval])) "
                    f"/ {released}", "{{node}} mean lateness"),
             target(f"sum by (node, over) (rate(netbench_engine_late_releases_total{{{node}}}[$__rate_interval])) "
                    f"/ ignoring(over) group_left {released}", "{{node}} share over {{over}} late", ref="B")],
            "s", w=12,
            description=f"Delay engine: {ENGINE}. How late it released packets after their release time: what a "
                        "host short of CPU adds to the configured delay (mean, and the share of packets over 1 "
                        "and 10 ms late, right axis). Near zero on a host that keeps up.")
    lay.panels[-1]["fieldConfig"]["overrides"].append(_right_axis("B", "percentunit"))


PAIRS = ("each ordered pair of a per-pair topology (netbench apply --topology), from $src to $dst: its netem "
         "leaf (netem backend) or its delay engine's queue for that destination (userspace backend); empty when "
         "no node shapes per destination")


def _pair_panels(lay: Layout) -> None:
    """The per-pair row: what each selected pair carries and drops, and what it is configured to."""
    pair = f'{SEL}, src=~"$src", dst=~"$dst"'
    lay.row("Per-pair links", description=f"Per-pair links: {PAIRS}.")
    lay.add("Pair packets and drops", "timeseries",
            [target(f"sum by (src, dst, mechanism) (rate(netbench_pair_packets_total{{{pair}}}[$__rate_interval]))",
                    "{{src}} to {{dst}} sent ({{mechanism}})"),
             target(f"sum by (src, dst, mechanism) (rate(netbench_pair_drops_total{{{pair}}}[$__rate_interval]))",
                    "{{src}} to {{dst}} drops ({{mechanism}})", ref="B")], "pps", w=12,
            description=f"Packets released and dropped (loss, queue limit; right axis) on {PAIRS}.")
    lay.panels[-1]["fieldConfig"]["overrides"].append(_right_axis("B", "pps"))
    lay.add("Pair delay (configured, one-way)", "timeseries",
            [target(f"netbench_pair_configured_delay_seconds{{{pair}}}", "{{src}} to {{dst}}")], "s", w=6,
            description="One-way delay each selected pair is configured to, as read back from its shaper; a round "
                        "trip crosses the pair both ways.")
    lay.add("Pair rate limit (configured)", "timeseries",
            [target(f"netbench_pair_configured_rate_bytes_per_second{{{pair}}} * 8", "{{src}} to {{dst}}")], "bps",
            w=6, description="Rate each selected pair is configured to, as read back; 0: no limit.",
            defaults={"mappings": [{"type": "value", "options": {"0": {"text": "unlimited"}}}]})


def sweep() -> dict:
    lay = Layout()
    lay.add("Progress", "gauge", [target(f"netbench_sweep_progress_ratio{{{SEL}}}")], "percentunit", w=6, h=6,
            options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            defaults={"min": 0, "max": 1})
    lay.add("Runs planned", "stat", [target(f"netbench_sweep_runs{{{SEL}}}")], "none", w=6, h=6, options=_stat())
    lay.add("Runs ended by status", "stat",
            [target(f"sum by (status) (increase(netbench_sweep_runs_completed_total{{{SEL}}}[$__range]))",
                    "{{status}}", instant=True)], "none", w=12, h=6,
            options=_stat(), description="Runs that ended within the dashboard's time range.")
    lay.add("Exporter up", "timeseries", [target(f'up{{job="netbench", {SEL}}}', "{{instance}}")], "none", w=8,
            description="Prometheus could scrape the controller.")
    lay.add("Scrape duration", "timeseries",
            [target(f'scrape_duration_seconds{{job="netbench", {SEL}}}', "{{instance}}")], "s", w=8)
    lay.add("Namespace read errors", "timeseries",
            [target(f"increase(netbench_network_read_errors_total{{{SEL}}}[$__rate_interval])", "errors")], "short",
            w=8, description="Scrapes that met a node namespace being created or removed.")
    lay.add("Workers up", "timeseries", [target(f"netbench_worker_up{{{SEL}}}", "worker {{worker}}")], "none", w=8)
    lay.add("Since last worker event", "timeseries",
            [target(f"time() - netbench_worker_heartbeat_timestamp_seconds{{{SEL}}}", "worker {{worker}}")], "s", w=8,
            description="Seconds since each worker's last event (its heartbeat).")
    lay.add("Run and profile age", "timeseries",
            [target(f"time() - netbench_run_start_time_seconds{{{SEL}}}", "run"),
             target(f"time() - netbench_profile_applied_timestamp_seconds{{{SEL}}}", "profile", ref="B"),
             target(f"time() - netbench_sweep_start_time_seconds{{{SEL}}}", "sweep", ref="C")], "s", w=8)
    lay.add("Sweep", "table",
            [target(f"netbench_sweep_info{{{SEL}}}", instant=True, fmt="table"),
             target(f"netbench_build_info{{{SEL}}}", ref="B", instant=True, fmt="table")], "none", w=24, h=6,
            options={"showHeader": True})
    return _dashboard("netbench-sweep", "netbench / Sweep progress and health", lay, _variables(),
                      "How far the sweep is, and whether the controller, its scrapes and its workers are healthy.")


DASHBOARDS = {"overview": overview, "training": training, "network": network, "sweep": sweep}


def render(dashboard: dict) -> str:
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in DASHBOARDS.items():
        path = directory / f"netbench-{name}.json"
        path.write_text(render(build()), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover - `make dashboards`
    for written_path in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "grafana/dashboards")):
        print(written_path)
