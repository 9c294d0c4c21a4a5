"""A prometheus_client custom collector: the catalogue filled from current state at scrape time."""

from __future__ import annotations

import math
from typing import Iterator

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily, Metric)
from prometheus_client.registry import Collector

from netbench.metrics.catalogue import BY_NAME, CATALOGUE, DIRECTIONS, RUN_STATUSES, SWEEP_STATES
from netbench.metrics.network import NetworkReader, NetworkSample
from netbench.metrics.state import MetricsState, Snapshot

_FAMILIES = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily,
             "info": InfoMetricFamily}


def family(name: str) -> Metric:
    """An empty metric family for catalogue entry `name` (help and label names from the catalogue)."""
    metric = BY_NAME[name]
    labels = [label for label in metric.labels]
    if metric.type == "info":
        # an info metric's labels are its value; it has no label dimensions of its own
        return InfoMetricFamily(metric.family, metric.help, labels=[])
    return _FAMILIES[metric.type](metric.family, metric.help, labels=labels)


class NetbenchCollector(Collector):
    """Reads the sweep's state and the testbed's counters each time Prometheus scrapes."""

    def __init__(self, state: MetricsState, network: NetworkReader | None = None) -> None:
        self.state = state
        self.network = network
        self.scrapes = 0  # collections begun; the exporter waits for one more before it stops
        self.completed = 0  # collections whose every family was produced

    def describe(self) -> Iterator[Metric]:
        for metric in CATALOGUE:
            yield family(metric.name)

    def collect(self) -> Iterator[Metric]:
        self.scrapes += 1
        snap = self.state.snapshot()
        sample = self.network.sample() if self.network is not None else NetworkSample()
        yield from sweep_families(snap)
        yield from profile_families(snap)
        yield from training_families(snap)
        yield from network_families(sample)
        self.completed += 1


def sweep_families(s: Snapshot) -> Iterator[Metric]:
    build = family("netbench_build_info")
    build.add_metric([], s.build)
    yield build
    info = family("netbench_sweep_info")
    if s.sweep:
        info.add_metric([], s.sweep)
    yield info
    state = family("netbench_sweep_state")
    for name in SWEEP_STATES:
        state.add_metric([name], 1.0 if name == s.state else 0.0)
    yield state
    started = family("netbench_sweep_start_time_seconds")
    if s.sweep_started_at is not None:
        started.add_metric([], s.sweep_started_at)
    yield started
    runs = family("netbench_sweep_runs")
    runs.add_metric([], s.runs_planned)
    yield runs
    completed = family("netbench_sweep_runs_completed_total")
    for status in RUN_STATUSES:
        completed.add_metric([status], s.runs_completed.get(status, 0))
    yield completed
    progress = family("netbench_sweep_progress_ratio")
    progress.add_metric([], sum(s.runs_completed.values()) / s.runs_planned if s.runs_planned else 0.0)
    yield progress
    run = family("netbench_run_info")
    run_started = family("netbench_run_start_time_seconds")
    if s.run:
        run.add_metric([], s.run)
        run_started.add_metric([], s.run_started_at)
    yield run
    yield run_started
    window_start = family("netbench_measured_window_start_timestamp_seconds")
    window_end = family("netbench_measured_window_end_timestamp_seconds")
    for run_id, (start, end, launch, point) in sorted(s.windows.items()):
        window_start.add_metric([run_id, launch, point], start)
        window_end.add_metric([run_id, launch, point], end)
    yield window_start
    yield window_end
    images = family("netbench_run_images_per_second")
    if s.run_images_per_s is not None and math.isfinite(s.run_images_per_s):
        images.add_metric([], s.run_images_per_s)
    yield images
    results = family("netbench_result_images_per_second")
    for profile, value in sorted(s.result_images_per_s.items()):
        results.add_metric([profile], value)
    yield results


def profile_families(s: Snapshot) -> Iterator[Metric]:
    p = s.profile
    values = {"netbench_profile_active": None, "netbench_profile_delay_seconds": p and p.delay_s,
              "netbench_profile_jitter_seconds": p and p.jitter_s,
              "netbench_profile_rate_bytes_per_second": p and p.rate_bytes_per_s,
              "netbench_profile_loss_ratio": p and p.loss,
              "netbench_profile_applied_timestamp_seconds": p and p.applied_at}
    for name, value in values.items():
        fam = family(name)
        if p is not None:
            # only the active profile's label set exists: a change removes the old one
            fam.add_metric([p.name] if name == "netbench_profile_active" else [], 1.0 if value is None else value)
        yield fam
    history = family("netbench_profile_last_applied_timestamp_seconds")
    for name, applied_at in sorted(s.profile_applied_at.items()):
        history.add_metric([name], applied_at)
    yield history
    applications = family("netbench_profile_applications_total")
    applications.add_metric([], s.profile_applications)
    yield applications


def training_families(s: Snapshot) -> Iterator[Metric]:
    steps, samples = family("netbench_steps_total"), family("netbench_samples_total")
    for (phase, worker), value in sorted(s.steps.items()):
        steps.add_metric([phase, worker], value)
    for (phase, worker), value in sorted(s.samples.items()):
        samples.add_metric([phase, worker], value)
    yield steps
    yield samples
    durations = family("netbench_step_duration_seconds")
    for (phase, worker), hist in sorted(s.durations.items()):
        durations.add_metric([phase, worker], hist.cumulative(), hist.total)
    yield durations
    warmups = family("netbench_warmups_completed_total")
    warmups.add_metric([], s.warmups_completed)
    yield warmups
    warmup_end = family("netbench_run_warmup_end_timestamp_seconds")
    if s.warmup_ended_at is not None:
        warmup_end.add_metric([], s.warmup_ended_at)
    yield warmup_end
    up, heartbeat = family("netbench_worker_up"), family("netbench_worker_heartbeat_timestamp_seconds")
    for worker, value in sorted(s.workers_up.items()):
        up.add_metric([worker], value)
    for worker, value in sorted(s.heartbeats.items()):
        heartbeat.add_metric([worker], value)
    yield up
    yield heartbeat
    yield from rank_families(s)


def rank_families(s: Snapshot) -> Iterator[Metric]:
    """Per rank of the run in progress: mean step, time outside computation, share finished last."""
    names = ("netbench_rank_step_seconds", "netbench_rank_waiting_seconds", "netbench_rank_last_ratio")
    families = [family(name) for name in names]
    for rank, values in sorted(s.ranks.items(), key=lambda item: int(item[0])):
        for fam, value in zip(families, values):
            if value is not None:
                fam.add_metric([rank, s.rank_nodes.get(rank, "")], value)
    yield from families


def network_families(n: NetworkSample) -> Iterator[Metric]:
    by_direction = {"netbench_interface_bytes_total": ("rx_bytes", "tx_bytes"),
                    "netbench_interface_packets_total": ("rx_packets", "tx_packets"),
                    "netbench_interface_drops_total": ("rx_dropped", "tx_dropped")}
    for name, (rx, tx) in by_direction.items():
        fam = family(name)
        for i in n.interfaces:
            for direction, attr in zip(DIRECTIONS, (tx, rx)):
                fam.add_metric([i.node, i.interface, direction], getattr(i, attr))
        yield fam
    qdisc = {"netbench_qdisc_packets_total": "sent_packets", "netbench_qdisc_drops_total": "drops",
             "netbench_qdisc_overlimits_total": "overlimits", "netbench_qdisc_backlog_bytes": "backlog_bytes",
             "netbench_qdisc_backlog_packets": "backlog_packets"}
    for name, attr in qdisc.items():
        fam = family(name)
        for q in n.qdiscs:
            fam.add_metric([q.node, q.interface], getattr(q, attr))
        yield fam
    yield from engine_families(n)
    yield from pair_families(n)
    errors = family("netbench_network_read_errors_total")
    errors.add_metric([], n.read_errors)
    yield errors


def engine_families(n: NetworkSample) -> Iterator[Metric]:
    """The delay engines' families; the gauges of what an engine holds exist only while it runs."""
    up, depth = family("netbench_engine_up"), family("netbench_engine_queue_depth_packets")
    kernel_queue = family("netbench_engine_kernel_queue_packets")
    received = family("netbench_engine_received_packets_total")
    released = family("netbench_engine_released_packets_total")
    drops = family("netbench_engine_drops_total")
    late, lateness = family("netbench_engine_late_releases_total"), family("netbench_engine_lateness_seconds_total")
    for e in n.engines:
        up.add_metric([e.node], 1.0 if e.up else 0.0)
        received.add_metric([e.node], e.received)
        released.add_metric([e.node], e.released)
        lateness.add_metric([e.node], e.lateness_s)
        for reason, value in e.drops:
            drops.add_metric([e.node, reason], value)
        for over, value in e.late:
            late.add_metric([e.node, over], value)
        if e.up:
            depth.add_metric([e.node], e.queue_depth)
            if e.kernel_queue is not None:
                kernel_queue.add_metric([e.node], e.kernel_queue)
    yield from (up, depth, kernel_queue, received, released, drops, late, lateness)


def pair_families(n: NetworkSample) -> Iterator[Metric]:
    """The per-pair families: one series per ordered pair a node shapes per destination."""
    delay, rate = family("netbench_pair_configured_delay_seconds"), family("netbench_pair_configured_rate_bytes_per_second")
    packets, drops = family("netbench_pair_packets_total"), family("netbench_pair_drops_total")
    seen: set[tuple[str, str]] = set()
    for p in n.pairs:
        if (p.src, p.dst) in seen:  # one shaper per pair; a second reading of it would repeat the series
            continue
        seen.add((p.src, p.dst))
        delay.add_metric([p.src, p.dst], p.delay_s)
        rate.add_metric([p.src, p.dst], p.rate_bytes_per_s)
        packets.add_metric([p.src, p.dst, p.mechanism], p.packets)
        drops.add_metric([p.src, p.dst, p.mechanism], p.drops)
    yield from (delay, rate, packets, drops)
