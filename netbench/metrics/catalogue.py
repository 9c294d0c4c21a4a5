"""Every metric netbench exports, in one place: name, type, labels and meaning.

Conventions (Prometheus): base units in the name (seconds, bytes, ratio), counters end in
`_total`, constant facts are `_info` metrics with value 1, and every label has a bounded set
of values (phases, states, directions, the sweep's nodes, workers and profiles). The docs'
metrics reference is generated from this catalogue (docs/hooks.py), and the dashboard lint
checks that every queried metric is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("warmup", "measured")
# settle: a shared launch's steps after a change of profile, before the point's measured window
SWEEP_STATES = ("setup", "applying", "starting", "warmup", "settle", "measured", "finished")
RUN_STATUSES = ("ok", "timeout", "failed", "interrupted")
DIRECTIONS = ("transmit", "receive")
# why a packet on a delay engine's path was dropped: the engine's loss verdict, the kernel's
# NFQUEUE at its maxlen, the engine's netlink socket buffer full (the kernel could not hand it over)
ENGINE_DROP_REASONS = ("loss", "queue_full", "socket_full")
# how late an engine's release must be to count in netbench_engine_late_releases_total (the
# engine's own counters: delay_queue.LatenessStats)
ENGINE_LATE_OVER = ("1ms", "10ms")
# what shapes an ordered pair of a per-destination topology: a netem leaf under the node's htb
# root (netem backend), or the node's delay engine's queue for that destination (userspace)
PAIR_MECHANISMS = ("netem", "engine")

# step durations from a 5 ms unshaped step to a 60 s step under a slow, lossy link
STEP_DURATION_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0,
                           10.0, 30.0, 60.0)


@dataclass(frozen=True)
class MetricDef:
    """One metric family. `name` is the exposed name: counters end in _total, info in _info."""

    name: str
    type: str  # counter | gauge | histogram | info
    help: str
    labels: tuple[str, ...] = ()
    group: str = ""

    @property
    def family(self) -> str:
        """The name prometheus_client's metric families take (without _total / _info)."""
        if self.type == "counter":
            return self.name.removesuffix("_total")
        if self.type == "info":
            return self.name.removesuffix("_info")
        return self.name

    @property
    def series_names(self) -> tuple[str, ...]:
        """Every sample name this metric exposes (what PromQL can select)."""
        if self.type == "histogram":
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        return (self.name,)


def _m(group: str, name: str, type_: str, help_: str, *labels: str) -> MetricDef:
    return MetricDef(name=name, type=type_, help=help_, labels=tuple(labels), group=group)


CATALOGUE: tuple[MetricDef, ...] = (
    # sweep: what runs, where it is
    _m("sweep", "netbench_build_info", "info", "netbench and Python versions of the controller.",
       "version", "python"),
    _m("sweep", "netbench_sweep_info", "info", "The sweep being run: id, emulation backend, model, strategy.",
       "sweep", "backend", "model", "strategy"),
    _m("sweep", "netbench_sweep_state", "gauge",
       "1 for the sweep's current state, 0 for the others (setup, applying, starting, warmup, settle, "
       "measured, finished).", "state"),
    _m("sweep", "netbench_sweep_start_time_seconds", "gauge", "When the sweep started (Unix time, seconds)."),
    _m("sweep", "netbench_sweep_runs", "gauge", "Runs the sweep plans (points x repeats)."),
    _m("sweep", "netbench_sweep_runs_completed_total", "counter", "Runs ended, by status.", "status"),
    _m("sweep", "netbench_sweep_progress_ratio", "gauge", "Runs ended over runs planned (0 to 1)."),
    _m("sweep", "netbench_run_info", "info",
       "The run in progress: run id, repetition, its launch (the launch's number; isolated: a launch of its "
       "own) and its point within the launch (position/points, from 1).", "run", "repeat", "launch", "point"),
    _m("sweep", "netbench_run_start_time_seconds", "gauge", "When the run in progress started (Unix time)."),
    _m("sweep", "netbench_run_images_per_second", "gauge",
       "Images per second of the run in progress over its measured steps so far (images per step of "
       "the run's own job / mean step time of the chief worker; workers at their own pace: the sum of each "
       "worker's own rate, and ps-sync with backup workers: of the images of the gradients the rounds applied, "
       "shown once every worker has a measured step)."),
    _m("sweep", "netbench_measured_window_start_timestamp_seconds", "gauge",
       "When each run's measured window started: the chief's first measured step's start on the controller "
       "(Unix time, seconds); set once the window is over and kept for the sweep.", "run", "launch", "point"),
    _m("sweep", "netbench_measured_window_end_timestamp_seconds", "gauge",
       "When each run's measured window ended: the chief's last measured step's arrival on the controller "
       "(Unix time, seconds); kept for the sweep.", "run", "launch", "point"),
    _m("sweep", "netbench_result_images_per_second", "gauge",
       "Images per second of the last completed run of each profile of the sweep.", "profile"),
    # the active profile, in base units
    _m("profile", "netbench_profile_active", "gauge",
       "1 for the profile applied now; the label set of the previous profile is gone.", "profile"),
    _m("profile", "netbench_profile_delay_seconds", "gauge", "One-way delay at each node's egress, seconds."),
    _m("profile", "netbench_profile_jitter_seconds", "gauge", "Delay variation (+-), seconds."),
    _m("profile", "netbench_profile_rate_bytes_per_second", "gauge",
       "Egress rate limit in bytes per second; 0 means no limit."),
    _m("profile", "netbench_profile_loss_ratio", "gauge", "Egress drop probability (0 to 1)."),
    _m("profile", "netbench_profile_applied_timestamp_seconds", "gauge",
       "When the active profile was applied (Unix time, seconds)."),
    _m("profile", "netbench_profile_last_applied_timestamp_seconds", "gauge",
       "When each profile of this sweep was last applied (Unix time, seconds); kept after a change, so a "
       "scraper that starts late still sees every change.", "profile"),
    _m("profile", "netbench_profile_applications_total", "counter",
       "Profiles applied since the sweep started (one per run)."),
    # training, from the workers' step events
    _m("training", "netbench_steps_total", "counter", "Training steps finished, by phase and worker.",
       "phase", "worker"),
    _m("training", "netbench_samples_total", "counter",
       "Images trained on by each worker (its per-worker batch per step, k batches under allreduce-accum; "
       "with backup workers, whether or not a round applied the gradient), by phase.", "phase", "worker"),
    _m("training", "netbench_step_duration_seconds", "histogram", "Wall time of one training step, seconds.",
       "phase", "worker"),
    _m("training", "netbench_run_warmup_end_timestamp_seconds", "gauge",
       "When the chief worker of the latest run to get past warm-up finished it (Unix time, seconds)."),
    _m("training", "netbench_warmups_completed_total", "counter",
       "Runs whose chief worker finished warm-up (its first measured step arrived)."),
    _m("training", "netbench_worker_up", "gauge",
       "1 while the worker's process runs and has reported, 0 once it finished or failed.", "worker"),
    _m("training", "netbench_worker_heartbeat_timestamp_seconds", "gauge",
       "When the controller last heard from the worker (Unix time, seconds).", "worker"),
    # who waits for whom, per rank of the run in progress (metrics/ranks.py, jobs/stragglers.py)
    _m("training", "netbench_rank_step_seconds", "gauge",
       "Mean measured step time of each rank (worker) of the run in progress, seconds.", "rank", "node"),
    _m("training", "netbench_rank_waiting_seconds", "gauge",
       "Mean time per measured step each rank of the run in progress spent outside its computation "
       "(communicating and waiting for the others), seconds; steps that carry their computation time (split, or "
       "a fused step's end of computation) only.", "rank", "node"),
    _m("training", "netbench_rank_last_ratio", "gauge",
       "Share of the run in progress's steps each rank finished last in (its computation ended last, the "
       "others waited for it); synchronous strategies only (0 to 1).", "rank", "node"),
    # network, read from the testbed's namespaces at scrape time
    _m("network", "netbench_interface_bytes_total", "counter", "Bytes through a node's interface.",
       "node", "interface", "direction"),
    _m("network", "netbench_interface_packets_total", "counter", "Packets through a node's interface.",
       "node", "interface", "direction"),
    _m("network", "netbench_interface_drops_total", "counter", "Packets the interface dropped.",
       "node", "interface", "direction"),
    _m("network", "netbench_qdisc_packets_total", "counter",
       "Packets netbench's root qdisc sent.", "node", "interface"),
    _m("network", "netbench_qdisc_drops_total", "counter", "Packets dropped by netbench's root qdisc.",
       "node", "interface"),
    _m("network", "netbench_qdisc_overlimits_total", "counter",
       "Times netbench's root qdisc held a packet back for its rate.", "node", "interface"),
    _m("network", "netbench_qdisc_backlog_bytes", "gauge", "Bytes queued in netbench's root qdisc.",
       "node", "interface"),
    _m("network", "netbench_qdisc_backlog_packets", "gauge", "Packets queued in netbench's root qdisc.",
       "node", "interface"),
    _m("network", "netbench_engine_up", "gauge",
       "1 while the node's delay engine (userspace backend) runs.", "node"),
    _m("network", "netbench_engine_queue_depth_packets", "gauge",
       "Packets the node's delay engine holds for their release time now (userspace backend).", "node"),
    _m("network", "netbench_engine_kernel_queue_packets", "gauge",
       "Packets waiting in the kernel's NFQUEUE for the node's delay engine to read them (userspace backend).",
       "node"),
    _m("network", "netbench_engine_received_packets_total", "counter",
       "Packets queued to the node's delay engine (userspace backend).", "node"),
    _m("network", "netbench_engine_released_packets_total", "counter",
       "Packets the node's delay engine released after their delay (userspace backend).", "node"),
    _m("network", "netbench_engine_drops_total", "counter",
       "Packets dropped on the node's delay engine path, by reason: loss (the engine's loss verdict), "
       "queue_full (the kernel's NFQUEUE was full), socket_full (the engine's socket buffer was full).",
       "node", "reason"),
    _m("network", "netbench_engine_late_releases_total", "counter",
       "Packets the node's delay engine released more than `over` (1ms, 10ms) after their release time: "
       "the host could not run the engine in time, so those packets saw a longer delay than configured "
       "(userspace backend).", "node", "over"),
    _m("network", "netbench_engine_lateness_seconds_total", "counter",
       "Sum of how late the node's delay engine released each packet after its release time; divided by "
       "the released packets' rate, the mean lateness added to the configured delay (userspace backend).",
       "node"),
    # per-pair links: only nodes shaped per destination (a per-pair topology) have these; one
    # series per ordered pair (64 nodes: 4032 pairs)
    _m("pairs", "netbench_pair_configured_delay_seconds", "gauge",
       "One-way delay configured from src to dst, seconds, as read back from the node's shaper "
       "(per-pair topologies only).", "src", "dst"),
    _m("pairs", "netbench_pair_configured_rate_bytes_per_second", "gauge",
       "Rate limit configured from src to dst in bytes per second, as read back; 0 means no limit "
       "(per-pair topologies only).", "src", "dst"),
    _m("pairs", "netbench_pair_packets_total", "counter",
       "Packets src's shaper released toward dst: the pair's netem leaf sent them (netem) or the "
       "delay engine released them after their delay (engine).", "src", "dst", "mechanism"),
    _m("pairs", "netbench_pair_drops_total", "counter",
       "Packets src's shaper dropped toward dst: the pair's loss and its queue limit (netem: its netem "
       "leaf's drops; engine: loss verdicts and queue overlimits).", "src", "dst", "mechanism"),
    _m("network", "netbench_network_read_errors_total", "counter",
       "Scrapes that could not read a node's namespace (it was being created or removed)."),
)

BY_NAME: dict[str, MetricDef] = {metric.name: metric for metric in CATALOGUE}


def series_names() -> set[str]:
    """Every sample name the catalogue exposes."""
    return {name for metric in CATALOGUE for name in metric.series_names}


def metric_for_series(series: str) -> MetricDef | None:
    """The catalogue entry a sample name (e.g. a histogram's _bucket) belongs to."""
    if series in BY_NAME:
        return BY_NAME[series]
    for suffix in ("_bucket", "_sum", "_count"):
        base = series.removesuffix(suffix)
        if base != series and base in BY_NAME and BY_NAME[base].type == "histogram":
            return BY_NAME[base]
    return None
