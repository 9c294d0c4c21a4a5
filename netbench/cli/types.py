"""Parameter types shared by the click commands (cli/*.py)."""

from __future__ import annotations

import math

import click


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and infinity: nan passes every comparison,
    so FloatRange lets it through (a step timeout of nan never times out)."""

    def convert(self, value, param, ctx):
        if _non_finite(value):
            self.fail(f"{value} is not a finite number", param, ctx)
        return super().convert(value, param, ctx)


def _non_finite(value) -> bool:
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False  # not a number at all: FloatRange says so


class Seconds(click.ParamType):
    """A duration flag that has always taken seconds: "90" is 90 s; a unit is welcome too
    ("90s", "500ms", "2min"; units.parse_seconds), within [low, high] seconds."""

    name = "duration"

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high

    def get_metavar(self, param, ctx=None) -> str:  # click 8.2 passes ctx, 8.1 does not
        return "DURATION"

    def convert(self, value, param, ctx):
        from netbench import units

        if _non_finite(value):
            self.fail(f"{value} is not a finite number", param, ctx)
        if isinstance(value, str) and value.startswith("--"):  # the value was left out: the next flag came
            self.fail(f"takes a duration (e.g. 0.5s), got the flag {value!r}", param, ctx)
        try:
            seconds = units.parse_seconds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not self.low <= seconds <= self.high:
            self.fail(f"{value} is outside {self.low:g}s..{self.high:g}s", param, ctx)
        return seconds


class ShardParam(click.ParamType):
    """--shard I/N: shard I (0 to N-1) of N (model/shard.py)."""

    name = "I/N"

    def convert(self, value, param, ctx):
        from netbench.model.shard import Shard, parse_shard

        if isinstance(value, Shard):
            return value
        try:
            return parse_shard(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
