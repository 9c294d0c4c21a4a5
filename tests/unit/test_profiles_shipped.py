"""Every profile shipped under profiles/ loads, and the study grid is complete."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from netbench.model.profile import load_profile

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
# schedules (profiles/schedules/) and topologies (profiles/topologies/) are not profiles:
# test_schedule.py and test_pairs.py load them
NOT_PROFILES = ("schedules", "topologies")
SHIPPED = sorted(p for p in PROFILES.rglob("*.yaml") if p.relative_to(PROFILES).parts[0] not in NOT_PROFILES)
GRID = PROFILES / "grid"


def test_profiles_are_shipped():
    assert SHIPPED, f"no profiles under {PROFILES}"
    assert not list(PROFILES.rglob("*.yml")), "use the .yaml extension"


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(PROFILES)) for p in SHIPPED])
def test_shipped_profile_loads(path):
    profile = load_profile(path)
    assert not profile.is_null, f"{path} changes nothing"


def test_shipped_names_are_unique():
    names = [load_profile(path).name for path in SHIPPED]
    assert len(names) == len(set(names))


def test_grid_is_the_full_27_point_grid():
    assert GRID.is_dir(), f"{GRID} is missing"
    points = [load_profile(path) for path in sorted(GRID.glob("*.yaml"))]
    got = sorted((p.delay_us, p.rate_bps, p.loss, p.jitter_us) for p in points)
    expected = sorted((d * 1000, r * 10**6, loss / 100, 0)
                      for d, r, loss in itertools.product((1, 10, 100), (250, 500, 1000), (0, 1, 10)))
    assert len(points) == 27
    assert got == expected


def test_grid_file_names_match_contents():
    for path in GRID.glob("*.yaml"):
        p = load_profile(path)
        assert path.stem == p.name
        expected = f"d{p.delay_us // 1000}ms-r{p.rate_bps // 10**6}mbit-l{round(p.loss * 100)}pct"
        assert p.name == expected, path
