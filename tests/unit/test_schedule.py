"""Schedules: loading, the one-line errors (file, step or row, key), ramps, repeat, traces,
at_step, and the shipped examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from netbench.errors import UsageError
from netbench.model.profile import Profile
from netbench.model.schedule import RAMP_STEP_S, load_schedule, timeline

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "profiles" / "schedules").glob("*.yaml"))


def write(tmp_path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path, *needles: str, file: Path | None = None) -> str:
    """The one-line error names `file` (default: the schedule), then each needle."""
    with pytest.raises(UsageError) as info:
        load_schedule(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{file or path}: "), message
    for needle in needles:
        assert needle in message, message
    assert info.value.hint
    return message


def test_steps_change_only_what_they_name(tmp_path):
    path = write(tmp_path, "name: spike\nprofile: {delay: 5ms, rate: 100mbit}\nsteps:\n"
                 "  - {at: 0s, delay: 5ms}\n  - {at: 2s, delay: 30ms}\n  - {at: 4s, loss: 1%}\n")
    schedule = load_schedule(path)
    entries = timeline(schedule)
    assert [e.at_s for e in entries] == [0.0, 2.0, 4.0]
    assert [e.step for e in entries] == [1, 2, 3]
    assert [e.profile.name for e in entries] == ["spike@0s", "spike@2s", "spike@4s"]
    last = entries[-1].profile
    assert (last.delay_us, last.rate_bps, last.loss) == (30_000, 100_000_000, 0.01)
    assert entries[1].changes == (("delay", "30ms"),)
    assert entries[2].changes == (("loss", "1%"),)
    assert not schedule.repeat and schedule.period_s == 4.0


def test_without_a_base_profile_the_link_as_it_is_is_the_start(tmp_path):
    schedule = load_schedule(write(tmp_path, "steps:\n  - {at: 1s, jitter: 2ms}\n"))
    entries = timeline(schedule, Profile(name="live", delay_us=10_000, rate_bps=50_000_000))
    assert (entries[0].profile.delay_us, entries[0].profile.jitter_us, entries[0].profile.rate_bps) == \
        (10_000, 2_000, 50_000_000)
    with pytest.raises(UsageError, match=r"s\.yaml: step 1: jitter: .*exceeds"):
        timeline(schedule, Profile(name="none"))  # no delay to jitter around


def test_a_ramp_moves_linearly_in_steps_of_the_documented_size(tmp_path):
    schedule = load_schedule(write(tmp_path, "profile: {delay: 10ms, rate: 100mbit}\nsteps:\n"
                                   "  - {at: 10s, delay: 50ms, rate: 200mbit, ramp: 5s}\n"))
    entries = timeline(schedule)
    count = round(5 / RAMP_STEP_S)
    assert len(entries) == count
    assert entries[0].at_s == pytest.approx(10 + RAMP_STEP_S)
    assert entries[-1].at_s == 15.0
    assert entries[-1].profile.delay_us == 50_000 and entries[-1].profile.rate_bps == 200_000_000
    assert entries[count // 2 - 1].profile.delay_us == 30_000  # halfway
    delays = [e.profile.delay_us for e in entries]
    assert delays == sorted(delays) and all(isinstance(d, int) for d in delays)
    assert schedule.period_s == 15.0


def test_a_ramp_from_unlimited_rate_is_refused(tmp_path):
    schedule = load_schedule(write(tmp_path, "steps:\n  - {at: 0s, rate: 10mbit, ramp: 1s}\n"))
    with pytest.raises(UsageError, match=r"s\.yaml: step 1: rate: cannot ramp from unlimited"):
        timeline(schedule, Profile(name="none"))


def test_repeat_and_period(tmp_path):
    schedule = load_schedule(write(tmp_path, "repeat: true\nsteps:\n  - {at: 0s, delay: 5ms}\n"
                                   "  - {at: 2s, delay: 30ms, ramp: 1s}\n"))
    assert schedule.repeat and schedule.period_s == 3.0
    schedule = load_schedule(write(tmp_path, "repeat: true\nperiod: 10s\nsteps:\n  - {at: 0s, delay: 5ms}\n"))
    assert schedule.period_s == 10.0


def test_a_flap_is_full_loss_then_none(tmp_path):
    schedule = load_schedule(write(tmp_path, "profile: {delay: 5ms}\nsteps:\n  - {at: 20s, loss: 100%}\n"
                                   "  - {at: 21s, loss: 0%}\n"))
    assert [e.profile.loss for e in timeline(schedule)] == [1.0, 0.0]


def test_a_trace_csv_gives_one_step_per_row(tmp_path):
    write(tmp_path, "time_s,delay_ms,rate_mbit,loss_pct\n0,5,100,0\n1.5,12.5,,0.5\n3,20,50,\n", "link.csv")
    schedule = load_schedule(write(tmp_path, "profile: {delay: 1ms}\ntrace: link.csv\n"))
    entries = timeline(schedule)
    assert [e.at_s for e in entries] == [0.0, 1.5, 3.0]
    assert [e.step for e in entries] == [2, 3, 4]  # the file's row numbers
    assert [(e.profile.delay_us, e.profile.rate_bps, e.profile.loss) for e in entries] == [
        (5000, 100_000_000, 0.0), (12_500, 100_000_000, 0.005), (20_000, 50_000_000, 0.005)]


def test_a_traces_measured_delay_keeps_whole_microseconds(tmp_path):
    """A delay cell's part of a microsecond is a measurement's precision, rounded (a step's
    "0.4us", written by hand, is refused instead: units.parse_duration_us)."""
    write(tmp_path, "time_s,delay_ms\n0,12.3456789\n1,0.0004\n", "link.csv")
    entries = timeline(load_schedule(write(tmp_path, "profile: {delay: 1ms}\ntrace: link.csv\n")))
    assert [e.profile.delay_us for e in entries] == [12_346, 0]


def test_at_step_schedules_with_a_ramp_over_training_steps(tmp_path):
    schedule = load_schedule(write(tmp_path, "profile: {delay: 10ms}\nsteps:\n  - {at_step: 500, delay: 50ms}\n"
                                   "  - {at_step: 1000, delay: 10ms, ramp: 4}\n"))
    entries = timeline(schedule)
    assert schedule.by_step and schedule.period_s is None
    assert [e.at_step for e in entries] == [500, 1001, 1002, 1003, 1004]
    assert all(e.at_s is None for e in entries)
    assert [e.profile.delay_us for e in entries] == [50_000, 40_000, 30_000, 20_000, 10_000]
    assert entries[0].profile.name == "s@step500"


@pytest.mark.parametrize("steps, needles", [
    ("  - {at: 2s, delay: 5ms}\n  - {at: 1s, delay: 6ms}\n", ("step 2", "at", "not after")),
    ("  - {at: 0s, delya: 5ms}\n", ("step 1", "delya", "unknown key")),
    ("  - {at: -1s, delay: 5ms}\n", ("step 1", "at", "negative")),
    ("  - {at: 0s, distribution: normal, ramp: 1s}\n", ("step 1", "distribution", "numeric")),
    ("  - {at: 0s, at_step: 3, delay: 5ms}\n", ("step 1", "at_step", "not both")),
    ("  - {at: 0s, delay: 5ms}\n  - {at_step: 3, delay: 6ms}\n", ("step 2", "at_step", "either")),
    ("  - {at: 0s, delay: 5xs}\n", ("step 1", "delay", "unit")),
    ("  - {at: 0s, delay: 5ms, ramp: 3s}\n  - {at: 2s, delay: 6ms}\n", ("step 2", "at", "ramp")),
    ("  - {delay: 5ms}\n", ("step 1", "at", "missing")),
    ("  - {at: 0s, loss: 200%}\n", ("step 1", "loss", "100%")),
])
def test_bad_steps_are_one_line_naming_file_step_and_key(tmp_path, steps, needles):
    refused(write(tmp_path, "steps:\n" + steps), *needles)


def test_bad_combinations_with_the_base_are_refused_at_load(tmp_path):
    refused(write(tmp_path, "profile: {delay: 5ms}\nsteps:\n  - {at: 0s, jitter: 6ms}\n"), "step 1", "jitter")


def test_bad_top_level_keys(tmp_path):
    refused(write(tmp_path, "stpes: []\n"), "stpes", "unknown key")
    refused(write(tmp_path, "period: 5s\nsteps:\n  - {at: 0s, delay: 1ms}\n"), "period", "repeat")
    refused(write(tmp_path, "repeat: true\nperiod: 1s\nsteps:\n  - {at: 2s, delay: 1ms}\n"), "period", "shorter")
    refused(write(tmp_path, "repeat: true\nsteps:\n  - {at: 0s, delay: 1ms}\n"), "period", "above 0")


@pytest.mark.parametrize("csv, needles", [
    ("time_s,delay_ms\n0,5\n1,abc\n", ("row 3", "delay_ms", "not a number")),
    ("time_s,delay_ms\n0,5\n-1,6\n", ("row 3", "time_s")),
    ("time_s,delay_ms\n2,5\n1,6\n", ("row 3", "time_s", "not after")),
    ("time_s,latency\n0,5\n", ("row 1", "latency", "unknown column")),
    ("delay_ms\n5\n", ("row 1", "time_s")),
    ("time_s,delay_ms\n0,5,7\n", ("row 2", "cells")),
    ("time_s,loss_pct\n0,150\n", ("row 2", "loss", "100%")),
    ("time_s,delay_ms\n0,5\n1," + "9" * 140_000 + "\n", ("row 3", "not CSV", "field larger than field limit")),
    ('time_s,delay_ms\n0,5\n1,"' + "x" * 140_000 + '"\n', ("row 3", "not CSV")),
    ("time_s,delay_ms\n0,5\n1,\x006\n", ("row 3", "delay_ms")),
])
def test_bad_trace_rows_name_the_trace_file_row_and_column(tmp_path, csv, needles):
    trace = write(tmp_path, csv, "link.csv")
    refused(write(tmp_path, "trace: link.csv\n"), *needles, file=trace)


def test_a_bad_value_in_a_trace_names_the_row(tmp_path):
    trace = write(tmp_path, "time_s,delay_ms\n0,20000\n", "link.csv")
    refused(write(tmp_path, "trace: link.csv\n"), "row 2", "delay", "absurd", file=trace)


def test_a_bad_combination_in_a_trace_names_the_row_at_timeline(tmp_path):
    trace = write(tmp_path, "time_s,delay_ms\n0,5\n1,0\n", "link.csv")
    schedule = load_schedule(write(tmp_path, "trace: link.csv\n"))  # no base profile: checked at timeline
    with pytest.raises(UsageError) as info:
        timeline(schedule, Profile(name="live", delay_us=5000, jitter_us=2000))
    assert str(info.value).startswith(f"{trace}: row 3: jitter: "), str(info.value)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_schedules_load(path):
    schedule = load_schedule(path)
    assert timeline(schedule, Profile(name="none"))


def test_schedules_are_shipped():
    assert len(SHIPPED) >= 2


def test_due_is_the_last_entry_already_due_from_the_one_being_made():
    from netbench.model.schedule import TimedProfile, due

    timed = tuple(TimedProfile(at_s=at, at_step=None, profile=Profile(name=str(at)), step=i + 1)
                  for i, at in enumerate((0.0, 0.1, 0.2, 0.3, 1.0)))
    assert due(timed, 0, 0.0) == 0  # on time: itself
    assert due(timed, 1, 0.25) == 2  # 0.2 is due too: 0.1 merges into it
    assert due(timed, 1, 0.3) == 3  # a time equal to an entry's is due
    assert due(timed, 3, 99.0) == 4 and due(timed, 4, 99.0) == 4  # never past the end
    assert due(timed, 0, 5.15, offset=5.0) == 1  # a repeating schedule's later loop
    stepped = tuple(TimedProfile(at_s=None, at_step=s, profile=Profile(name=str(s)), step=i + 1)
                    for i, s in enumerate((0, 5, 10)))
    assert due(stepped, 0, 7) == 1 and due(stepped, 1, 30, offset=20) == 2 and due(stepped, 1, 20, offset=20) == 1
