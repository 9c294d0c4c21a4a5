#!/usr/bin/env python3
"""TCP's state across an in-place change: why a launch's points only narrow.

A launch keeps the job's TCP connections through every point, and a connection keeps its
congestion state through a change: its ssthresh, and cubic's HyStart, which ends slow start
once the round trip rises a few ms over the shortest it has seen (the kernel forgets that
minimum only after a retransmission timeout). This measures the effect without TensorFlow,
in seconds: on a 2-node embedded testbed a connection from n1 to n2 sends "steps" back to
back (a burst of --bytes, answered by one byte: an all-reduce's chunk and its reply), each
timed. For each case BEFORE -> AFTER:

- fresh: a new connection on AFTER (what ``--isolate`` measures);
- carried: one connection, --steps steps on BEFORE, AFTER applied in place with
  ``netbench apply`` while the steps go on, then the settle of a launch (3 steps and 1.5 s
  after the change) and --steps measured steps.

It reports each one's mean step, carried/fresh, both connections' ssthresh and cwnd at the end
(TCP_INFO, in segments; 2147483647: still in its first slow start), and what set the carried
connection's ssthresh, on BEFORE and after the change: the sender namespace's TcpExt counters
for HyStart's exits (ACK train, delay), loss recoveries and timeouts. "unshaped" is no shaping at all.

Usage (root)::

    .venv/bin/python bench/tcp_carryover.py [--steps 20] [--bytes 2700000] [--json PATH]

It brings up its own testbed (refusing to run if a netbench testbed is up) and removes
everything with ``netbench reset`` in ``finally``. Exit status: 0 done, 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NETBENCH = [sys.executable, "-m", "netbench.cli"]
PORT = 5301
SETTLE_STEPS, SETTLE_S = 3, 1.5
# (before, after): the transitions a sweep's launch could make, narrowing ones as controls
CASES = (
    ("unshaped", "50ms/1gbit"),
    ("1ms/1gbit", "50ms/1gbit"),
    ("50ms/100mbit", "50ms/1gbit"),
    ("10ms/1gbit", "50ms/100mbit"),
    ("50ms/1gbit", "10ms/1gbit"),
    ("50ms/1gbit", "50ms/100mbit"),
)

SERVER = """
import socket, sys
size = int(sys.argv[2])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], {port})); srv.listen(8)
while True:
    conn, _ = srv.accept()
    got = 0
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        got += len(data)
        while got >= size:
            got -= size
            conn.sendall(b"k")
    conn.close()
""".format(port=PORT)

CLIENT = """
import json, socket, struct, sys, threading, time
size = int(sys.argv[2]); payload = b"x" * size
sock = socket.socket()
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, sys.argv[3].encode())
sock.connect((sys.argv[1], {port}))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
lock = threading.Lock()
def say(obj):
    with lock:
        print(json.dumps(obj), flush=True)
def info():
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    fields = struct.unpack_from("8B24I", raw)
    return {{"info": True, "rtt_us": fields[8 + 15], "ssthresh": fields[8 + 17], "cwnd": fields[8 + 18]}}
def steps(count):
    for _ in range(count):
        t0 = time.monotonic()
        sock.sendall(payload)
        if sock.recv(1) != b"k":
            raise SystemExit("short reply")
        say({{"start": t0, "end": time.monotonic()}})
for line in sys.stdin:
    if line.strip() == "info":
        say(info())
    else:
        threading.Thread(target=steps, args=(int(line),), daemon=True).start()
""".format(port=PORT)


COUNTERS = ("TCPHystartTrainDetect", "TCPHystartDelayDetect", "TCPSackRecovery", "TCPTimeouts")


def counters(netns: str) -> dict[str, int]:
    """The sender namespace's TcpExt counters of COUNTERS (/proc/net/netstat)."""
    text = subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/netstat"], check=True,
                          capture_output=True, text=True).stdout.splitlines()
    for names, values in zip(text[::2], text[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], map(int, values.split()[1:])))
            return {name: table.get(name, 0) for name in COUNTERS}
    return {}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after}


def netbench(*args: str) -> str:
    return subprocess.run(NETBENCH + list(args), check=True, cwd=REPO, capture_output=True, text=True).stdout


def shape(point: str) -> None:
    """Apply a point ("DELAY/RATE") to both nodes, in place ("unshaped": the testbed as it came up)."""
    if point == "unshaped":
        return
    delay, rate = point.split("/")
    netbench("apply", "--latency", delay, "--bandwidth", rate)


class Connection:
    """The client in n1 (steps on demand, on its stdin) against the server in n2."""

    def __init__(self, nodes: list[dict], size: int, cc: str) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", nodes[0]["netns"], sys.executable, "-c", CLIENT,
                                      nodes[1]["address"], str(size), cc], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def steps(self, count: int) -> list[tuple[float, float]]:
        self.start(count)
        return [self.step() for _ in range(count)]

    def start(self, count: int) -> None:
        """Ask for `count` steps, back to back (they run while this process goes on)."""
        self.proc.stdin.write(f"{count}\n")
        self.proc.stdin.flush()

    def step(self) -> tuple[float, float]:
        line = json.loads(self.proc.stdout.readline())
        return line["start"], line["end"]

    def info(self) -> dict:
        """TCP_INFO now (step lines that come first are dropped)."""
        self.proc.stdin.write("info\n")
        self.proc.stdin.flush()
        while True:
            line = json.loads(self.proc.stdout.readline())
            if line.get("info"):
                return {k: v for k, v in line.items() if k != "info"}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def settled(steps: list[tuple[float, float]], changed_at: float) -> list[tuple[float, float]]:
    """The steps after a launch's settle: started after the change, past the first 3, 1.5 s on."""
    after = [s for s in steps if s[0] >= changed_at]
    return [s for i, s in enumerate(after) if i >= SETTLE_STEPS and s[0] >= changed_at + SETTLE_S]


def mean_step(steps: list[tuple[float, float]]) -> float:
    return statistics.fmean(end - start for start, end in steps)


def fresh(nodes: list[dict], point: str, size: int, count: int, cc: str) -> tuple[float, dict]:
    """Mean step of a new connection on `point` (its first 3 steps are its warm-up), and its TCP_INFO."""
    shape(point)
    conn = Connection(nodes, size, cc)
    try:
        mean = mean_step(conn.steps(SETTLE_STEPS + count)[SETTLE_STEPS:])
        return mean, conn.info()
    finally:
        conn.close()


def carried(nodes: list[dict], before: str, after: str, size: int, count: int, cc: str) -> tuple[float, dict]:
    """Mean measured step on `after` of a connection that ran `count` steps on `before` (the
    change made while it steps), and its TCP_INFO then."""
    shape(before)
    conn = Connection(nodes, size, cc)
    try:
        at_start = counters(nodes[0]["netns"])
        conn.steps(count)
        on_before = delta(at_start, counters(nodes[0]["netns"]))
        conn.start(1_000_000)  # steps go on through the change, as a launch's do
        changed_at = time.monotonic()
        shape(after)
        steps: list[tuple[float, float]] = []
        while len(settled(steps, changed_at)) < count:
            steps.append(conn.step())
        tcp = conn.info()
        tcp["on_before"] = on_before
        tcp["after_change"] = delta(at_start, counters(nodes[0]["netns"]))
        tcp["after_change"] = {k: v - on_before[k] for k, v in tcp["after_change"].items()}
        return mean_step(settled(steps, changed_at)[:count]), tcp
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="measured steps per case and side (default 20)")
    parser.add_argument("--bytes", type=int, default=2_700_000, help="bytes per step (default 2.7 MB: an MLP's "
                        "gradients)")
    parser.add_argument("--cc", default="cubic,bbr", help="TCP congestion controls to measure, each in turn "
                        "(the sending socket's TCP_CONGESTION; default cubic,bbr)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    shown = json.loads(subprocess.run(NETBENCH + ["testbed", "show", "--json"], cwd=REPO, capture_output=True,
                                      text=True).stdout or "{}")
    if shown.get("nodes"):
        print("a netbench testbed is up already: take it down first", file=sys.stderr)
        return 2
    rows = []
    for cc in args.cc.split(","):
        print(f"congestion control: {cc}")
        rows += measure(cc, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def measure(cc: str, args: argparse.Namespace) -> list[dict]:
    """Every case under congestion control `cc`, on a testbed of its own."""
    server = None
    rows = []
    try:
        netbench("testbed", "up", "--nodes", "2")
        nodes = json.loads(netbench("testbed", "show", "--json"))["nodes"]
        server = subprocess.Popen(["ip", "netns", "exec", nodes[1]["netns"], sys.executable, "-c", SERVER,
                                   nodes[1]["address"], str(args.bytes)])
        time.sleep(1.0)
        print(f"{'before':>14} -> {'after':<14} {'fresh ms':>9} {'carried ms':>10} {'carried/fresh':>13} "
              f"{'ssthresh fresh/carried':>22} {'cwnd fresh/carried':>18}  HyStart exits (train, delay), "
              f"recoveries, timeouts: on BEFORE | after the change")
        for before, after in CASES:  # the unshaped case first, on the testbed as it came up
            if before == "unshaped":
                mean, tcp = carried(nodes, before, after, args.bytes, args.steps, cc)
                base, base_tcp = fresh(nodes, after, args.bytes, args.steps, cc)
            else:
                base, base_tcp = fresh(nodes, after, args.bytes, args.steps, cc)
                mean, tcp = carried(nodes, before, after, args.bytes, args.steps, cc)
            rows.append({"cc": cc, "before": before, "after": after, "fresh_step_s": base, "carried_step_s": mean,
                         "carried_over_fresh": mean / base, "fresh_tcp": base_tcp, "carried_tcp": tcp})
            print(f"{before:>14} -> {after:<14} {base * 1e3:9.1f} {mean * 1e3:10.1f} {mean / base:13.2f} "
                  f"{base_tcp['ssthresh']:>11}/{tcp['ssthresh']:<10} {base_tcp['cwnd']:>9}/{tcp['cwnd']:<8}  "
                  + " ".join(str(v) for v in tcp["on_before"].values()) + " | "
                  + " ".join(str(v) for v in tcp["after_change"].values()), flush=True)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(NETBENCH + ["reset"], cwd=REPO, capture_output=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
