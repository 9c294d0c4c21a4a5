"""A playbook's keys of the training algorithms and of accuracy runs (pure; issue 21).

Top-level keys, fixed for every run of the playbook::

    train_steps: 200        # each run trains a fresh model for 200 steps (warm-up included)
    eval_every: 50          # held-out accuracy every 50 steps (and after the last)
    target_accuracy: 0.7    # steps and training time until it was first reached
    algorithm: {staleness: 3, tau: 4, elastic_alpha: 0.45, gossip_p: 0.1}

Each becomes the JobSpec field of its name (`job_extra`); `algorithm`'s settings are used by
the strategy they belong to (ps-ssp, easgd, gosgd) and ignored by the others. To vary one, a
playbook names it under `factors:` instead (model.playbook_values.SETTING_KEYS, the same
ranges); a key under both is an error (model.playbook).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from netbench.model.job import ALGORITHM_KEYS, ALGORITHM_SETTINGS



class BadKey(ValueError):
    """A key out of range: the playbook loader names the file (model.playbook.fail)."""

    def __init__(self, key: str, message: str, hint: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message, self.hint = key, message, hint

TOP_KEYS = ("train_steps", "eval_every", "target_accuracy", "algorithm")
# the strategy that uses each (model.job.ALGORITHM_SETTINGS, the other way round)
OWNERS = {key: strategy for strategy, keys in ALGORITHM_SETTINGS.items() for key in keys}


def _whole(key: str, raw: Any, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise BadKey(key, f"must be a whole number from {low} to {high}, got {raw!r}", f"e.g. '{key}: {max(low, 1)}'")
    return raw


def _ratio(key: str, raw: Any, low_open: bool) -> float:
    ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw) \
        and (0 < raw <= 1 if low_open else 0 <= raw <= 1)
    if not ok:
        span = "(0, 1]" if low_open else "[0, 1]"
        raise BadKey(key, f"must be a number in {span}, got {raw!r}", f"e.g. '{key}: 0.5'")
    return float(raw)


def job_extra(data: Mapping[str, Any], warmup: int) -> tuple[tuple[str, Any], ...]:
    """(JobSpec field, value) pairs from a playbook's top-level mapping; raises BadKey."""
    out: dict[str, Any] = {}
    if "train_steps" in data:
        out["train_steps"] = _whole("train_steps", data["train_steps"], 2, 10_000_000)
        if out["train_steps"] <= warmup:
            raise BadKey("train_steps", f"must be more than the {warmup} warm-up steps, got {out['train_steps']}",
                         "raise train_steps, or lower warmup")
    if "eval_every" in data:
        out["eval_every"] = _whole("eval_every", data["eval_every"], 0, 10_000_000)
    if "target_accuracy" in data:
        out["target_accuracy"] = _ratio("target_accuracy", data["target_accuracy"], True)
    algorithm = data.get("algorithm", {}) or {}
    if not isinstance(algorithm, Mapping):
        raise BadKey("algorithm", "must be a mapping", "e.g. 'algorithm: {staleness: 3, tau: 4}'")
    for key, raw in algorithm.items():
        where = f"algorithm.{key}"
        if key == "staleness":
            out[key] = _whole(where, raw, 0, 10_000)
        elif key == "tau":
            out[key] = _whole(where, raw, 1, 100_000)
        elif key == "elastic_alpha":
            out[key] = _ratio(where, raw, True)
        elif key == "gossip_p":
            out[key] = _ratio(where, raw, False)
        else:
            raise BadKey(where, "unknown key", f"use one of: {', '.join(ALGORITHM_KEYS)}")
    return tuple(out.items())


def job_fields(extra: tuple[tuple[str, Any], ...], warmup: int, steps: int) -> dict[str, Any]:
    """The JobSpec keyword arguments of `extra`; with train_steps the measured steps are the rest
    after warm-up."""
    out = dict(extra)
    if out.get("train_steps"):
        out["steps"] = out["train_steps"] - warmup
    return out
