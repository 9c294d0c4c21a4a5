"""Per-node exchange-protocol benchmark process (``python -m netbench.jobs.exchange_bench``).

The exchange calibration of a sweep (netbench.experiment.exchange_calibration) starts one on
each of two worker nodes, as the collective benchmark's are started: TF_CONFIG names the
cluster and this process's place in it. Worker 0 answers (a harness.peers Listener on its
node's address, replying to each request with a frame of the same arrays, as a parameter
server replies to a push with the weights); worker 1 times request-reply transfers of each
size, `size` bytes each way in the exchange protocol's frames (netbench.jobs.exchange), over
one TCP connection between the two nodes' addresses, as the exchange strategies' messages go.

Events, one JSON object per stdout line (netbench.jobs.events' wire format):

    {"event": "exchange", "bytes": 65536, "times": [...]}      (worker 1, per size)
    {"event": "tcp_limits", "tcp_rmem": [...], "tcp_wmem": [...], "tcp_adv_win_scale": 1}

(the socket buffer limits of this node's namespace, the TCP window's ceiling) then ``done``.
It imports no TensorFlow: it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO

import numpy as np

from netbench.jobs import exchange
from netbench.jobs.harness.emit import bench_main, emit, emit_timings, tf_config_workers, time_calls
from netbench.jobs.harness.peers import Channel, Listener, run_limits, run_token

EVENT = "exchange"
LIMITS_EVENT = "tcp_limits"
ECHO = "echo"
SYSCTLS = ("tcp_rmem", "tcp_wmem", "tcp_adv_win_scale")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="netbench.jobs.exchange_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", required=True, help="Bytes each way per request, comma-separated.")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed requests per size.")
    parser.add_argument("--reps", type=int, default=5, help="Timed requests per size.")
    parser.add_argument("--timeout", type=float, default=30.0, help="Seconds the whole exchange may take.")
    return parser



def tcp_limits(root: Path = Path("/proc/sys/net/ipv4")) -> dict[str, list[int] | int]:
    """This namespace's TCP buffer sysctls (those readable): tcp_rmem and tcp_wmem as
    [min, default, max], tcp_adv_win_scale as an int."""
    out: dict[str, list[int] | int] = {}
    for name in SYSCTLS:
        try:
            values = [int(v) for v in (root / name).read_text().split()]
        except (OSError, ValueError):
            continue
        out[name] = values if len(values) > 1 else values[0]
    return out


def payload(size: int) -> tuple[np.ndarray, ...]:
    """`size` bytes as one float32 array (rounded down to whole floats, at least one)."""
    return (np.ones(max(1, size // 4), dtype=np.float32),)


def cap(sizes: list[int]) -> exchange.FrameCap:
    """The largest frame an echo of these sizes carries (one array: payload's)."""
    return exchange.FrameCap.of(payload(max(sizes, default=4)))


def _answer(stream: IO[str], address: str, sizes: list[int], timeout: float) -> None:
    done = threading.Event()

    def handle(message: exchange.Message) -> exchange.Message | None:
        if message.op == exchange.HELLO:
            return None
        if message.op == exchange.BYE:
            done.set()
            return exchange.Message(exchange.REPLY, {})
        return exchange.Message(exchange.REPLY, {}, message.arrays)

    host, port = address.rsplit(":", 1)
    listener = Listener(host, int(port), handle, run_token(), cap=cap(sizes), limits=run_limits())
    try:
        if not done.wait(timeout):
            raise TimeoutError(f"no bye from the timing peer in {timeout:g}s")
    finally:
        listener.close()


def _time(stream: IO[str], address: str, sizes: list[int], warmup: int, reps: int, timeout: float) -> int:
    channel = Channel.connect(address, timeout, run_limits())
    channel.cap = cap(sizes)
    sent = 0
    try:
        channel.send(exchange.Message(exchange.HELLO, {"worker": 1, "token": run_token()}))
        for size in sizes:
            request = exchange.Message(ECHO, {}, payload(size))
            times = time_calls(lambda: channel.request(request), warmup, reps)
            emit_timings({"event": EVENT, "bytes": request.payload_bytes}, times, sent, stream)
            sent += 1
        channel.request(exchange.Message(exchange.BYE, {}))
    finally:
        channel.close()
    return sent


def run(args: argparse.Namespace, stream: IO[str]) -> int:
    """Answer (worker 0) or time every size (worker 1); returns the step events sent."""
    addresses, index = tf_config_workers()
    if len(addresses) < 2:
        raise SystemExit("exchange_bench needs two workers in TF_CONFIG's cluster")
    emit({"event": "start", "task_index": index, "num_workers": len(addresses), "pid": os.getpid(),
          "time": time.time(), "tf_version": "", "model": "exchange", "strategy": "exchange"}, stream)
    emit({"event": LIMITS_EVENT, **tcp_limits()}, stream)
    sent = 0
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if index == 0:
        _answer(stream, addresses[0], sizes, args.timeout)
    elif index == 1:
        sent = _time(stream, addresses[0], sizes, args.warmup, args.reps, args.timeout)
    return sent


def main(argv: list[str] | None = None) -> int:
    return bench_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
