"""A job that reports no steps at all: every rank streams bytes to the next one in a ring and
prints nothing. netbench measures it in bytes on each node's link (results.csv source bytes):

    netbench sweep --bandwidth 1gbit,20mbit --workers 2 --warmup 2 --seconds 5 -- python examples/ring_bytes.py

It uses the variables every rank gets (NETBENCH_RANK, NETBENCH_PEERS, NETBENCH_ADDRESS,
MASTER_PORT) and only the standard library; it runs until it is stopped, or --max-seconds.
"""

import argparse
import os
import socket
import sys
import threading
import time


def connect(address, port, deadline):
    while True:
        try:
            return socket.create_connection((address, port), timeout=30)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def send_forever(sock, block, until):
    while time.monotonic() < until:
        sock.sendall(block)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kib", type=int, default=64, help="KiB per send")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="end by itself after this long")
    args = parser.parse_args()
    peers = [p for p in os.environ.get("NETBENCH_PEERS", "").split(",") if p]
    if len(peers) < 2:
        sys.exit("ring_bytes.py: run it under 'netbench sweep --workers 2 (or more) -- python examples/ring_bytes.py'")
    rank, port = int(os.environ["NETBENCH_RANK"]), int(os.environ["MASTER_PORT"])
    until = time.monotonic() + args.max_seconds
    server = socket.create_server((os.environ.get("NETBENCH_ADDRESS", ""), port))
    out = connect(peers[(rank + 1) % len(peers)], port, time.monotonic() + 60)
    inbound = server.accept()[0]
    server.close()
    threading.Thread(target=send_forever, args=(out, b"\0" * (args.kib * 1024), until), daemon=True).start()
    while time.monotonic() < until and inbound.recv(1 << 16):
        pass


if __name__ == "__main__":
    main()
