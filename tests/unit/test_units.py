"""netbench.units: parsing and formatting durations, rates and ratios."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netbench import units

# ---------------------------------------------------------------- durations


@pytest.mark.parametrize("text, expected", [
    ("500us", 500), ("500usec", 500), ("10ms", 10_000), ("10msec", 10_000), ("1s", 1_000_000),
    ("2sec", 2_000_000), ("1.5ms", 1_500), ("0.5s", 500_000), ("0", 0), ("0ms", 0), ("10MS", 10_000),
    (" 10 ms ", 10_000), ("1e3us", 1_000), (".5ms", 500), (0, 0),
])
def test_parse_duration(text, expected):
    assert units.parse_duration_us(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("10", "needs a unit"), (10, "needs a unit"), ("10xs", "unknown duration unit 'xs'"),
    ("-5ms", "must not be negative"), (-5, "must not be negative"), ("abc", "expected a duration"),
    ("", "expected a duration"), ("10 ms ms", "expected a duration"), (True, "expected a duration"),
    (None, "expected a duration"), ([10], "expected a duration"),
])
def test_parse_duration_rejects(text, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        units.parse_duration_us(text)


def test_parse_duration_error_quotes_the_input():
    with pytest.raises(ValueError) as info:
        units.parse_duration_us("7parsecs")
    assert "'7parsecs'" in str(info.value)


def test_parse_duration_micro_sign():
    assert units.parse_duration_us("10µs") == 10


@pytest.mark.parametrize("parse, text", [(units.parse_duration_us, "1e400ms"), (units.parse_rate_bps, "1e400mbit")])
def test_parse_overflow_is_a_value_error(parse, text):
    with pytest.raises(ValueError):
        parse(text)


@pytest.mark.parametrize("parse", [units.parse_duration_us, units.parse_rate_bps, units.parse_ratio])
@pytest.mark.parametrize("number", [10**400, -(10**400), 10**20], ids=["1e400", "-1e400", "1e20"])
def test_huge_integers_are_a_value_error(parse, number):
    # a YAML integer has no size limit; float(10**400) raises OverflowError
    with pytest.raises(ValueError, match="not a usable number"):
        parse(number)


@pytest.mark.parametrize("us, text", [
    (0, "0ms"), (1, "1us"), (999, "999us"), (1000, "1ms"), (1500, "1.5ms"), (10_000, "10ms"),
    (1_000_000, "1s"), (3_000_000, "3s"), (2_500_000, "2500ms"),
])
def test_format_duration(us, text):
    assert units.format_duration_us(us) == text


# durations whose milliseconds have at most 6 significant digits: those format exactly
exact_durations = st.one_of(
    st.integers(0, 999_999),
    st.integers(0, 1_000_000).map(lambda k: k * 10),
    st.integers(0, 10**6).map(lambda k: k * 1_000_000),
)


@given(exact_durations)
def test_duration_round_trip(us):
    assert units.parse_duration_us(units.format_duration_us(us)) == us


@pytest.mark.parametrize("us", [1_234_567, 9_999_999, 1_000_001_000])
def test_duration_round_trip_beyond_six_digits(us):
    assert units.parse_duration_us(units.format_duration_us(us)) == us


# ---------------------------------------------------------------- rates


@pytest.mark.parametrize("text, expected", [
    ("250mbit", 250_000_000), ("1gbit", 10**9), ("100kbit", 100_000), ("8000bit", 8000),
    ("1.5gbit", 1_500_000_000), ("10mbps", 80_000_000), ("1kbps", 8_000), ("1gbps", 8 * 10**9),
    ("1bps", 8), ("250Mbit", 250_000_000), ("0mbit", 0),
])
def test_parse_rate(text, expected):
    assert units.parse_rate_bps(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("250", "needs a unit"), (250, "needs a unit"), ("250mb", "unknown rate unit 'mb'"),
    ("-1mbit", "must not be negative"), ("fast", "expected a rate"),
])
def test_parse_rate_rejects(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        units.parse_rate_bps(text)


@pytest.mark.parametrize("bps, text", [
    (None, "unlimited"), (0, "0bit"), (999, "999bit"), (1000, "1kbit"), (250_000_000, "250mbit"),
    (1_500_000_000, "1.5gbit"), (10**9, "1gbit"), (100_000, "100kbit"),
])
def test_format_rate(bps, text):
    assert units.format_rate_bps(bps) == text


# rates with at most 6 significant digits format exactly
exact_rates = st.builds(lambda m, e: m * 10**e, st.integers(0, 999_999), st.integers(0, 9))


@given(exact_rates)
def test_rate_round_trip(bps):
    assert units.parse_rate_bps(units.format_rate_bps(bps)) == bps


# ---------------------------------------------------------------- ratios


@pytest.mark.parametrize("text, expected", [
    ("1%", 0.01), ("0.5%", 0.005), ("100%", 1.0), ("0%", 0.0), ("0.01", 0.01), ("0", 0.0), (0, 0.0),
    (0.25, 0.25), (" 10 % ", 0.1),
])
def test_parse_ratio(text, expected):
    assert units.parse_ratio(text) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("text, fragment", [
    ("120%", "over 100%"), ("1", "ambiguous"), ("2", "ambiguous"), (2, "ambiguous"), ("1.5", "ambiguous"),
    ("-1%", "must not be negative"), ("5pct", "unknown unit 'pct'"), ("lots", "expected a percentage"),
])
def test_parse_ratio_rejects(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        units.parse_ratio(text)


def test_ambiguous_ratio_suggests_a_percentage():
    with pytest.raises(ValueError, match="2%"):
        units.parse_ratio("2")


@pytest.mark.parametrize("ratio, text", [(0.0, "0%"), (0.01, "1%"), (0.005, "0.5%"), (1.0, "100%"), (0.1, "10%")])
def test_format_ratio(ratio, text):
    assert units.format_ratio(ratio) == text


@given(st.integers(0, 100_000))
def test_ratio_round_trip_of_parsed_percentages(milli_pct):
    """A loss parsed from 'N.NNN%' formats back to text that parses to the same float."""
    loss = units.parse_ratio(f"{milli_pct / 1000:g}%")
    assert loss == pytest.approx(milli_pct / 100_000, rel=1e-12, abs=1e-15)
    assert units.parse_ratio(units.format_ratio(loss)) == loss
