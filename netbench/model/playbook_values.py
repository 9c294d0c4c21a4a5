"""A playbook's setting keys and the parsers of their values (pure): each key of a design's
factors and fixed settings, the Settings field it fills, its parser and an example for errors."""

from __future__ import annotations

import difflib
from typing import Any, Callable

from netbench import units
from netbench.errors import shown
from netbench.model.frameworks import FRAMEWORKS
from netbench.model.ranks import COLLECTIVES

STRATEGIES = ("allreduce", "allreduce-accum", "ps", "single", "ps-sync", "ps-async", "ps-ssp", "easgd", "gosgd",
              "adpsgd")
# the models of issue 4; which of them this build's worker can train is checked before a run
MODELS = ("mlp", "cnn", "mobilenetv2", "resnet50", "efficientnetb0", "vgg16", "resnet18")


def _duration(raw: Any) -> int:
    return units.parse_duration_us(raw)


def _rate(raw: Any) -> int | None:
    if raw is None or (isinstance(raw, str) and raw.strip().lower() == "unlimited"):
        return None
    return units.parse_rate_bps(raw)


def whole(low: int, high: int) -> Callable[[Any], int]:
    """A whole number in low..high (also `algorithm:`'s and train_steps')."""
    def parse(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"must be a whole number, got {shown(raw)}")
        if not low <= raw <= high:
            raise ValueError(f"{raw} is outside {low}..{high}")
        return raw
    return parse


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if raw not in allowed:
            close = difflib.get_close_matches(str(raw), allowed, n=1)
            extra = f" (did you mean {shown(close[0])}?)" if close else ""
            raise ValueError(f"unknown value {shown(raw)}{extra}; use one of: {', '.join(allowed)}")
        return raw
    return parse


def _scale(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= 1000 or raw != raw:
        raise ValueError(f"must be a number above 0 (at most 1000), got {shown(raw)}")
    return float(raw)


def ratio(low_open: bool) -> Callable[[Any], float]:
    """A number in (0, 1] (`low_open`) or [0, 1] (also `algorithm:`'s and target_accuracy's)."""
    def parse(raw: Any) -> float:
        number = isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw == raw
        if not number or not (0 < raw <= 1 if low_open else 0 <= raw <= 1):
            raise ValueError(f"must be a number in {'(0, 1]' if low_open else '[0, 1]'}, got {shown(raw)}")
        return float(raw)
    return parse


def _data(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"must be 'synthetic' or a path to a dataset, got {shown(raw)}")
    return raw.strip()


# setting key in YAML (the sweep's flag's name) -> (Settings field, parser, example)
SETTING_KEYS: dict[str, tuple[str, Callable[[Any], Any], str]] = {
    "latency": ("delay_us", _duration, "latency: [1ms, 10ms, 100ms]"),
    "bandwidth": ("rate_bps", _rate, "bandwidth: [250mbit, 1gbit]"),
    "loss": ("loss", units.parse_ratio, "loss: [0%, 1%, 10%]"),
    "jitter": ("jitter_us", _duration, "jitter: [0ms, 1ms]"),
    "strategy": ("strategy", _choice(STRATEGIES), "strategy: [allreduce, allreduce-accum]"),
    "model": ("model", _choice(MODELS), "model: [mlp, mobilenetv2]"),
    "batch_size": ("batch", whole(1, 65536), "batch_size: [32, 64, 100]"),  # --batch-size (per worker)
    "workers": ("workers", whole(1, 64), "workers: [1, 2, 3]"),
    "ps": ("ps", whole(1, 16), "ps: [1, 2]"),
    "accum_steps": ("accum_steps", whole(1, 10000), "accum_steps: [4]"),
    "data": ("data", _data, "data: synthetic"),
    "scale": ("scale", _scale, "scale: [1, 2, 4]"),  # with topology: only
    "framework": ("framework", _choice(FRAMEWORKS), "framework: [tensorflow, torch]"),
    # the training algorithms' own settings (model.job.ALGORITHM_SETTINGS says which strategy uses
    # which), with algorithm_keys' ranges; a key here and under `algorithm:` too is an error
    "staleness": ("staleness", whole(0, 10_000), "staleness: [0, 3, 10]"),  # ps-ssp
    "tau": ("tau", whole(1, 100_000), "tau: [1, 4, 16]"),  # easgd
    "elastic_alpha": ("elastic_alpha", ratio(True), "elastic_alpha: [0.1, 0.45]"),  # easgd
    "gossip_p": ("gossip_p", ratio(False), "gossip_p: [0.01, 0.1, 0.5]"),  # gosgd
    "backup_workers": ("backup_workers", whole(0, 63), "backup_workers: [0, 1]"),  # ps-sync
    "pipeline": ("pipeline", whole(0, 10_000), "pipeline: [0, 16]"),  # ps-async
    # several ranks per node (model/ranks.py) and torch's all-reduce between them
    "ranks_per_node": ("ranks_per_node", whole(1, 64), "ranks_per_node: [1, 2]"),
    "collective": ("collective", _choice(COLLECTIVES), "collective: [ring, hierarchical]"),
}
