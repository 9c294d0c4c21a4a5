"""netem distribution tables equal iproute2's, value for value."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from netbench.emulation.netlink import disttable

IPROUTE2_DIRS = (Path("/usr/lib/x86_64-linux-gnu/tc"), Path("/usr/lib/tc"), Path("/usr/share/tc"),
                 Path("/usr/lib64/tc"))


def _iproute2_table(name: str) -> list[int] | None:
    for folder in IPROUTE2_DIRS:
        path = folder / f"{name}.dist"
        if path.exists():
            return [int(word) for line in path.read_text().splitlines()
                    if not line.startswith("#") for word in line.split()]
    return None


@pytest.mark.parametrize("name", ["normal", "pareto", "paretonormal"])
def test_tables_equal_iproute2_files(name):
    reference = _iproute2_table(name)
    if reference is None:
        pytest.skip(f"iproute2's {name}.dist is not installed here (package iproute2)")
    assert list(disttable.table(name)) == reference


@pytest.mark.parametrize("name", disttable.DISTRIBUTIONS)
def test_tables_fit_the_kernel_format(name):
    values = disttable.table(name)
    assert len(values) == disttable.TABLE_SIZE
    assert all(-32768 <= v <= 32767 for v in values)
    assert list(values) == sorted(values)  # an inverse CDF is monotone


def test_normal_table_has_unit_spread():
    values = disttable.table("normal")
    assert abs(statistics.mean(values)) < 50
    assert statistics.pstdev(values) == pytest.approx(disttable.DIST_SCALE, rel=0.02)


def test_uniform_table_spans_plus_minus_one_jitter():
    values = disttable.table("uniform")
    assert values[0] == pytest.approx(-disttable.DIST_SCALE, abs=2)
    assert values[-1] == pytest.approx(disttable.DIST_SCALE, abs=2)
    assert sum(values) == 0
    gaps = {b - a for a, b in zip(values, values[1:])}
    assert gaps == {4}


def test_pareto_is_heavy_tailed_to_the_right():
    values = disttable.table("pareto")
    assert values[-1] > 4 * abs(values[0])


def test_unknown_distribution_is_a_value_error():
    with pytest.raises(ValueError, match="unknown distribution 'gauss'"):
        disttable.table("gauss")
