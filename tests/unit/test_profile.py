"""netbench.model.profile: loading, validation, flags, levels, and the YAML round trip."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hypothesis import given

from netbench import units
from netbench.errors import ProfileError, UsageError
from tests.strategies import valid_profiles
from netbench.model.profile import (Profile, load_profile, parse_levels, profile_from_flags,
                              profile_from_mapping)


def write(tmp_path, text: str, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- loading good files


def test_load_profile_normalises_units(tmp_path):
    path = write(tmp_path, "name: wan\ndescription: a wan\ndelay: 10ms\njitter: 1ms\nloss: 0.5%\nrate: 250mbit\n")
    p = load_profile(path)
    assert p == Profile(name="wan", description="a wan", delay_us=10_000, jitter_us=1_000, loss=0.005,
                        rate_bps=250_000_000)
    assert (p.delay_ms, p.jitter_ms, p.rate_mbit) == (10.0, 1.0, 250.0)
    assert p.loss_pct == pytest.approx(0.5)


def test_load_profile_defaults_name_to_stem_and_rate_to_unlimited(tmp_path):
    p = load_profile(write(tmp_path, "delay: 5ms\n", name="slowlink.yaml"))
    assert p.name == "slowlink"
    assert p.rate_bps is None and p.rate_mbit is None
    assert (p.jitter_us, p.loss) == (0, 0.0)


def test_load_profile_accepts_str_path(tmp_path):
    assert load_profile(str(write(tmp_path, "delay: 1s\n"))).delay_us == 1_000_000


def test_name_is_stripped(tmp_path):
    assert load_profile(write(tmp_path, "name: '  lan  '\ndelay: 1ms\n")).name == "lan"


def test_is_null():
    assert Profile().is_null
    for field, value in (("delay_us", 1), ("jitter_us", 1), ("loss", 0.01), ("rate_bps", 8000)):
        assert not dataclasses.replace(Profile(), **{field: value}).is_null, field


def test_label_and_record():
    p = Profile(name="x", delay_us=10_000, jitter_us=2_000, loss=0.01, rate_bps=250_000_000)
    assert p.label() == "10ms±2ms/250mbit/1%"
    assert Profile(delay_us=1_000).label() == "1ms/unlimited/0%"
    record = p.to_record()
    assert {k: record[k] for k in ("name", "delay_us", "jitter_us", "loss", "rate_bps", "description")} == {
        "name": "x", "delay_us": 10_000, "jitter_us": 2_000, "loss": 0.01, "rate_bps": 250_000_000, "description": ""}
    assert record["distribution"] == "uniform" and record["direction"] == "egress" and record["peers"] == ()


# ---------------------------------------------------------------- bad files

BAD_VALUES = [
    # (yaml text, key the message must name, fragment of the message)
    ("delay: -5ms\n", "delay", "negative"),
    ("delay: 20s\n", "delay", "absurd"),
    ("loss: 120%\n", "loss", "over 100%"),
    ("loss: 2\n", "loss", "ambiguous"),
    ("delay: 10xs\n", "delay", "unknown duration unit"),
    ("delay: 10\n", "delay", "needs a unit"),
    ("delay: '10'\n", "delay", "needs a unit"),
    ("rate: 0mbit\n", "rate", "positive"),
    ("rate: 1kbit\n", "rate", "below 8kbit"),
    ("rate: 200gbit\n", "rate", "over 100gbit"),
    ("rate: 250\n", "rate", "needs a unit"),
    ("delay: 1ms\njitter: 2ms\n", "jitter", "exceeds delay"),
    ("jitter: 1ms\n", "jitter", "exceeds delay"),
    ("delay: 5s\njitter: 2148ms\n", "jitter", "more than netem can hold (2147.483ms)"),
    ("name: ''\ndelay: 1ms\n", "name", "non-empty"),
    ("name: 5\ndelay: 1ms\n", "name", "non-empty"),
    ("description: [a]\n", "description", "string"),
    ("delay: null\n", "delay", "expected a duration"),
    ("loss: yes\n", "loss", "expected a percentage"),
]


def assert_one_line_error(path, prefix: str, fragment: str) -> ProfileError:
    """Loading `path` fails with a one-line ProfileError that starts with `prefix`."""
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert message.startswith(prefix), message
    assert fragment in message
    assert "\n" not in message
    return info.value


@pytest.mark.parametrize("text, key, fragment", BAD_VALUES)
def test_bad_value_names_source_and_key(tmp_path, text, key, fragment):
    path = write(tmp_path, text)
    error = assert_one_line_error(path, f"{path}: {key}: ", fragment)
    assert error.exit_code == 2


def test_bad_value_has_hint(tmp_path):
    with pytest.raises(ProfileError) as info:
        load_profile(write(tmp_path, "delay: 10xs\n"))
    assert "delay" in info.value.hint


def test_misspelled_key_suggests_the_right_one(tmp_path):
    path = write(tmp_path, "dealy: 10ms\n")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(info.value) == f"{path}: dealy: unknown key"
    assert info.value.hint == "did you mean 'delay'?"


def test_unrelated_unknown_key_lists_known_keys(tmp_path):
    with pytest.raises(ProfileError) as info:
        load_profile(write(tmp_path, "colour: blue\n"))
    assert "colour: unknown key" in str(info.value)
    for key in ("delay", "jitter", "loss", "rate"):
        assert key in info.value.hint


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("# only a comment\n", "empty"),
    ("delay: [10ms\n", "broken YAML"),
    ("delay: 10ms\n  rate: : 1\n", "broken YAML"),
    ("- delay: 10ms\n", "must be a mapping"),
    ("just a string\n", "must be a mapping"),
])
def test_bad_document_names_source(tmp_path, text, fragment):
    path = write(tmp_path, text)
    assert_one_line_error(path, f"{path}: ", fragment)


def test_broken_yaml_says_which_line(tmp_path):
    with pytest.raises(ProfileError, match=r"broken YAML at line 3: mapping values are not allowed"):
        load_profile(write(tmp_path, "delay: 10ms\nrate: 1\n  loss: 2\n"))


def test_list_names_the_type(tmp_path):
    with pytest.raises(ProfileError, match="got list"):
        load_profile(write(tmp_path, "- 1\n- 2\n"))


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ProfileError, match="no such profile file") as info:
        load_profile(path)
    assert str(path) in str(info.value)


def test_undecodable_file(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"delay: \xff\xfe10ms\n")
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(path)


def test_profile_error_is_a_usage_error():
    assert issubclass(ProfileError, UsageError)


def test_from_mapping_uses_source_in_messages():
    with pytest.raises(ProfileError, match=r"^my-source: loss: "):
        profile_from_mapping({"loss": "120%"}, "my-source")


# ---------------------------------------------------------------- flags


def test_flags_build_a_profile_named_by_its_label():
    p = profile_from_flags(latency="10ms", jitter="1ms", bandwidth="250mbit", loss="1%")
    assert (p.delay_us, p.jitter_us, p.rate_bps, p.loss) == (10_000, 1_000, 250_000_000, 0.01)
    assert p.name == p.label() == "10ms±1ms/250mbit/1%"


def test_flags_override_a_base_and_keep_its_name():
    base = Profile(name="wan", delay_us=10_000, jitter_us=1_000, rate_bps=250_000_000)
    p = profile_from_flags(base, latency="20ms", jitter=None, bandwidth=None, loss="1%")
    assert p == dataclasses.replace(base, delay_us=20_000, loss=0.01)


def test_no_flags_returns_the_base():
    base = Profile(name="wan", delay_us=10_000)
    assert profile_from_flags(base, latency=None, loss=None) == base


@pytest.mark.parametrize("flags, flag, fragment", [
    ({"latency": "10xs"}, "--latency", "unknown duration unit 'xs'"),
    ({"latency": "20s"}, "--latency", "absurd"),
    ({"latency": "10"}, "--latency", "needs a unit"),
    ({"bandwidth": "0mbit"}, "--bandwidth", "positive"),
    ({"loss": "120%"}, "--loss", "over 100%"),
    ({"latency": "1ms", "jitter": "5ms"}, "--jitter", "exceeds delay"),
])
def test_bad_flags_name_the_flag(flags, flag, fragment):
    with pytest.raises(ProfileError) as info:
        profile_from_flags(**flags)
    assert str(info.value).startswith(f"flag {flag}: ")
    assert fragment in str(info.value)


# ---------------------------------------------------------------- levels


@pytest.mark.parametrize("text, parse, expected", [
    ("1,10,100ms", units.parse_duration_us, [1_000, 10_000, 100_000]),
    ("1ms, 10ms ,100ms", units.parse_duration_us, [1_000, 10_000, 100_000]),
    ("500us,1ms", units.parse_duration_us, [500, 1_000]),
    ("5ms", units.parse_duration_us, [5_000]),
    ("250,500,1000mbit", units.parse_rate_bps, [250_000_000, 500_000_000, 1_000_000_000]),
    ("0,1,10%", units.parse_ratio, [0.0, 0.01, 0.1]),
    ("0.5,1.5ms", units.parse_duration_us, [500, 1_500]),
])
def test_parse_levels(text, parse, expected):
    assert parse_levels(text, "--x", parse) == expected


@pytest.mark.parametrize("text, fragment", [
    ("1ms,,2ms", "empty level"),
    ("", "empty level"),
    ("1ms,", "empty level"),
    ("1,1ms", "repeated level"),
    ("1ms,1000us", "repeated level"),
    ("1,abc", "needs a unit"),
    ("1,10xs", "unknown duration unit"),
])
def test_parse_levels_rejects(text, fragment):
    with pytest.raises(ProfileError) as info:
        parse_levels(text, "--latency", units.parse_duration_us)
    assert str(info.value).startswith("flag --latency: ")
    assert fragment in str(info.value)


def test_parse_levels_repeated_hint_mentions_repeat():
    with pytest.raises(ProfileError) as info:
        parse_levels("1,1ms", "--latency", units.parse_duration_us)
    assert "--repeat" in info.value.hint


# ---------------------------------------------------------------- round trip

@given(valid_profiles())
def test_yaml_dict_round_trip(profile):
    text = yaml.safe_dump(profile.to_yaml_dict())
    assert profile_from_mapping(yaml.safe_load(text), "gen.yaml") == profile


@pytest.mark.parametrize("profile", [
    Profile(name="d", delay_us=1_234_567),
    Profile(name="r", rate_bps=123_456_789),
    Profile(name="l", loss=0.123456789),
], ids=["delay", "rate", "loss"])
def test_yaml_dict_round_trip_beyond_six_digits(profile):
    assert profile_from_mapping(profile.to_yaml_dict(), "gen.yaml") == profile


# ---------------------------------------------------------------- numbers beyond what the kernel holds


def test_reorder_gap_beyond_32_bits_is_refused(tmp_path):
    # netem's gap is a u32: a larger one passed load and failed in the middle of an apply
    path = write(tmp_path, "delay: 10ms\nreorder: 25%\nreorder_gap: 4294967296\n")
    error = assert_one_line_error(path, f"{path}: reorder_gap: ", "0..4294967295")
    assert error.hint


def test_reorder_gap_at_32_bits_is_accepted(tmp_path):
    path = write(tmp_path, "delay: 10ms\nreorder: 25%\nreorder_gap: 4294967295\n")
    assert load_profile(path).reorder_gap == 2**32 - 1


def test_huge_integer_delay_is_a_profile_error(tmp_path):
    path = write(tmp_path, "delay: " + "9" * 30 + "\n")
    assert_one_line_error(path, f"{path}: delay: ", "not a usable number")


@pytest.mark.parametrize("peer", ["n2\n", "n12\n"])
def test_a_peer_with_a_trailing_newline_is_refused(peer):
    # '$' matches before a final newline: 'n2\n' passed as a node name
    with pytest.raises(ProfileError, match="src: peers: "):
        profile_from_mapping({"delay": "1ms", "peers": [peer]}, "src")
