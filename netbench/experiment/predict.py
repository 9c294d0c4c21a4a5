"""Predicted beside measured: a sweep's calibrations and each run's predicted step.

Before a sweep's first point (links as the testbed starts: unshaped), two calibrations,
each timed and recorded in the manifest's "calibration":

* collective: the all-reduce at a few sizes (CALIBRATION_SIZES) with the job's own collectives
  (TensorFlow's collective ops; gloo's through torch.distributed for a torch job) over the
  workers' nodes (experiment/collective.py), fitted to alpha + beta x bytes: the framework's
  overhead per collective and the unshaped per-byte cost;
* exchange (when a run uses netbench's exchange protocol: ps-sync, ps-async, ps-ssp, easgd,
  gosgd, adpsgd): request-reply transfers of a few sizes in the protocol's frames between two
  worker nodes, fitted to alpha + beta x bytes moved, and the nodes' TCP buffer limits (the
  window; experiment/exchange_calibration.py);
* compute: for each job (model, batch, input) and worker count, that many single-strategy
  processes at once on the worker nodes (the CPU shared as in the run, no network), a
  batch's mean time and the model's bytes;
* base step (the exchange strategies): the job itself on the unshaped links, its chief's mean
  step, which a point's prediction adds the point's own terms to
  (experiment/base_calibration.py says why).

Each run's `predicted_step_s` then comes from model/step_model.py with the point's
configured delay and rate: never from the point's own steps.

Each calibration is keyed by everything it measured (experiment/calibration_cache.py) and
named by that key's id: a later sweep with the same key reuses the cached one (and says so)
unless it is too old, of another kernel, or the sweep asked `--recalibrate`; each run records
the ids its prediction used (`calibration_id`).
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
from netbench.model.run import path_of

CALIBRATION_SIZES = (64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20)
COMPUTE_WARMUP, COMPUTE_STEPS = 3, 10


def job_key(job: JobSpec, workers: int) -> str:
    shape = "x".join(str(d) for d in job.input_shape) if job.input_shape else ""
    framework = "" if job.framework == "tensorflow" else f"{job.framework}/"  # TensorFlow's keys as before
    per = f"r{job.ranks_per_node}" if job.ranks_per_node > 1 else ""  # one rank a node: keys as before
    return f"{framework}{job.model}/b{job.batch_size}/{shape}/{job.classes or ''}/{job.data}/w{workers}{per}"


def collective_key(workers: int, ranks_per_node: int = 1, framework: str = "tensorflow") -> int | str:
    """The collective calibration's key: the workers, or "WxR" with R ranks per node (measured
    on that placement: the loopback inside each node, the unshaped links between them); a torch
    job's, "torch/..." (its all-reduce is gloo's, measured with gloo)."""
    key = workers if ranks_per_node <= 1 else f"{workers}x{ranks_per_node}"
    return key if framework == "tensorflow" else f"{framework}/{key}"


# the collective benchmark's transport (experiment/collective.py) for a job's framework: the
# all-reduce its workers run (torch's DDP on CPU: gloo)
CALIBRATION_TRANSPORT = {"tensorflow": "tf", "torch": "gloo"}


def compute_measured(job: JobSpec, workers: int) -> dict[str, Any]:
    """What a job's compute calibration measures (its cache key's `measured`)."""
    per = max(1, job.ranks_per_node)
    return {"framework": job.framework, "model": job.model, "batch": job.batch_size,
            "input_shape": list(job.input_shape or ()), "classes": job.classes, "data": job.data,
            "device": job.device, "gpus_per_node": job.gpus_per_node,
            "strategy": "single", "processes": workers, "nodes": max(1, workers // per),
            "warmup": COMPUTE_WARMUP, "steps": COMPUTE_STEPS}


def allreduce_measured(workers: int, ranks_per_node: int = 1, framework: str = "tensorflow") -> dict[str, Any]:
    """What the all-reduce calibration over `workers` (ranks_per_node a node) measures, with the
    collectives of `framework`."""
    return {"framework": framework, "op": "allreduce", "ranks": workers,
            "nodes": max(1, workers // max(1, ranks_per_node)),
            "sizes": list(CALIBRATION_SIZES), "warmup": 2, "reps": 3}


@dataclass(frozen=True)
class Reuse:
    """Where a sweep's calibrations may come from: the cache (None: measure every one), the
    place and host that key them (calibration_cache), and `recalibrate` (measure anyway)."""

    place: dict[str, Any] = field(default_factory=dict)  # testbed kind, backend, congestion control
    host: Any = None  # calibration_cache.Host; None: calibrations get no id
    cache: Any = None  # calibration_cache.CalibrationCache
    recalibrate: bool = False


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
    ids: dict[str, str] = field(default_factory=dict)  # "allreduce/w2", "compute/<job_key>", "exchange", "base/<key>" -> id
    base: dict[str, float] = field(default_factory=dict)  # base_calibration.key -> the job's unshaped step (s)

    def calibration_id(self, run) -> str | None:
        """The ids of the calibrations `run`'s prediction uses, "+"-joined (compute, all-reduce,
        exchange); None when it uses none."""
        parts = [self.ids.get(f"compute/{job_key(run.job, run.workers)}"),
                 self.ids.get(f"allreduce/w{collective_key(run.workers, run.job.ranks_per_node, run.job.framework)}")]
        if run.job.strategy in exchange_model.STRATEGIES:
            parts.append(self.ids.get("exchange"))
            parts.append(self.ids.get(f"base/{_base_key(run.job, run.workers)}"))
        return "+".join(p for p in parts if p) or None

    def inputs(self, run) -> step_model.StepInputs | None:
        job, workers = run.job, run.workers
        fit = self.collective.get(collective_key(workers, job.ranks_per_node, job.framework))
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
            ranks_per_node=job.ranks_per_node, collective=job.collective, backup_workers=job.backup_workers,
            buckets=allreduce_buckets(job.framework, measured.model_bytes), framework=job.framework,
            **self._exchange_terms(),
            **_node_terms(run, workers), base_step_s=self.base.get(_base_key(job, workers)))

    def _exchange_terms(self) -> dict[str, Any]:
        x = self.exchange
        if x is None:
            return {}
        return {"exchange_alpha_s": x.alpha_s, "exchange_beta_s_per_byte": x.beta_s_per_byte,
                "window_bytes": x.window_bytes}

    def omitted(self, run) -> tuple[str, ...]:
        """What the model leaves out at `run`'s point (step_model.omitted); () without inputs."""
        x = self.inputs(run)
        if x is None:
            return ()
        profile = path_of(run)
        return step_model.omitted(x, profile.loss, profile.jitter_us / 1e6)

    def predict(self, run, buckets: int | None = None) -> step_model.Prediction | None:
        """`buckets`: the all-reduces per step the run's framework reported (torch's DDP), in
        place of the model's estimate from the model's size."""
        x = self.inputs(run)
        if x is not None and buckets:
            x = replace(x, buckets=buckets)
        return None if x is None else step_model.predict(x)


def _base_key(job: JobSpec, workers: int) -> str:
    from netbench.experiment import base_calibration

    return base_calibration.key(job, workers, job_key(job, workers))


def _node_terms(run, workers: int) -> dict[str, Any]:
    """Unequal nodes: each worker's slowdown under its CPU limit and its step delay (the
    calibration measured an unlimited node with no delay; model/compute.py)."""
    from netbench.model.compute import NONE, worker_terms

    slow, delay = worker_terms(getattr(run, "compute", NONE), workers, ranks_per_node=run.job.ranks_per_node)
    return {"node_slowdown": slow, "node_delay_s": delay} if slow else {}


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
    from netbench.model.ranks import rank_nodes

    (task,) = plan_job(single, nodes[:1], 1, port=port)
    placed = rank_nodes(nodes, workers, job.ranks_per_node)  # R processes a node, as the run places its ranks
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


def measure_collective(testbed, workers: int, log_dir, port: int, ranks_per_node: int = 1,
                       framework: str = "tensorflow") -> tuple[Any, dict]:
    from netbench.experiment import collective
    from netbench.model.profile import Profile
    from netbench.model.run import Run

    run = Run(index=0, profile=Profile(name="calibration"), repeat=0,
              job=replace(collective.JOB, ranks_per_node=ranks_per_node), workers=workers)
    settings = collective.Settings(sizes=CALIBRATION_SIZES, ops=("allreduce",), warmup=2, reps=3)
    point = collective.measure(testbed, run, settings, CALIBRATION_TRANSPORT[framework], log_dir, port)
    return point.fit, {"alpha_s": point.fit.alpha_s, "beta_s_per_byte": point.fit.beta_s_per_byte,
                       "sizes": [s.to_json() for s in point.results["allreduce"]], "seconds": round(point.seconds, 3)}


def _why(exc: Exception) -> str:
    return exc.message if isinstance(exc, NetbenchError) else f"{type(exc).__name__}: {exc}"


def _obtain(kind: str, measured: dict[str, Any], what: str, measure, reuse: Reuse, note) -> tuple[dict, dict]:
    """(value, facts) of one calibration: the cached one when its key's entry may be reused
    (noted), else `measure()`'s (value, facts), kept in the cache. The facts carry its `id`,
    whether it was `reused` and when it was measured (`measured_at`, Unix time)."""
    from netbench.experiment import calibration_cache as cc

    if reuse.host is None:
        value, facts = measure()
        return value, {**facts, "reused": False}
    key = cc.make_key(kind, measured, reuse.place, reuse.host)
    if reuse.cache is not None and not reuse.recalibrate:
        entry, why = reuse.cache.lookup(key)
        if entry is not None:
            age = cc.age_text(reuse.cache.clock() - entry.measured_at)
            note(f"calibration: {what}: reused {entry.id}, measured {age} ago (--recalibrate measures it again)")
            return entry.value, {**entry.facts, "id": entry.id, "reused": True, "measured_at": entry.measured_at}
        if why != "none cached":
            note(f"calibration: {what}: the cached one is not reused: {why}")
    value, facts = measure()
    if reuse.cache is None:
        return value, {**facts, "id": cc.calibration_id(key), "reused": False}
    entry, unkept = reuse.cache.store(key, value, facts)
    if unkept:
        note(f"calibration: {what}: {unkept}")
    return value, {**facts, "id": entry.id, "reused": False, "measured_at": entry.measured_at}


def calibrate(runs, testbed, log_root, note, seed: int = 0, reuse: Reuse | None = None) -> tuple[Predictor, dict]:
    """Measure (or reuse, see `Reuse`) what the runs' predictions need; a calibration that fails
    is noted and its runs get no prediction (the sweep goes on)."""
    reuse = reuse or Reuse()
    rng = random.Random(seed ^ int(time.time()))
    started = time.monotonic()
    record: dict[str, Any] = {"collective": {}, "compute": {}, "errors": [], "recalibrate": reuse.recalibrate}
    if reuse.cache is not None:
        record["cache"] = str(reuse.cache.folder)
    collective_fits: dict[int, Any] = {}
    computes: dict[str, Compute] = {}
    ids: dict[str, str] = {}
    modelled = [r for r in runs if r.job.strategy in step_model.PATTERNS]
    for workers, per, framework in sorted({(r.workers, r.job.ranks_per_node, r.job.framework)
                                           for r in modelled if r.workers >= 2}):
        key = collective_key(workers, per, framework)

        def measure(w=workers, per=per, key=key, framework=framework):
            folder = log_root / f"calibration-collective-w{str(key).replace('/', '-')}"
            fit, facts = measure_collective(testbed, w, folder, rng.randrange(20000, 30000), ranks_per_node=per,
                                            framework=framework)
            return {"alpha_s": fit.alpha_s, "beta_s_per_byte": fit.beta_s_per_byte}, facts
        on = (f" ({per} a node)" if per > 1 else "") + ("" if framework == "tensorflow" else
                                                       f" with {CALIBRATION_TRANSPORT.get(framework, framework)}")
        try:
            value, facts = _obtain("allreduce", allreduce_measured(workers, per, framework),
                                   f"all-reduce over {workers} workers{on}", measure, reuse, note)
        except Exception as exc:  # noqa: BLE001 - a calibration only informs: the sweep goes on without it
            record["errors"].append(_why(exc))
            note(f"collective calibration ({workers} workers) failed: {_why(exc)}; no predictions for them")
            continue
        from netbench.model.collective import AlphaBeta

        fit = collective_fits[key] = AlphaBeta(float(value["alpha_s"]), float(value["beta_s_per_byte"]))
        record["collective"][str(key)] = facts
        _remember(ids, f"allreduce/w{key}", facts)
        if not facts["reused"]:
            note(f"calibration: all-reduce over {workers} workers{on}, unshaped: alpha {fit.alpha_s * 1e3:.2f} ms, "
                 f"beta {fit.beta_s_per_byte * 1e9:.2f} ns/byte ({facts['seconds']:.1f} s)")
    exchange = None
    if any(r.job.strategy in exchange_model.STRATEGIES and r.workers >= 2 for r in modelled):
        exchange = _calibrate_exchange(testbed, log_root, rng.randrange(20000, 30000), record, note, reuse)
        if exchange is not None:
            _remember(ids, "exchange", record["exchange"])
    seen: dict[str, tuple[JobSpec, int]] = {}
    for run in modelled:
        seen.setdefault(job_key(run.job, run.workers), (run.job, run.workers))
    for key, (job, workers) in seen.items():
        def measure(job=job, workers=workers):
            compute, facts = measure_compute(testbed, job, workers, log_root / f"calibration-compute-{len(computes)}",
                                             rng.randrange(20000, 30000))
            return {"compute_s": compute.compute_s, "model_bytes": compute.model_bytes}, facts
        try:
            value, facts = _obtain("compute", compute_measured(job, workers), f"{job.model} compute on {workers} node(s)",
                                   measure, reuse, note)
        except Exception as exc:  # noqa: BLE001 - as above
            record["errors"].append(_why(exc))
            note(f"compute calibration of {key} failed: {_why(exc)}; no predictions for it")
            continue
        compute = computes[key] = Compute(float(value["compute_s"]), int(value["model_bytes"]))
        record["compute"][key] = facts
        _remember(ids, f"compute/{key}", facts)
        if not facts["reused"]:
            note(f"calibration: {job.model} compute {compute.compute_s * 1e3:.1f} ms per batch on {workers} node(s) "
                 f"at once, {compute.model_bytes:,} bytes of weights ({facts['seconds']:.1f} s)")
    bases = _calibrate_bases(testbed, modelled, computes, log_root, rng, record, ids, note, reuse)
    record["seconds"] = round(time.monotonic() - started, 3)
    return Predictor(collective=collective_fits, compute=computes, exchange=exchange, ids=ids, base=bases), record


def _calibrate_bases(testbed, modelled, computes, log_root, rng, record: dict, ids: dict, note,
                     reuse: Reuse) -> dict[str, float]:
    """The base step of each exchange job of the sweep (experiment/base_calibration.py), where
    its compute was calibrated; one that fails is noted and its runs are predicted from the
    parts alone."""
    from netbench.experiment import base_calibration as bc

    seen: dict[str, tuple[JobSpec, int]] = {}
    for run in modelled:
        if bc.wanted(run.job, run.workers) and job_key(run.job, run.workers) in computes:
            seen.setdefault(_base_key(run.job, run.workers), (run.job, run.workers))
    bases: dict[str, float] = {}
    for key, (job, workers) in seen.items():
        def measure(job=job, workers=workers):
            step, facts = bc.measure(testbed, job, workers, log_root / f"calibration-base-{len(bases)}",
                                     rng.randrange(20000, 30000))
            return {"step_s": step}, facts
        try:
            value, facts = _obtain("base", bc.measured(job, workers), f"{job.strategy} base step on {workers} node(s)",
                                   measure, reuse, note)
        except Exception as exc:  # noqa: BLE001 - as above
            record["errors"].append(_why(exc))
            note(f"base-step calibration of {key} failed: {_why(exc)}; its runs are predicted from the parts")
            continue
        bases[key] = float(value["step_s"])
        record.setdefault("base", {})[key] = facts
        _remember(ids, f"base/{key}", facts)
        if not facts["reused"]:
            note(f"calibration: {job.strategy} base step {bases[key] * 1e3:.1f} ms on {workers} worker(s), unshaped "
                 f"({facts['seconds']:.1f} s)")
    return bases


def _remember(ids: dict[str, str], name: str, facts: dict) -> None:
    if facts.get("id"):
        ids[name] = facts["id"]


def _calibrate_exchange(testbed, log_root, port: int, record: dict, note, reuse: Reuse | None = None):
    """The exchange calibration, recorded in `record`; None (noted) when it fails: the
    exchange strategies then fall back to the all-reduce's terms."""
    from netbench.experiment import exchange_calibration as xc

    def measure():
        exchange, facts = xc.measure(testbed, log_root / "calibration-exchange", port)
        return {"alpha_s": exchange.alpha_s, "beta_s_per_byte": exchange.beta_s_per_byte,
                "window_bytes": exchange.window_bytes}, facts

    try:
        value, facts = _obtain("exchange", xc.measured(), "exchange protocol", measure, reuse or Reuse(), note)
    except Exception as exc:  # noqa: BLE001 - a calibration only informs: the sweep goes on without it
        record["errors"].append(_why(exc))
        note(f"exchange calibration failed: {_why(exc)}; the exchange strategies use the all-reduce's terms")
        return None
    exchange = xc.Exchange(float(value["alpha_s"]), float(value["beta_s_per_byte"]),
                           None if value.get("window_bytes") is None else int(value["window_bytes"]))
    record["exchange"] = facts
    if not facts["reused"]:
        window = "unknown" if exchange.window_bytes is None else f"{exchange.window_bytes / 2**20:.1f} MiB"
        note(f"calibration: exchange protocol request-reply, unshaped: alpha {exchange.alpha_s * 1e3:.2f} ms, "
             f"beta {exchange.beta_s_per_byte * 1e9:.2f} ns/byte moved, TCP window {window} ({facts['seconds']:.1f} s)")
    return exchange


def annotate(result, run, predictor: Predictor | None):
    """The run's record with its predicted step (None where the model does not apply)."""
    if predictor is None:
        return result
    prediction = predictor.predict(run, reported_buckets(result.events))
    if prediction is None:
        return result
    return replace(result, predicted_step_s=prediction.step_s, calibration_id=predictor.calibration_id(run),
                   predicted_omits="; ".join(predictor.omitted(run)) or None)


def reported_buckets(events) -> int | None:
    """How many gradient buckets torch's DDP made, from a run's start events (its
    "ddp_bucket_bytes": the sizes DDP assigned); None when no rank says (TensorFlow, older runs)."""
    for event in events:
        sizes = event.get("ddp_bucket_bytes") if isinstance(event, dict) else None
        if sizes:
            return len([s for s in str(sizes).split(",") if s.strip()])
    return None

