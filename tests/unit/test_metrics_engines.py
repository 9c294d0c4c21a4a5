"""Pure tier: the delay engines' series (userspace backend) beside the qdisc's, and the network
dashboard showing whichever of the two a profile needs."""

from __future__ import annotations

import pytest

from netbench.emulation.engine import DelayEngine, EngineParams
from netbench.metrics import catalogue, dashboards, lint
from netbench.metrics.network import decode_engine
from netbench.metrics.state import MetricsState
from tests.fakes.metrics_network import engine_stats, kernel_row, userspace_reader
from tests.unit.test_metrics import samples, scrape

ENGINE_SERIES = ("netbench_engine_up", "netbench_engine_queue_depth_packets", "netbench_engine_kernel_queue_packets",
                 "netbench_engine_received_packets_total", "netbench_engine_released_packets_total",
                 "netbench_engine_drops_total", "netbench_engine_late_releases_total",
                 "netbench_engine_lateness_seconds_total")
QDISC_SERIES = ("netbench_qdisc_packets_total", "netbench_qdisc_drops_total", "netbench_qdisc_overlimits_total",
                "netbench_qdisc_backlog_bytes", "netbench_qdisc_backlog_packets")


PAIR_PANELS = ["Pair packets and drops", "Pair delay (configured, one-way)", "Pair rate limit (configured)"]


def by_node(values: dict) -> dict:
    return {dict(labels)["node"]: value for labels, value in values.items()}


def test_the_fake_stats_file_has_the_keys_a_real_engine_writes():
    real = DelayEngine(EngineParams(20_000), queue_num=1).stats()
    assert set(engine_stats()) == set(real) | {"alive"}
    assert set(engine_stats()["kernel"]) == {"queue_num", "peer_portid", "queue_total", "copy_mode", "copy_range",
                                             "queue_dropped", "user_dropped", "id_sequence"}
    # a real engine's stats decode; before its queue is bound it has released and dropped nothing
    decoded = decode_engine("n1", {**real, "alive": True})
    assert (decoded.up, decoded.received, decoded.released, decoded.queue_depth) == (True, 0, 0, 0)
    assert dict(decoded.drops)["loss"] == 0


def test_a_latency_only_userspace_node_has_engine_series_and_no_qdisc_series():
    families, _ = scrape(MetricsState(), userspace_reader(delay=True, rate=False))
    for name in QDISC_SERIES:
        assert samples(families, name) == {}, name
    assert by_node(samples(families, "netbench_engine_up")) == {"n1": 1, "n2": 1}
    assert by_node(samples(families, "netbench_engine_queue_depth_packets")) == {"n1": 3, "n2": 3}
    assert by_node(samples(families, "netbench_engine_kernel_queue_packets")) == {"n1": 0, "n2": 1}
    assert by_node(samples(families, "netbench_engine_received_packets_total")) == {"n1": 100, "n2": 200}
    assert by_node(samples(families, "netbench_engine_released_packets_total")) == {"n1": 96, "n2": 196}
    drops = {(dict(labels)["node"], dict(labels)["reason"]): value
             for labels, value in samples(families, "netbench_engine_drops_total").items()}
    assert drops == {(node, reason): value for node in ("n1", "n2")
                     for reason, value in (("loss", 1), ("queue_full", 2), ("socket_full", 1))}
    assert {reason for _, reason in drops} == set(catalogue.ENGINE_DROP_REASONS)
    late = {(dict(labels)["node"], dict(labels)["over"]): value
            for labels, value in samples(families, "netbench_engine_late_releases_total").items()}
    assert late == {("n1", "1ms"): 9, ("n1", "10ms"): 1, ("n2", "1ms"): 19, ("n2", "10ms"): 3}
    # 96 and 196 releases, 80 us late on average: the sum, from which rate() / released gives the mean
    assert by_node(samples(families, "netbench_engine_lateness_seconds_total")) == pytest.approx(
        {"n1": 96 * 80e-6, "n2": 196 * 80e-6})


def test_a_rate_only_userspace_node_has_qdisc_series_and_no_engine_series():
    families, _ = scrape(MetricsState(), userspace_reader(delay=False, rate=True))
    for name in ENGINE_SERIES:
        assert samples(families, name) == {}, name
    assert by_node(samples(families, "netbench_qdisc_packets_total")) == {"n1": 100, "n2": 200}
    assert by_node(samples(families, "netbench_qdisc_backlog_packets")) == {"n1": 2, "n2": 2}


def test_kernel_counters_appear_only_while_the_engine_reads_them_and_gauges_only_while_it_runs():
    without_kernel = decode_engine("n1", engine_stats(received=10, accepted=9, dropped=1, kernel=None) | {"kernel": None})
    assert without_kernel.drops == (("loss", 1),) and without_kernel.kernel_queue is None
    dead = decode_engine("n1", engine_stats(alive=False, received=10, accepted=9, queue_depth=4,
                                            kernel=kernel_row(queue_total=5, queue_dropped=3)))
    assert (dead.up, dead.queue_depth, dead.kernel_queue, dead.received) == (False, 0, None, 10)
    assert dict(dead.drops) == {"loss": 0, "queue_full": 3, "socket_full": 0}  # counters stay, gauges go
    ready_line_only = decode_engine("n1", {"event": "ready", "pid": 1, "queue_num": 1, "alive": True})
    assert (ready_line_only.received, ready_line_only.released, ready_line_only.drops) == (0, 0, (("loss", 0),))


def panels_without_series(dashboard: dict, exposed: set[str]) -> list[str]:
    """Titles of panels none of whose targets selects only series the scrape exposes (row headers
    have no query)."""
    empty = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        if not any(all(name in exposed for name, _ in lint.metric_names(t["expr"])) for t in panel["targets"]):
            empty.append(panel["title"])
    return empty


@pytest.mark.parametrize("delay, rate", [(True, False), (False, True), (True, True)],
                         ids=["latency-only", "rate-only", "latency-and-rate"])
def test_every_network_panel_has_a_series_under_the_userspace_backend(delay, rate):
    state = MetricsState()
    state.sweep_started("sweep-1", "userspace", "mlp", "allreduce", runs=1, workers=2, batch_size=32)
    state.profile_applied("p", 20_000 if delay else 0, 0, 62_500_000 if rate else 0, 0.0)
    families, _ = scrape(state, userspace_reader(delay=delay, rate=rate))
    exposed = {s.name for family in families.values() for s in family.samples}
    # one profile on every link: only the per-pair row (a per-pair topology's) is empty, and the
    # engines' lateness where no engine runs (a rate alone is the qdisc's)
    lateness = [] if delay else ["Delay engine lateness (added to the configured delay)"]
    assert panels_without_series(dashboards.network(), exposed) == lateness + PAIR_PANELS


def test_the_shaper_panels_name_the_mechanism_of_each_series():
    panels = [p for p in dashboards.network()["panels"] if "(qdisc, delay engine)" in p["title"]]
    assert len(panels) == 3
    for panel in panels:
        metrics = {name for t in panel["targets"] for name, _ in lint.metric_names(t["expr"])}
        assert any(m.startswith("netbench_qdisc_") for m in metrics), panel["title"]
        assert any(m.startswith("netbench_engine_") for m in metrics), panel["title"]
        for t in panel["targets"]:
            mechanism = "qdisc" if "netbench_qdisc_" in t["expr"] else "delay engine"
            assert mechanism in t["legendFormat"], (panel["title"], t["legendFormat"])
