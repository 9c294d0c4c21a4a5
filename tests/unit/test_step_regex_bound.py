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
    The reader gives the line up within a second; meanwhile another thread of the controller
    (a timeout's, a schedule's) keeps running; the next line is read as usual."""
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
    assert line == bar.encode()  # passed through: no step
    assert took < 1.0, took
    during = [t for t in ticks if began <= t <= began + took]
    assert len(during) >= int(took / 0.01 * 0.5), (len(during), took)  # the other thread was never frozen
    assert reader.matcher.given_up == 1
    assert reader.readline() == b"aaaa\n"  # a new matcher: the first match only starts the clock
    assert reader.readline() == b""
    assert reader.matcher._proc is None  # closed at the end of the stream


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
