"""A `--step-regex` never freezes the controller (jobs/line_match.py, jobs/user.py RegexSteps):
the pattern sees the last 4 KiB of a line and runs in a process of its own, a line it takes
longer than MATCH_TIMEOUT_S over being no step. No root: a real matcher process."""

from __future__ import annotations

import io
import json
import threading
import time

from netbench.jobs import line_match, user

REGEX = r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms"


def test_a_backtracking_pattern_on_a_long_line_gives_up_within_a_second_and_the_controller_keeps_running():
    """`(a+)+$` against a progress bar of a's that ends in something else backtracks for ever.
    The reader gives the line up within a second and says so in an event of its own;
    meanwhile another thread of the controller (a timeout's, a schedule's) keeps running; the
    next line is read as usual."""
    bar = "a" * 200_000 + "!\n"
    stream = io.BytesIO(bar.encode() + b"aaaa\n")
    reader = user.RegexSteps(stream, r"(?P<x>a+)+$", images=8, warmup=0)
    ticks: list[float] = []
    reading = threading.Event()

    def ticker() -> None:
        while not reading.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    reader.matcher.search("warm")  # the matcher process is up (its start is not the point here)
    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    began = time.monotonic()
    line = reader.readline()
    took = time.monotonic() - began
    reading.set()
    thread.join()
    assert json.loads(line)["event"] == user.GIVEN_UP_EVENT  # no step, and said
    assert took < 1.0, took
    during = [t for t in ticks if began <= t <= began + took]
    assert len(during) >= int(took / 0.01 * 0.5), (len(during), took)  # the other thread was never frozen
    assert reader.matcher.given_up == 1
    assert reader.readline() == b"aaaa\n"  # a new matcher: the first match only starts the clock
    assert reader.readline() == b""
    assert reader.matcher._proc is None  # closed at the end of the stream


def test_no_step_is_timed_across_a_line_given_up_and_the_record_counts_it():
    """tick, a line the pattern takes too long over, tick, tick: the tick after the drop only
    starts the clock again (it used to be a step spanning the drop: two steps as one); the run
    record's step_regex_given_up counts the line."""
    from netbench.jobs import events as ev
    from netbench.jobs.user_results import origin
    from netbench.model.command_job import UserCommand
    from netbench.model.job import JobSpec, command_spec

    times = iter([10.0, 11.0, 12.0, 13.5])
    stream = io.BytesIO(b"tick\n" + b"a" * 100_000 + b"!\ntick\ntick\n")
    reader = user.RegexSteps(stream, r"(a+)+$|tick", images=8, warmup=0, clock=lambda: next(times))
    reader.matcher.search("warm")
    lines = list(iter(reader.readline, b""))
    events = [ev.parse_line(line) for line in lines]
    assert [type(e).__name__ if e is not None else None for e in events] == [None, "Other", None, "Step"], lines
    assert events[3].duration == 1.5 and events[3].end == 13.5  # the third tick to the fourth: no 2 s step across
    job = command_spec(JobSpec(), UserCommand(("sh",), 8, step_regex="tick"), 2)
    assert origin(events[1:2] + events[3:], job)["step_regex_given_up"] == 1
    assert origin(events[3:], job)["step_regex_given_up"] == 0


def test_a_line_is_read_when_it_comes_not_after_the_answers_before_it():
    """Every line used to be a round trip to the matcher, read only once the line before it was
    answered: a line behind one the pattern takes half a second over was timed half a second
    late. Lines now stream to the matcher as the rank prints them; each is timed when read."""
    stream = io.BytesIO(b"a" * 100_000 + b"!\nstep 1 took 3 ms\n")
    reader = user.RegexSteps(stream, r"(a+)+$|step (?P<step>\d+) took (?P<ms>[\d.]+) ms", images=8, warmup=0)
    reader.matcher.search("warm")
    began = time.monotonic()
    assert json.loads(reader.readline())["event"] == user.GIVEN_UP_EVENT
    step = json.loads(reader.readline())
    assert time.monotonic() - began >= line_match.MATCH_TIMEOUT_S  # the first line was given up...
    assert step["end"] - began < 0.25, step["end"] - began  # ...while the second had already been read
    reader.readline()


def test_lines_are_put_without_waiting_for_the_matcher():
    matcher = line_match.LineMatcher(r"(a+)+$")
    try:
        matcher.search("warm")  # the process is up (a new one's first line may take its start-up too)
        matcher.put("a" * 100_000 + "!")  # the matcher is stuck on this one
        began = time.monotonic()
        for i in range(200):
            matcher.put(f"line {i}")
        assert time.monotonic() - began < line_match.MATCH_TIMEOUT_S / 2
        assert matcher.take() is line_match.GIVEN_UP
        assert [matcher.take() for _ in range(200)] == [None] * 200  # sent again to a new matcher, in order
    finally:
        matcher.close()


def test_the_pattern_sees_the_last_4_kib_of_a_line():
    reader = user.RegexSteps(io.BytesIO(), REGEX, images=8, warmup=0)
    try:
        padding = "=" * (line_match.MAX_LINE_CHARS + 10)
        event = reader.step_of(padding + "step 7 took 2.5 ms", 100.0)  # its end is seen
        assert event is not None and (event["step"], event["duration"]) == (7, 0.0025)
        assert reader.step_of("step 8 took 2.5 ms" + padding, 101.0) is None  # its start is not
        assert line_match.bounded("x" * 10_000) == "x" * line_match.MAX_LINE_CHARS
    finally:
        reader.matcher.close()


def test_steps_read_through_the_matcher_are_the_lines_events():
    lines = b"epoch 1\nstep 0 took 3.0 ms\nnoise\nstep 1 took 4.0 ms\n"
    reader = user.RegexSteps(io.BytesIO(lines), REGEX, images=64, warmup=1, clock=lambda: 50.0)
    out = [reader.readline() for _ in range(5)]
    assert out[0] == b"epoch 1\n" and out[2] == b"noise\n" and out[4] == b""
    first, second = json.loads(out[1]), json.loads(out[3])
    assert (first["step"], first["phase"], second["step"], second["phase"]) == (0, "warmup", 1, "measured")
    assert second["duration"] == 0.004 and second["images"] == 64
