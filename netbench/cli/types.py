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
