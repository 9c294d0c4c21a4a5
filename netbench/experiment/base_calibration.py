"""The base-step calibration of the exchange strategies: the job itself on unshaped links.

The step model builds an exchange strategy's step (ps-sync, ps-async, ps-ssp, easgd, gosgd,
adpsgd) from parts calibrated apart: a batch's compute in a single-strategy process, and the
protocol's request-reply between two nodes with nothing else running. Their sum misses what
only the job itself does each step: the worker turns its weights into the model's inputs and
the gradients back into arrays, splits and joins shards, a parameter server applies every
worker's gradient and copies the weights for each reply, and all of them share the CPU. On a
2-core machine, ps-sync with the mlp (2.7 MB of weights) between two workers took 11.2 ms a step
on unshaped links where the parts summed to 3.5 ms; the network's own terms were right (its
1 ms point added 1.6 ms, the model 3.0 ms).

So for those strategies netbench runs the job once before the first point, as it will run
(its strategy, settings, servers, model, batch and data, one process per node), on the links as
the testbed starts (unshaped), for BASE_WARMUP + BASE_STEPS steps, and keeps the chief's mean
measured step: the *base step*. A point's prediction is then the base step plus what the model
says the point adds to the unshaped step (model/step_model.py `predict`): its round trips and
bytes at the rate, and its nodes' CPU limits and step delays. The calibration is keyed and
cached as the others are (experiment/calibration_cache.py), so a later sweep of the same job
reuses it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

from netbench.errors import NetbenchError
from netbench.jobs import analysis
from netbench.jobs.launch import Timeouts, exchange_env, run_job
from netbench.model import exchange_model
from netbench.model.job import JobSpec, algorithm_argv, plan_job

BASE_WARMUP, BASE_STEPS = 5, 30
TIMEOUTS = Timeouts(startup_s=240.0, step_s=120.0)


def wanted(job: JobSpec, workers: int) -> bool:
    """Whether a run of `job` on `workers` workers gets a base-step calibration: netbench's
    exchange strategies with at least two workers, the built-in job (not a user's command)."""
    return job.strategy in exchange_model.STRATEGIES and workers >= 2 and job.command is None


def calibration_job(job: JobSpec) -> JobSpec:
    """The job as the calibration runs it: its own settings, a short fixed window, no accuracy
    runs, no resource sampling, no precision, no step delays or limits (those are per point)."""
    return replace(job, warmup=BASE_WARMUP, steps=BASE_STEPS, seconds=None, precision=None,
                   sample_resources_s=0.0, train_steps=None, eval_every=0, target_accuracy=None)


def key(job: JobSpec, workers: int, job_key: str) -> str:
    """The calibration's name among a sweep's: the compute key (model, batch, input, data,
    workers) and what the strategy adds (its name, servers and settings)."""
    settings = " ".join(algorithm_argv(calibration_job(job)))
    return f"{job.strategy}/ps{job.ps}/{job_key}" + (f"/{settings}" if settings else "")


def measured(job: JobSpec, workers: int) -> dict[str, Any]:
    """What the calibration measures (its cache key's `measured`)."""
    run = calibration_job(job)
    return {"framework": job.framework, "strategy": job.strategy, "ps": job.ps, "model": job.model,
            "batch": job.batch_size, "input_shape": list(job.input_shape or ()), "classes": job.classes,
            "data": job.data, "device": job.device, "workers": workers, "settings": list(algorithm_argv(run)),
            "warmup": BASE_WARMUP, "steps": BASE_STEPS}


def measure(testbed, job: JobSpec, workers: int, log_dir, port: int) -> tuple[float, dict[str, Any]]:
    """Run the job on the testbed's links as they are (unshaped, before the first point) and
    return (the chief's mean measured step in seconds, facts for the record)."""
    run = calibration_job(job)
    tasks = plan_job(run, testbed.nodes_for(run, workers), workers, port=port)
    started = time.monotonic()
    outcome = run_job(tasks, log_dir, testbed.spawn, TIMEOUTS, env=exchange_env(TIMEOUTS))
    if outcome.status != "ok":
        raise NetbenchError(f"base-step calibration of {job.strategy}: {outcome.error}", hint=f"logs in {log_dir}")
    steps = analysis.measured_durations(outcome.events, run)
    if not steps:
        raise NetbenchError(f"base-step calibration of {job.strategy}: no measured steps", hint=f"logs in {log_dir}")
    mean = statistics.fmean(steps)
    return mean, {"step_s": mean, "median_s": statistics.median(steps), "steps": len(steps),
                  "seconds": round(time.monotonic() - started, 3)}
