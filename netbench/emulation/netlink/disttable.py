"""Delay distribution tables for netem (pure).

netem draws jitter from a table the client sends with the qdisc (TCA_NETEM_DELAY_DIST):
4096 signed 16-bit samples of the inverse CDF, scaled so that 8192 is one standard
deviation (NETEM_DIST_SCALE). The kernel has no tables of its own; `tc` reads them from
iproute2's *.dist files. netbench computes them with the same arithmetic as iproute2's
generators (netem/normal.c, pareto.c, paretonormal.c), so they equal those files value for
value (tests/test_disttable.py compares them), and needs no file at run time.

A `uniform` table is ours: netem's built-in jitter (no table) is uniform on
[delay - jitter, delay + jitter]. netbench still sends a table for it, because a table
cannot be removed from a live netem qdisc; sending one on every change means a change from
`normal` back to `uniform` really takes effect instead of keeping the old table.
"""

from __future__ import annotations

import math
from functools import lru_cache

DIST_SCALE = 8192  # NETEM_DIST_SCALE: a table value of 8192 is one jitter unit
TABLE_SIZE = 4096  # samples sent to the kernel
_CDF_SIZE = 16384  # iproute2 samples the CDF 4x finer, then keeps every 4th entry
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
_PARETO_ALPHA = 3.0


def _clamp16(value: int) -> int:
    return max(-32768, min(32767, value))


def _rint(x: float) -> int:
    """C's rint() in the default rounding mode: nearest, ties to even (as Python's round)."""
    return int(round(x))


@lru_cache(maxsize=1)
def _normal_quantiles() -> tuple[float, ...]:
    """x for each of 16385 CDF steps of N(0, 1), filled exactly as normal.c does
    (including its accumulated floating-point step, so the result matches bit for bit)."""
    table = [0.0] * (_CDF_SIZE + 1)
    x = -10.0
    while x < 10.05:
        table[_rint(_CDF_SIZE * (0.5 + 0.5 * math.erf(x / math.sqrt(2.0))))] = x
        x += 0.00005
    return tuple(table)


def _pareto_value(i: int) -> int:
    """Pareto(alpha=3) sample for CDF step 65536 - i, centred and scaled as pareto.c."""
    value = 1.0 / math.pow(i / 65536, 1.0 / _PARETO_ALPHA)
    value = (value - 1.5) * (4.0 / 3.0) * DIST_SCALE
    return _rint(min(value, 32767.0))


def _trunc_div4(value: int) -> int:
    """C integer division by 4 (rounds toward zero)."""
    return value // 4 if value >= 0 else -((-value) // 4)


def normal_table() -> tuple[int, ...]:
    quantiles = _normal_quantiles()
    return tuple(_clamp16(_rint(quantiles[i] * DIST_SCALE)) for i in range(0, _CDF_SIZE, 4))


def pareto_table() -> tuple[int, ...]:
    return tuple(_pareto_value(i) for i in range(65536, 0, -16))


def paretonormal_table() -> tuple[int, ...]:
    """A quarter normal plus three quarters Pareto, per step (paretonormal.c)."""
    quantiles = _normal_quantiles()
    return tuple(_clamp16(_trunc_div4(_rint(quantiles[i] * DIST_SCALE) + 3 * _pareto_value(65536 - 4 * i)))
                 for i in range(0, _CDF_SIZE, 4))


def uniform_table() -> tuple[int, ...]:
    """Evenly spaced over [-8192, 8192]: the delay is uniform on delay +- jitter."""
    step = 2 * DIST_SCALE / TABLE_SIZE
    return tuple(_rint(-DIST_SCALE + (i + 0.5) * step) for i in range(TABLE_SIZE))


_BUILDERS = {"uniform": uniform_table, "normal": normal_table, "pareto": pareto_table,
             "paretonormal": paretonormal_table}


@lru_cache(maxsize=None)
def table(distribution: str) -> tuple[int, ...]:
    """The 4096-entry table for `distribution` (one of DISTRIBUTIONS)."""
    try:
        return _BUILDERS[distribution]()
    except KeyError:
        raise ValueError(f"unknown distribution {distribution!r}; use one of {', '.join(DISTRIBUTIONS)}") from None
