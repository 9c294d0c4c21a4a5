"""The wall time of a design before it runs: per launch and in total (pure but for
`Costs.from_results`, which reads a results folder).

A launch costs a start-up once (processes start: TensorFlow import, strategy and cluster,
tracing; then the warm-up steps), then per point: the in-place change, a settle window and
the measured window. Under --isolate every point is a launch of its own. Each figure comes
from a transparent step-time model:

    start-up = startup(model) x max(1, processes / cores)
               + (more than one process) cluster set-up + cluster_round_trips x RTT
               + warm-up steps x step
    step = compute + communication
    compute = step_overhead(model) + s_per_sample(model) x batch x accum_steps x contention
              contention = max(1, computing processes / cores): they share the machine
    communication (per optimizer update, none with one process):
        allreduce / allreduce-accum (ring, model/step_model.py's allreduce_s):
                                            2 (W-1)/W x model bytes x 8 / rate x frame overhead
                                            + 2 (W-1) round trips x RTT + sync_overhead
        ps (per step, on the worker that runs it): 2 x model bytes x 8 / rate (read the
            variables, push the update) + ps_round_trips x RTT (dispatch, reads, update:
            11 fitted here from ps steps at 1 and 10 ms one-way, mlp and mobilenetv2);
            the coordinator completes a step every max(step / W, model bytes x 8 / rate),
            the parameter server's link being shared
    RTT = 2 x one-way delay (+ 2 x jitter, netem's delay is at every node's egress);
    rate = the profile's, or `unshaped_bps` when it sets none.
    loss: not modelled by default. Measured here (ps, 1 worker, 1 Gbit/s), 1 % loss made the
          median step 5 % longer at 1 ms one-way and 10 % (mobilenetv2) to 280 % (mlp) longer
          at 10 ms, with a long tail (retransmission timeouts): no simple law fits. With
          `loss_penalty` on, TCP's steady-state throughput under random loss p (Mathis et
          al. 1997: MSS / RTT x sqrt(3/2) / sqrt(p)) caps the rate: an upper bound, several
          times the step measured at 10 ms and 1 %.

A point whose modelled step exceeds the step timeout is counted as a timeout (the timeout's
seconds, nothing measured; in a shared launch the points after it pay a new start-up).

With a precision (--precision P) a point's window is its least window (--steps/--seconds, else
stats.least_steps) at least, then goes on until its 95 % batch-means interval is within P, for at
most max_seconds: stats.steps_for_precision(step_cv, P) steps, where step_cv is the step time's coefficient of
variation widened for correlated steps (an assumption: 0.10 by default, between the 0.05 and
0.15-0.19 measured here at 1 ms with 1 Gbit/s and 100 Mbit/s; calibrated per model from a
results folder's step_time_ci_pct). A point whose modelled window reaches the cap is counted as
capped: it is expected to stop there without its precision; so is every point with loss
(experiment/lossy.py: retransmission timeouts make its steps vary).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from netbench import stats
from netbench.experiment import lossy
from netbench.experiment.launch import Settle, plan_launches
from netbench.model.job import EXCHANGE_STRATEGIES, effective_accum_steps, nodes_needed
from netbench.model.run import path_of

# Model weights (float32) at the job's default input shape and 10 classes, from
# build_model(keras, name, DEFAULT_INPUT_SHAPES[name], 10): model.count_params() and the
# weights' nbytes, TensorFlow 2.21 / Keras 3 in the project's venv. Other shapes change the
# head only; results.csv's model_bytes column takes precedence in Costs.from_results.
MODEL_BYTES: Mapping[str, int] = {
    "mlp": 2_678_824, "cnn": 2_217_384, "resnet18": 44_734_248, "mobilenetv2": 9_083_176,
    "resnet50": 94_432_808, "efficientnetb0": 16_249_528, "vgg16": 134_552_872,
}

DEFAULT_SOURCE = ("defaults measured on the development machine (2 cores, TensorFlow 2.21 on CPU, "
                  "userspace backend)")


@dataclass(frozen=True)
class Costs:
    """What one machine charges: compute per sample and per step, start-up per launch.

    Defaults (this project's development machine, 2 cores, TF 2.21 CPU): compute from one
    `single` process per model at batch 8 and 64 (the slope per sample, the intercept per
    step); start-up from the wall time of those processes and of 2-worker allreduce and ps
    launches (bench/design_time.py checks the whole model on scaled-down designs)."""

    s_per_sample: Mapping[str, float] = field(default_factory=lambda: {
        "mlp": 16e-6, "cnn": 60e-6, "resnet18": 1.5e-3, "mobilenetv2": 0.84e-3, "resnet50": 6.0e-3,
        "efficientnetb0": 1.2e-3, "vgg16": 4.0e-3})
    step_overhead_s: Mapping[str, float] = field(default_factory=lambda: {
        "mlp": 0.001, "mobilenetv2": 0.03, "resnet50": 0.035, "efficientnetb0": 0.04})
    startup_s: Mapping[str, float] = field(default_factory=lambda: {
        "mlp": 3.0, "cnn": 4.0, "resnet18": 7.0, "mobilenetv2": 7.0, "resnet50": 10.0,
        "efficientnetb0": 9.0, "vgg16": 8.0})
    default_startup_s: float = 10.0
    default_s_per_sample: float = 1e-3
    cluster_startup_s: float = 1.0  # strategy and cluster set-up beyond one process's start
    cluster_round_trips: float = 40  # round trips of that set-up and the first steps' (x RTT)
    ps_round_trips: float = 11  # per ps step, on the worker that runs it
    sync_overhead_s: float = 0.01  # per all-reduce: gRPC collective and the delay engines
    point_overhead_s: float = 0.3  # per point: in-place change, draining the other tasks
    stop_s: float = 1.0  # per launch: ending the processes (and calibration steps under --isolate)
    unshaped_bps: float = 4e9  # what a link with no rate set carries
    cores: int = 2
    mss_bytes: int = 1448
    loss_penalty: bool = False
    # the step time's coefficient of variation, widened for correlated steps (sd of the mean of
    # n steps = step_cv / sqrt(n) of it): what a precision's window length is modelled by.
    # Implied by the intervals measured here (2 workers, mlp, 1 ms one-way, estimate.row_cv):
    # 0.05 at 1 Gbit/s (2 s window), 0.15-0.19 at 100 Mbit/s (60 s windows; docs/validation.md).
    # Slow drifts make it grow with the window (0.34 at 1 Gbit/s over 45 s): for long windows the
    # modelled length is a lower bound
    step_cv: float = 0.10
    step_cv_by_model: Mapping[str, float] = field(default_factory=dict)  # calibrated per model
    model_bytes: Mapping[str, int] = field(default_factory=lambda: dict(MODEL_BYTES))
    source: str = DEFAULT_SOURCE

    def compute_s(self, model: str) -> float:
        return self.s_per_sample.get(model, self.default_s_per_sample)

    def startup(self, model: str) -> float:
        return self.startup_s.get(model, self.default_startup_s)

    def cv(self, model: str) -> float:
        return self.step_cv_by_model.get(model, self.step_cv)

    @classmethod
    def from_results(cls, folder: Path | str, base: "Costs | None" = None) -> "Costs":
        """These costs calibrated from an earlier results folder: compute per sample per model
        (each ok row's median step time inverted through the step model), start-up per model
        (runs that started processes: their wall time less warm-up and measured steps) and the
        per-point overhead of shared launches. Models the folder lacks keep `base`'s figures."""
        return calibrate(Path(folder), base or cls())


@dataclass(frozen=True)
class LaunchEstimate:
    """One launch: its points, what starting it costs and what its points cost."""

    runs: tuple[str, ...]
    processes: int  # processes started (once per launch)
    startup_s: float  # start-up and warm-up
    settle_s: float
    measured_s: float
    other_s: float  # in-place changes, draining, stopping
    timeouts: int = 0
    capped: int = 0  # points whose precision is expected to take longer than max_seconds

    @property
    def wall_s(self) -> float:
        return self.startup_s + self.settle_s + self.measured_s + self.other_s


@dataclass(frozen=True)
class Estimate:
    """A design's estimated wall time, split, with the launches it is made of."""

    isolate: bool
    launches: tuple[LaunchEstimate, ...]
    source: str

    def _sum(self, name: str) -> float:
        return sum(getattr(launch, name) for launch in self.launches)

    @property
    def startup_s(self) -> float:
        return self._sum("startup_s")

    @property
    def settle_s(self) -> float:
        return self._sum("settle_s")

    @property
    def measured_s(self) -> float:
        return self._sum("measured_s")

    @property
    def other_s(self) -> float:
        return self._sum("other_s")

    @property
    def wall_s(self) -> float:
        return self._sum("wall_s")

    @property
    def process_starts(self) -> int:
        return sum(launch.processes for launch in self.launches)

    @property
    def timeouts(self) -> int:
        return sum(launch.timeouts for launch in self.launches)

    @property
    def capped(self) -> int:
        return sum(launch.capped for launch in self.launches)

    @property
    def runs(self) -> int:
        return sum(len(launch.runs) for launch in self.launches)

    @property
    def measured_share(self) -> float:
        return self.measured_s / self.wall_s if self.wall_s > 0 else 0.0


def rtt_s(profile) -> float:
    """Round trip between two nodes: every node delays its egress."""
    return 2 * (profile.delay_us + profile.jitter_us) / 1e6


def effective_bps(profile, costs: Costs) -> float:
    """The rate a transfer gets: the profile's (or unshaped), capped under loss by Mathis' bound."""
    rate = float(profile.rate_bps) if profile.rate_bps else costs.unshaped_bps
    if costs.loss_penalty and profile.loss > 0:
        rtt = max(rtt_s(profile), 1e-4)
        rate = min(rate, costs.mss_bytes * 8 / rtt * math.sqrt(1.5 / profile.loss))
    return rate


def step_s(run, costs: Costs, s_per_sample: float | None = None) -> float:
    """The modelled seconds per step event of `run` (an optimizer update; for ps one
    coordinator completion)."""
    job, workers = run.job, run.workers
    per_sample = costs.compute_s(job.model) if s_per_sample is None else s_per_sample
    model_bytes = costs.model_bytes.get(job.model, 0)
    path = path_of(run)
    rate, rtt = effective_bps(path, costs), rtt_s(path)
    computing = workers
    contention = max(1.0, computing / costs.cores)
    accum = effective_accum_steps(job)
    compute = (costs.step_overhead_s.get(job.model, 0.0) + per_sample * job.batch_size) * accum * contention
    if job.strategy == "single" or (job.strategy != "ps" and workers < 2):
        return compute
    if job.strategy == "ps":
        per_worker = compute + 2 * model_bytes * 8 / rate + costs.ps_round_trips * rtt
        return max(per_worker / workers, model_bytes * 8 / rate)
    if job.strategy in EXCHANGE_STRATEGIES:
        return compute + exchange_s(job, workers, model_bytes * 8 / rate, rtt)
    # the ring as the step model has it (model/step_model.py: what sweeps predict each run by)
    from netbench.model import step_model

    ring = step_model.StepInputs(strategy=job.strategy, workers=workers, model_bytes=model_bytes, compute_s=compute,
                                 delay_s=rtt / 2, rate_bps=rate, overhead_s=costs.sync_overhead_s, beta_s_per_byte=0.0)
    return compute + step_model.allreduce_s(ring)


def exchange_s(job, workers: int, model_s: float, rtt: float) -> float:
    """The network's share of one worker's step under an exchange strategy: a request with a
    model each way costs two models' serialisation and about two round trips (measured: ps-sync's
    2.7 MB push and reply took 2 RTTs at 50 ms one-way, TCP's window growing within each); the
    parameter servers' links carry every worker's models; easgd pays it every tau steps, gosgd
    sends one model with probability p and waits for nothing."""
    exchange = 2 * model_s + 2 * rtt
    if job.strategy in ("ps-sync", "ps-async", "ps-ssp"):
        return max(exchange, 2 * workers * model_s / max(1, job.ps))
    if job.strategy == "easgd":
        return exchange / job.tau
    if job.strategy == "gosgd":
        return job.gossip_p * model_s
    return exchange  # adpsgd


def window_s(job, step: float, costs: Costs) -> tuple[float, bool]:
    """(seconds, capped) of a point's measured window at a modelled `step`: --steps/--seconds,
    and with a precision as long as stats.steps_for_precision at the model's step_cv, but no
    longer than max_seconds or the least window, whichever is longer (capped: the precision is
    expected to need more). An accuracy run (train_steps) trains its steps, no more."""
    least = job.seconds if job.seconds else job.steps * step
    if not job.precision or job.train_steps:
        return least, False
    wanted = stats.steps_for_precision(costs.cv(job.model), job.precision) * step
    if wanted <= least:
        return least, False
    cap = max(least, job.max_seconds)  # the least window is measured whatever the cap
    return min(wanted, cap), wanted > cap


def _point(run, costs: Costs, settle: Settle | None, step_timeout_s: float | None):
    """(settle, measured, other, timed out, capped) seconds of one point; settle None: --isolate."""
    step = step_s(run, costs)
    if step_timeout_s is not None and step > step_timeout_s:
        return 0.0, 0.0, step_timeout_s, True, False
    measured, capped = window_s(run.job, step, costs)
    if lossy.expected_at_cap(run):  # retransmission timeouts: the cap, whatever the modelled cv
        measured, capped = max(measured, run.job.max_seconds), True
    held = 0.0
    if settle is not None:  # the step in flight at the change, then the window
        held = max(settle.floor_s(rtt_s(path_of(run))), settle.steps * step) + step / 2
    return held, measured, costs.point_overhead_s, False, capped


def _launch(runs, isolate: bool, settle: Settle, costs: Costs, step_timeout_s) -> list[LaunchEstimate]:
    """One planned launch's estimate; a timeout ends it and the points left start another.

    The launch's order is drawn when it starts, so its first point (which settles during
    the start-up and sets the RTT of the cluster set-up and the warm-up's step) is any of
    them: start-up takes their mean, and settling (n - 1) / n of their sum."""
    out: list[LaunchEstimate] = []
    left = list(runs)
    while left:
        job, workers = left[0].job, left[0].workers
        processes = nodes_needed(job, workers) * job.ranks_per_node  # processes: ranks per node on each
        totals = [0.0, 0.0, costs.stop_s]
        done, timeouts, capped = [], 0, 0
        for run in left:
            held, measured, other, timed_out, at_cap = _point(run, costs, None if isolate else settle, step_timeout_s)
            totals[0] += held
            totals[1] += measured
            totals[2] += other
            capped += at_cap
            done.append(run)
            if timed_out:
                timeouts += 1
                break
        totals[0] *= (len(done) - 1) / len(done)
        startup = costs.startup(job.model) * max(1.0, processes / costs.cores)
        if processes > 1:
            startup += costs.cluster_startup_s
        startup += statistics.mean(
            (costs.cluster_round_trips * rtt_s(r.profile) if processes > 1 else 0.0)
            + job.warmup * min(step_s(r, costs), step_timeout_s or math.inf) for r in done)
        out.append(LaunchEstimate(tuple(r.run_id for r in done), processes, startup, *totals, timeouts=timeouts,
                                  capped=capped))
        left = left[len(done):]
    return out


def estimate_design(runs, isolate: bool, settle: Settle, costs: Costs,
                    step_timeout_s: float | None = None, order: str = "descending") -> Estimate:
    """The design's estimated wall time: under --isolate a launch per run, else the launches
    of launch.plan_launches in `order` (the order within a launch does not change the sum)."""
    groups = [(run,) for run in runs] if isolate else [plan.runs for plan in plan_launches(tuple(runs), 0, order)]
    launches: list[LaunchEstimate] = []
    for group in groups:
        launches += _launch(group, isolate, settle, costs, step_timeout_s)
    return Estimate(isolate=isolate, launches=tuple(launches), source=costs.source)


def assumptions(costs: Costs, precision: bool = False) -> str:
    """One line: what the estimate takes for granted (`precision`: what a precision's window
    length is modelled by, too)."""
    loss = "loss caps TCP's rate (Mathis)" if costs.loss_penalty else "loss not modelled"
    window = ""
    if precision:
        calibrated = "".join(f", {m} {cv:.2f}" for m, cv in sorted(costs.step_cv_by_model.items()))
        window = (f"a precision's window lasts until a 95 % interval that narrows as the step time's assumed "
                  f"coefficient of variation {costs.step_cv:.2f}{calibrated} (correlated steps included) over "
                  f"sqrt(steps), at most max_seconds; ")
    return (f"step = compute (per sample per model, {costs.cores} cores shared) + ring/ps transfers at the "
            f"profile's rate (a topology's: its slowest pair's) + round trips x RTT; {loss}; start-up per launch per model + warm-up; "
            f"{window}every point ok but those whose step exceeds the step timeout; costs: {costs.source}")


# ---------------------------------------------------------------- calibration from results


def _row_run(row: dict):
    """A Run standing for one results.csv row (its profile, job and workers)."""
    from netbench.model.job import JobSpec
    from netbench.model.profile import Profile
    from netbench.model.run import Run

    def number(key: str, default: float = 0.0) -> float:
        return float(row[key]) if row.get(key) not in (None, "") else default

    profile = Profile(delay_us=round(number("delay_ms") * 1000), jitter_us=round(number("jitter_ms") * 1000),
                      loss=number("loss_pct") / 100,
                      rate_bps=round(number("rate_mbit") * 1e6) if row.get("rate_mbit") else None)
    job = JobSpec(strategy=row["strategy"], model=row["model"], batch_size=int(number("batch_size", 64)),
                  warmup=int(number("warmup_steps")), steps=max(2, int(number("steps", 2))),
                  accum_steps=int(number("accum_steps", 1)) or 1, ps=int(number("ps", 1)) or 1)
    return Run(index=0, profile=profile, repeat=int(number("repeat")), job=job, workers=int(number("workers", 1)))


def _solve_per_sample(run, costs: Costs, measured_step: float) -> float:
    """The compute per sample that makes the modelled step `measured_step` (bisection; 0 when
    the modelled communication alone is longer)."""
    low, high = 0.0, 1.0
    if step_s(run, costs, 0.0) >= measured_step:
        return 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if step_s(run, costs, mid) < measured_step else (low, mid)
    return (low + high) / 2


def measured_window_s(record: dict) -> float:
    """Seconds from the chief's first measured step's start to its last one's end (0 if none)."""
    role = "coordinator" if record.get("strategy") == "ps" else "worker"
    steps = [e for e in record.get("events", ()) if e.get("event") == "step" and e.get("phase") == "measured"
             and e.get("role", "worker") == role and e.get("worker", 0) == 0]
    return max(e["end"] for e in steps) - min(e["start"] for e in steps) if steps else 0.0


def row_cv(row: dict) -> float | None:
    """The step_cv (Costs) a results.csv row implies: its interval's half-width (step_time_ci_pct)
    times sqrt(steps) over t at its batch count; None without an interval."""
    text, steps = row.get("step_time_ci_pct"), row.get("steps")
    if not text or not steps or int(steps) < 2 * stats.MIN_BATCHES:
        return None
    n = int(steps)
    return float(text) / 100 * math.sqrt(n) / stats.t_critical(stats.PRECISION_CONFIDENCE, stats.batch_count(n) - 1)


def _read_rows(path: Path) -> list[dict]:
    """results.csv's ok rows with a step time; a file that is not such a CSV is one error naming it."""
    from netbench.errors import UsageError

    hint = "give a results folder of an earlier sweep"
    if not path.is_file():
        raise UsageError(f"{path}: no results.csv to calibrate from", hint=hint)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = [r for r in reader if r.get("status") == "ok" and r.get("step_time_median_s")]
        for row in rows:  # every value calibrate reads, checked before any is used
            if not math.isfinite(float(row["step_time_median_s"])) or row_cv(row) == math.inf:
                raise ValueError(f"run {row.get('run_id')}: a step time or interval that is not finite")
            _row_run(row)
    except csv.Error as exc:  # a field over csv's 128 KiB limit, a NUL byte
        raise UsageError(f"{path}: line {reader.reader.line_num}: not a results CSV: {exc}", hint=hint) from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not a results CSV: {type(exc).__name__}: {str(exc)[:200]}", hint=hint) from None
    return rows


def calibrate(folder: Path, base: Costs) -> Costs:
    """Costs.from_results (see there)."""
    rows = _read_rows(folder / "results.csv")
    sizes = dict(base.model_bytes)
    sizes.update({r["model"]: int(r["model_bytes"]) for r in rows if r.get("model_bytes")})
    costs = replace(base, model_bytes=sizes)
    per_sample: dict[str, list[float]] = {}
    steps: dict[str, float] = {}
    for row in rows:
        run = _row_run(row)
        per_sample.setdefault(run.job.model, []).append(
            _solve_per_sample(run, costs, float(row["step_time_median_s"])) / effective_accum_steps(run.job))
        steps[row["run_id"]] = float(row["step_time_median_s"])
    cvs: dict[str, list[float]] = {}
    for row in rows:
        cv = row_cv(row)
        if cv is not None:
            cvs.setdefault(row["model"], []).append(cv)
    startups, points = _startups(folder, {r["run_id"]: r for r in rows}, steps, costs)
    models = sorted(set(per_sample) | set(startups))
    costs = replace(
        costs,
        s_per_sample={**costs.s_per_sample, **{m: statistics.median(v) for m, v in per_sample.items()}},
        startup_s={**costs.startup_s, **{m: statistics.median(v) for m, v in startups.items()}},
        point_overhead_s=statistics.median(points) if points else costs.point_overhead_s,
        step_cv_by_model={**costs.step_cv_by_model, **{m: statistics.median(v) for m, v in cvs.items()}},
        source=f"calibrated from {folder} ({len(rows)} ok runs: {', '.join(models) or 'no model'}; "
               f"the rest {base.source})")
    return costs


def _startups(folder: Path, rows: dict, steps: dict, costs: Costs) -> tuple[dict[str, list[float]], list[float]]:
    """Start-up seconds per model (runs that started their processes) and the per-point
    overhead of shared launches (the others), from runs/*.json."""
    records = []
    for path in sorted((folder / "runs").glob("*.json")):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    first: dict[int, str] = {}
    for record in sorted(records, key=lambda r: r.get("started", 0)):
        if record.get("launch") is not None:
            first.setdefault(record["launch"], record["run_id"])
    startups: dict[str, list[float]] = {}
    points: list[float] = []
    for record in records:
        run_id = record.get("run_id")
        if run_id not in rows or not record.get("ended") or not record.get("started"):
            continue
        wall = record["ended"] - record["started"]
        window = measured_window_s(record)
        if record.get("launch") is None or first.get(record["launch"]) == run_id:
            run = _row_run(rows[run_id])
            processes = nodes_needed(run.job, run.workers) * run.job.ranks_per_node
            cluster = costs.cluster_startup_s + costs.cluster_round_trips * rtt_s(path_of(run)) if processes > 1 else 0.0
            stop = costs.stop_s if record.get("launch") is None else 0.0
            seen = wall - window - run.job.warmup * steps[run_id] - costs.point_overhead_s - stop - cluster
            startups.setdefault(run.job.model, []).append(max(0.0, seen) / max(1.0, processes / costs.cores))
        else:
            points.append(max(0.0, wall - window - (record.get("settle_s") or 0.0)))
    return startups, points
