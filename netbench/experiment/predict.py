"""Predicted beside measured: a sweep's calibrations and each run's predicted step.

Before a sweep's first point (links as the testbed starts: unshaped), two calibrations,
each timed and recorded in the manifest's "calibration":

* collective: the all-reduce at a few sizes (CALIBRATION_SIZES) with TensorFlow's collective
  ops over the workers' nodes (experiment/collective.py), fitted to alpha + beta x bytes:
  the framework's overhead per collective and the unshaped per-byte cost;
* exchange (when a run uses netbench's exchange protocol: ps-sync, ps-async, ps-ssp, easgd,
  gosgd, adpsgd): request-reply transfers of a few sizes in the protocol's frames between two
  worker nodes, fitted to alpha + beta x bytes moved, and the nodes' TCP buffer limits (the
  window; experiment/exchange_calibration.py);
* compute: for each job (model, batch, input) and worker count, that many single-strategy
  processes at once on the worker nodes (the CPU shared as in the run, no network), a
  batch's mean time and the model's bytes.

Each run's `predicted_step_s` then comes from model/step_model.py with the point's
configured delay and rate: never from the point's own steps.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

from netbench.errors import NetbenchError
from netbench.jobs import events as ev
from netbench.jobs.launch import Timeouts, run_job
from netbench.model import exchange_model, step_model
from netbench.model.frameworks import allreduce_buckets
from netbench.model.job import JobSpec, pipeline_window, plan_job

CALIBRATION_SIZES = (64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20)
COMPUTE_WARMUP, COMPUTE_STEPS = 3, 10


def job_key(job: JobSpec, workers: int) -> str:
    shape = "x".join(str(d) for d in job.input_shape) if job.input_shape else ""
    per = f"r{job.ranks_per_node}" if job.ranks_per_node > 1 else ""
    return f"{job.model}/b{job.batch_size}/{shape}/{job.classes or ''}/{job.data}/w{workers}{per}"


def collective_key(workers: int, ranks_per_node: int = 1) -> int | str:
    """The collective calibration's key: the workers, or "WxR" with R ranks per node (measured
    on that placement: the loopback inside each node, the unshaped links between them)."""
    return workers if ranks_per_node <= 1 else f"{workers}x{ranks_per_node}"


@dataclass(frozen=True)
class Compute:
    compute_s: float  # one batch, mean over the processes' measured steps
    model_bytes: int


@dataclass(frozen=True)
class Predictor:
    """The calibrations a sweep measured; predicts any run of it."""

    collective: dict[int, Any] = field(default_factory=dict)  # workers -> model.collective.AlphaBeta
    compute: dict[str, Compute] = field(default_factory=dict)  # job_key -> Compute
    exchange: Any = None  # experiment.exchange_calibration.Exchange; None: not measured

    def inputs(self, run) -> step_model.StepInputs | None:
        from netbench.experiment.estimate import path_of

        job, workers = run.job, run.workers
        fit = self.collective.get(collective_key(workers, job.ranks_per_node))
        measured = self.compute.get(job_key(job, workers))
        alone = job.strategy == "single" or (job.strategy.startswith("allreduce") and workers < 2)  # no network
        if measured is None or (fit is None and not alone):
            return None
        profile = path_of(run)
        return step_model.StepInputs(
            strategy=job.strategy, workers=workers, model_bytes=measured.model_bytes, compute_s=measured.compute_s,
            delay_s=profile.delay_us / 1e6, rate_bps=profile.rate_bps,
            overhead_s=fit.alpha_s if fit else 0.0, beta_s_per_byte=fit.beta_s_per_byte if fit else 0.0,
            accum_steps=job.accum_steps, ps=job.ps,
            params={"period": job.tau, "p": job.gossip_p, "window": pipeline_window(job)},
            ring_rtts_s=ring_rtts_s(run, workers) if job.ranks_per_node == 1 else (),
            ranks_per_node=job.ranks_per_node, collective=job.collective,
            buckets=allreduce_buckets(job.framework, measured.model_bytes), **self._exchange_terms())

    def _exchange_terms(self) -> dict[str, Any]:
        x = self.exchange
        if x is None:
            return {}
        return {"exchange_alpha_s": x.alpha_s, "exchange_beta_s_per_byte": x.beta_s_per_byte,
                "window_bytes": x.window_bytes}

    def predict(self, run) -> step_model.Prediction | None:
        x = self.inputs(run)
        return None if x is None else step_model.predict(x)


def ring_rtts_s(run, workers: int) -> tuple[float, ...]:
    """On a per-pair topology, the round trip of each hop of the workers' ring (worker i on
    node n(i+1) to worker i + 1, TF's ring in task order): the two one-way delays (jitter
    ignored, as everywhere in the model), an unshaped direction counting 0; () without a topology."""
    pairs = getattr(run, "pairs", None)
    if pairs is None or not pairs.links or workers < 2:
        return ()
    from netbench.model.topology import node_name

    def one_way(src: str, dst: str) -> float:
        profile = pairs.link(src, dst)
        return 0.0 if profile is None else profile.delay_us / 1e6

    hops = []
    for i in range(workers):
        a, b = node_name(i), node_name((i + 1) % workers)
        hops.append(one_way(a, b) + one_way(b, a))
    return tuple(hops)


def _compute_tasks(job: JobSpec, nodes, workers: int, port: int):
    """`workers` single-strategy processes, one per worker node (worker 0..W-1)."""
    # fixed steps: a sweep's --precision would stretch this short, noisy window to its cap
    single = replace(job, strategy="single", warmup=COMPUTE_WARMUP, steps=COMPUTE_STEPS, seconds=None,
                     sample_resources_s=0.0, precision=None, ranks_per_node=1, collective="ring")
    (task,) = plan_job(single, nodes[:1], 1, port=port)
    per = max(1, job.ranks_per_node)  # R processes a node, node-major, as the run places its ranks
    placed = [nodes[i // per] for i in range(workers) if i // per < len(nodes)]
    return [replace(task, index=i, node=node.name, netns=node.netns, address=node.address)
            for i, node in enumerate(placed)]


def measure_compute(testbed, job: JobSpec, workers: int, log_dir, port: int) -> tuple[Compute, dict]:
    nodes = testbed.nodes_for(job, workers)
    started = time.monotonic()
    outcome = run_job(_compute_tasks(job, nodes, workers, port), log_dir, testbed.spawn,
                      Timeouts(startup_s=240.0, step_s=120.0))
    if outcome.status != "ok":
        raise NetbenchError(f"compute calibration of {job.model}: {outcome.error}", hint=f"logs in {log_dir}")
    steps = [e.duration for e in outcome.events if isinstance(e, ev.Step) and e.phase == ev.PHASE_MEASURED]
    model_bytes = next((e.model_bytes for e in outcome.events if isinstance(e, ev.Start)), 0)
    if not steps:
        raise NetbenchError(f"compute calibration of {job.model}: no measured steps", hint=f"logs in {log_dir}")
    compute = Compute(compute_s=sum(steps) / len(steps), model_bytes=int(model_bytes))
    return compute, {"compute_s": compute.compute_s, "model_bytes": compute.model_bytes, "steps": len(steps),
                     "processes": workers, "seconds": round(time.monotonic() - started, 3)}


def measure_collective(testbed, workers: int, log_dir, port: int, ranks_per_node: int = 1) -> tuple[Any, dict]:
    from netbench.experiment import collective
    from netbench.model.profile import Profile
    from netbench.model.run import Run

    run = Run(index=0, profile=Profile(name="calibration"), repeat=0,
              job=replace(collective.JOB, ranks_per_node=ranks_per_node), workers=workers)
    settings = collective.Settings(sizes=CALIBRATION_SIZES, ops=("allreduce",), warmup=2, reps=3)
    point = collective.measure(testbed, run, settings, "tf", log_dir, port)
    return point.fit, {"alpha_s": point.fit.alpha_s, "beta_s_per_byte": point.fit.beta_s_per_byte,
                       "sizes": [s.to_json() for s in point.results["allreduce"]], "seconds": round(point.seconds, 3)}


def _why(exc: Exception) -> str:
    return exc.message if isinstance(exc, NetbenchError) else f"{type(exc).__name__}: {exc}"


def calibrate(runs, testbed, log_root, note, seed: int = 0) -> tuple[Predictor, dict]:
    """Measure what the runs' predictions need; a calibration that fails is noted and its
    runs get no prediction (the sweep goes on)."""
    rng = random.Random(seed ^ int(time.time()))
    started = time.monotonic()
    record: dict[str, Any] = {"collective": {}, "compute": {}, "errors": []}
    collective_fits: dict[int, Any] = {}
    computes: dict[str, Compute] = {}
    modelled = [r for r in runs if r.job.strategy in step_model.PATTERNS]
    for workers, per in sorted({(r.workers, r.job.ranks_per_node) for r in modelled if r.workers >= 2}):
        key = collective_key(workers, per)
        try:
            fit, facts = measure_collective(testbed, workers, log_root / f"calibration-collective-w{key}",
                                            rng.randrange(20000, 30000), ranks_per_node=per)
        except Exception as exc:  # noqa: BLE001 - a calibration only informs: the sweep goes on without it
            record["errors"].append(_why(exc))
            note(f"collective calibration ({workers} workers) failed: {_why(exc)}; no predictions for them")
            continue
        collective_fits[key] = fit
        record["collective"][str(key)] = facts
        on = f" ({per} a node)" if per > 1 else ""
        note(f"calibration: all-reduce over {workers} workers{on}, unshaped: alpha {fit.alpha_s * 1e3:.2f} ms, "
             f"beta {fit.beta_s_per_byte * 1e9:.2f} ns/byte ({facts['seconds']:.1f} s)")
    exchange = None
    if any(r.job.strategy in exchange_model.STRATEGIES and r.workers >= 2 for r in modelled):
        exchange = _calibrate_exchange(testbed, log_root, rng.randrange(20000, 30000), record, note)
    seen: dict[str, tuple[JobSpec, int]] = {}
    for run in modelled:
        seen.setdefault(job_key(run.job, run.workers), (run.job, run.workers))
    for key, (job, workers) in seen.items():
        try:
            compute, facts = measure_compute(testbed, job, workers,
                                             log_root / f"calibration-compute-{len(computes)}", rng.randrange(20000, 30000))
        except Exception as exc:  # noqa: BLE001 - as above
            record["errors"].append(_why(exc))
            note(f"compute calibration of {key} failed: {_why(exc)}; no predictions for it")
            continue
        computes[key] = compute
        record["compute"][key] = facts
        note(f"calibration: {job.model} compute {compute.compute_s * 1e3:.1f} ms per batch on {workers} node(s) "
             f"at once, {compute.model_bytes:,} bytes of weights ({facts['seconds']:.1f} s)")
    record["seconds"] = round(time.monotonic() - started, 3)
    return Predictor(collective=collective_fits, compute=computes, exchange=exchange), record


def _calibrate_exchange(testbed, log_root, port: int, record: dict, note):
    """The exchange calibration, recorded in `record`; None (noted) when it fails: the
    exchange strategies then fall back to the all-reduce's terms."""
    from netbench.experiment import exchange_calibration

    try:
        exchange, facts = exchange_calibration.measure(testbed, log_root / "calibration-exchange", port)
    except Exception as exc:  # noqa: BLE001 - a calibration only informs: the sweep goes on without it
        record["errors"].append(_why(exc))
        note(f"exchange calibration failed: {_why(exc)}; the exchange strategies use the all-reduce's terms")
        return None
    record["exchange"] = facts
    window = "unknown" if exchange.window_bytes is None else f"{exchange.window_bytes / 2**20:.1f} MiB"
    note(f"calibration: exchange protocol request-reply, unshaped: alpha {exchange.alpha_s * 1e3:.2f} ms, "
         f"beta {exchange.beta_s_per_byte * 1e9:.2f} ns/byte moved, TCP window {window} ({facts['seconds']:.1f} s)")
    return exchange


def annotate(result, run, predictor: Predictor | None):
    """The run's record with its predicted step (None where the model does not apply)."""
    if predictor is None:
        return result
    prediction = predictor.predict(run)
    return result if prediction is None else replace(result, predicted_step_s=prediction.step_s)
