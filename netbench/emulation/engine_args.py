"""The delay engine's command line (engine.py): parsed and checked, errors as one line, exit 2."""

from __future__ import annotations

import argparse
import json
import os

from netbench.emulation import nfqueue
from netbench.emulation.delay_queue import DestParams, EngineParams, dest_params_from_dict

DEFAULT_SPIN_US = 100  # see DelayEngine's docstring: precision vs CPU


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports usage errors as a single stderr line, exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="netbench-engine",
                       description="NFQUEUE delay/jitter/loss engine for one namespace")
    p.add_argument("--queue-num", type=int, required=True, help="NFQUEUE number 0..65535")
    p.add_argument("--delay-us", type=int, default=None,
                   help="one-way delay, microseconds (required without --pairs-file; with it: the default)")
    p.add_argument("--jitter-us", type=int, default=0, help="uniform +/- jitter, microseconds")
    p.add_argument("--loss", type=float, default=0.0, help="drop probability, ratio 0..1")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--stats-file", default=None, help="JSON stats path, rewritten ~1/s")
    p.add_argument("--spin-us", type=int, default=DEFAULT_SPIN_US,
                   help="busy-poll this long before each release instead of sleeping, us")
    p.add_argument("--rt-priority", type=int, default=0,
                   help="SCHED_FIFO priority 1..99 (0: normal scheduling)")
    p.add_argument("--maxlen", type=int, default=nfqueue.DEFAULT_QUEUE_MAXLEN,
                   help="kernel queue max length, packets")
    p.add_argument("--control", default=None, help="unix datagram socket path for live changes")
    p.add_argument("--pairs-file", default=None,
                   help='per-destination table, JSON {"pairs": [{"dst", "delay_us", "jitter_us", "loss", "rate_bps"}]}')
    return p


def read_pairs_file(path: str) -> tuple[DestParams, ...]:
    """The table of a --pairs-file; ValueError (one line) when it is unreadable or wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--pairs-file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list) or not data["pairs"]:
        raise ValueError(f"--pairs-file {path}: want an object with a non-empty list \"pairs\"")
    try:
        return tuple(dest_params_from_dict(item) for item in data["pairs"])
    except ValueError as exc:
        raise ValueError(f"--pairs-file {path}: {exc}") from None


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, EngineParams]:
    """Parse and validate; exits 2 with one line on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.queue_num <= 0xFFFF:
        parser.error(f"--queue-num must be 0..65535, got {args.queue_num}")
    if args.spin_us < 0:
        parser.error(f"--spin-us must be >= 0, got {args.spin_us}")
    if not 0 <= args.rt_priority <= 99:
        parser.error(f"--rt-priority must be 0..99, got {args.rt_priority}")
    if args.maxlen < 1:
        parser.error(f"--maxlen must be >= 1, got {args.maxlen}")
    for flag, path in (("--stats-file", args.stats_file), ("--control", args.control)):
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        if parent and not os.path.isdir(parent):
            parser.error(f"{flag} directory does not exist: {parent}")
    if args.loss != args.loss:  # NaN
        parser.error("--loss must be a number in [0, 1]")
    if args.delay_us is None and args.pairs_file is None:
        parser.error("the following arguments are required: --delay-us (or --pairs-file)")
    try:
        pairs = read_pairs_file(args.pairs_file) if args.pairs_file else ()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        params = EngineParams(args.delay_us or 0, args.jitter_us, args.loss, args.seed, pairs)
    except ValueError as exc:
        parser.error(str(exc).replace("delay_us", "--delay-us")
                     .replace("jitter_us", "--jitter-us").replace("loss", "--loss"))
    return args, params
