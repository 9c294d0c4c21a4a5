"""A playbook's keys of the training algorithms and of accuracy runs (pure; issue 21).

Top-level keys, fixed for every run of the playbook::

    train_steps: 200        # each run trains a fresh model for 200 steps (warm-up included)
    eval_every: 50          # held-out accuracy every 50 steps (and after the last)
    target_accuracy: 0.7    # steps and training time until it was first reached
    algorithm: {staleness: 3, tau: 4, elastic_alpha: 0.45, gossip_p: 0.1, pipeline: 16}

Each becomes the JobSpec field of its name (`job_extra`); `algorithm`'s settings are used by
the strategy they belong to (ps-ssp, easgd, gosgd, ps-async) and ignored by the others. To vary one, a
playbook names it under `factors:` instead (model.playbook_values.SETTING_KEYS, the same
ranges); a key under both is an error (model.playbook).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from netbench.model.job import ALGORITHM_KEYS, ALGORITHM_SETTINGS
from netbench.model.playbook_values import SETTING_KEYS, ratio, whole



class BadKey(ValueError):
    """A key out of range: the playbook loader names the file (model.playbook.fail)."""

    def __init__(self, key: str, message: str, hint: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message, self.hint = key, message, hint

TOP_KEYS = ("train_steps", "eval_every", "target_accuracy", "algorithm")
# the strategy that uses each (model.job.ALGORITHM_SETTINGS, the other way round)
OWNERS = {key: strategy for strategy, keys in ALGORITHM_SETTINGS.items() for key in keys}


def _parsed(key: str, parse: Callable[[Any], Any], raw: Any, example: str) -> Any:
    """`raw` through a playbook setting's parser (model.playbook_values), its error a BadKey."""
    try:
        return parse(raw)
    except ValueError as exc:
        raise BadKey(key, str(exc), f"e.g. '{example}'") from None


def _whole(key: str, raw: Any, low: int, high: int) -> int:
    return _parsed(key, whole(low, high), raw, f"{key}: {max(low, 1)}")


def _ratio(key: str, raw: Any, low_open: bool) -> float:
    return _parsed(key, ratio(low_open), raw, f"{key}: 0.5")


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
        if not out.get("train_steps") and not out.get("eval_every"):
            raise BadKey("target_accuracy", "nothing evaluates the accuracy without train_steps or eval_every",
                         "e.g. 'train_steps: 300' beside it")
    if "seconds" in data and "train_steps" in data:
        raise BadKey("seconds", "not with train_steps: an accuracy run trains a step count", "remove seconds:")
    algorithm = data.get("algorithm", {}) or {}
    if not isinstance(algorithm, Mapping):
        raise BadKey("algorithm", "must be a mapping", "e.g. 'algorithm: {staleness: 3, tau: 4}'")
    for key, raw in algorithm.items():
        where = f"algorithm.{key}"
        if key not in ALGORITHM_KEYS:
            raise BadKey(where, "unknown key", f"use one of: {', '.join(ALGORITHM_KEYS)}")
        _, parse, example = SETTING_KEYS[key]  # the ranges of the same keys as factors
        try:
            out[key] = parse(raw)
        except ValueError as exc:
            raise BadKey(where, str(exc), f"one value here; to vary it, a factor: '{example}'") from None
    return tuple(out.items())


def unused(extra: tuple[tuple[str, Any], ...], strategies: set[str]) -> BadKey | None:
    """An `algorithm:` key no run's strategy uses (`algorithm: {staleness: 3}` with no ps-ssp run
    would be recorded nowhere and change nothing): the BadKey to raise, or None."""
    for key, _ in extra:
        owner = OWNERS.get(key)
        if owner is not None and owner not in strategies:
            return BadKey(f"algorithm.{key}", f"no run uses it: {key} is strategy {owner}'s setting, and no run "
                          f"is {owner}", f"add strategy {owner}, or remove {key}")
    return None


def written_problem(written: list[tuple[str, str]], extra: tuple[tuple[str, Any], ...],
                    points: list) -> BadKey | None:
    """The first problem with a playbook's algorithm settings, or None. `written`: (where, key) of each
    setting written under factors, fixed and extra_runs; `extra`: its `algorithm:` keys; `points`:
    its runs' Settings. A setting (staleness, tau, ...) is set in one place, under algorithm: or as
    a setting, and some run's strategy uses it; ps-sync's backup workers are fewer than its workers
    (a round applies at least one gradient)."""
    for where, key in written:
        if key not in ALGORITHM_KEYS:
            continue
        if key in dict(extra):
            return BadKey(where, f"{key} is set under algorithm: too",
                          f"keep one: algorithm.{key} (one value for every run), or {where}")
        if all(getattr(point, key) is None for point in points):
            owner = OWNERS[key]
            return BadKey(where, f"no run uses it: {key} is strategy {owner}'s setting, and no run is {owner}",
                          f"add strategy {owner}, or remove {key}")
    bad = unused(extra, {point.strategy for point in points})
    if bad is not None:
        return bad
    where = next((w for w, k in written if k == "backup_workers"), "algorithm.backup_workers")
    for point in (p for p in points if p.strategy == "ps-sync"):
        backup = dict(extra).get("backup_workers") if point.backup_workers is None else point.backup_workers
        if (backup or 0) >= point.workers:
            return BadKey(where, f"{backup} backup workers with {point.workers} workers: must be fewer "
                          "than the workers", "lower it, or add workers")
    return None


def job_fields(extra: tuple[tuple[str, Any], ...], warmup: int, steps: int) -> dict[str, Any]:
    """The JobSpec keyword arguments of `extra`; with train_steps the measured steps are the rest
    after warm-up."""
    out = dict(extra)
    if out.get("train_steps"):
        out["steps"] = out["train_steps"] - warmup
    return out
