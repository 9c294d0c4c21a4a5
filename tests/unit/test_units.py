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


@pytest.mark.parametrize("text, fragment", [
    ("0.4us", "write 0 or 1us"), ("2.5us", "write 2us or 3us"), ("0.0004ms", "is 0.4us"),
    ("1.0000005s", "1000000.5us"), ("1e-7s", "is 0.1us"),
])
def test_a_part_of_a_microsecond_is_refused_never_rounded_away(text, fragment):
    """0.4us was 0 and 2.5us 2 (round half to even): a duration is whole microseconds."""
    with pytest.raises(ValueError, match=fragment):
        units.parse_duration_us(text)
    assert units.parse_duration_us("1.5ms") == 1500 and units.parse_duration_us("1.000001s") == 1_000_001


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
    ("1.5gbit", 1_500_000_000), ("100Mbit/s", 100_000_000), ("1gbit/s", 10**9), ("10bit/s", 10),
    ("250Mbit", 250_000_000), ("0mbit", 0),
])
def test_parse_rate(text, expected):
    assert units.parse_rate_bps(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("250", "needs a unit"), (250, "needs a unit"), ("250mbyte", "unknown rate unit 'mbyte'"),
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
    ("1%", 0.01), ("0.5%", 0.005), ("100%", 1.0), ("0%", 0.0), ("0", 0.0), (0, 0.0), (0.0, 0.0),
    (" 10 % ", 0.1), ("1e-3%", 1e-5),
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


# ---------------------------------------------------------------- spellings two conventions read differently


@pytest.mark.parametrize("text, readings", [
    ("0.5", ("0.5%", "50%")), (0.5, ("0.5%", "50%")), ("1", ("1%", "100%")), ("0.01", ("0.01%", "1%")),
    (0.25, ("0.25%", "25%")), ("10", ("10%",)), (10, ("10%",)),
])
def test_bare_ratio_is_refused_with_both_readings(text, readings):
    """tc reads `loss 0.5` as 0.5 %; a fraction reads it as 50 %: neither is guessed."""
    with pytest.raises(ValueError, match="ambiguous") as caught:
        units.parse_ratio(text)
    message = str(caught.value)
    assert all(reading in message for reading in readings) and "\n" not in message


@pytest.mark.parametrize("text, bits, bytes_", [
    ("100mbps", "100mbit", "800mbit"), ("100Mbps", "100mbit", "800mbit"), ("100MBps", "100mbit", "800mbit"),
    ("1gbps", "1gbit", "8gbit"), ("64kbps", "64kbit", "512kbit"), ("100bps", "100bit", "800bit"),
    ("100MB/s", "100mbit", "800mbit"), ("100mb/s", "100mbit", "800mbit"), ("250mb", "250mbit", "2gbit"),
    ("1.5gbps", "1.5gbit", "12gbit"),
])
def test_byte_rate_spellings_are_refused_with_both_readings(text, bits, bytes_):
    with pytest.raises(ValueError, match="ambiguous") as caught:
        units.parse_rate_bps(text)
    assert f"write {bits} or {bytes_}" in str(caught.value)


def test_bare_duration_names_both_readings():
    with pytest.raises(ValueError, match="write 10us, 10ms or 10s"):
        units.parse_duration_us("10")


@pytest.mark.parametrize("text, expected", [
    ("90", 90.0), (90, 90.0), ("0.5", 0.5), ("90s", 90.0), ("500ms", 0.5), ("2min", 120.0), ("1h", 3600.0),
    ("0", 0.0),
])
def test_parse_seconds_takes_bare_seconds_and_units(text, expected):
    assert units.parse_seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "10 parsecs", "", "1e400", float("nan"), True])
def test_parse_seconds_refuses(text):
    with pytest.raises(ValueError):
        units.parse_seconds(text)


@pytest.mark.parametrize("text, expected", [("8", 8), ("8B", 8), ("64KiB", 65536), ("1MiB", 2**20), ("1GiB", 2**30),
                                            (4096, 4096)])
def test_parse_size(text, expected):
    assert units.parse_size_bytes(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("1MB", "write 1MiB or 1000000"), ("1m", "write 1MiB or 1000000"), ("64KB", "write 64KiB or 64000"),
    ("2GiB", "over 1GiB"), ("0", "at least 1 byte"), ("-8", "not a size"), ("8.5KiB", "not a size"),
    ("1e9", "not a size"), ("99999999999999999999", "not a size"), ("8 furlongs", "not a size"),
    ("8b", "write 8B or 8"), ("64kib", "write 64KiB"), ("1Mib", "write 1MiB"),  # b: a bit, as in rates
])
def test_parse_size_refuses(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        units.parse_size_bytes(text)


@given(st.floats(0, 1))
def test_any_ratio_formats_to_a_percentage_that_parses_back(ratio):
    text = units.format_ratio(ratio)
    assert text.endswith("%") and units.parse_ratio(text) == ratio
