"""A job that knows nothing of netbench: each step, every rank sends its "gradients" to rank 0
and waits for the "average" back, then prints one line. netbench reads the lines:

    netbench sweep --latency 1,20ms --workers 2 --images-per-step 64 \\
        --step-regex 'step (?P<step>\\d+) took (?P<ms>[\\d.]+) ms' -- python examples/plain_steps.py

It uses the variables every rank gets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and only
the standard library. --steps 0 (the default) steps until stopped.
"""

import argparse
import os
import socket
import time


def recv_exactly(sock, size):
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(65536, size - len(data)))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return bytes(data)


def connect(rank, world, addr, port):
    """Rank 0: a socket per other rank; others: one socket to rank 0."""
    if rank == 0:
        server = socket.create_server(("", port))
        peers = [server.accept()[0] for _ in range(world - 1)]
        server.close()
        return peers
    deadline = time.monotonic() + 60
    while True:
        try:
            return [socket.create_connection((addr, port), timeout=60)]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="steps to run (0: until stopped)")
    parser.add_argument("--kib", type=int, default=256, help="KiB each rank sends per step")
    parser.add_argument("--compute-ms", type=float, default=5.0, help="local work per step")
    args = parser.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    peers = connect(rank, world, os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", 29500)))
    for peer in peers:
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = os.urandom(args.kib * 1024)
    step = 0
    while args.steps == 0 or step < args.steps:
        began = time.perf_counter()
        time.sleep(args.compute_ms / 1000)  # the "forward and backward pass"
        if rank == 0:
            for peer in peers:
                recv_exactly(peer, len(payload))
            for peer in peers:
                peer.sendall(payload)
        else:
            peers[0].sendall(payload)
            recv_exactly(peers[0], len(payload))
        print(f"step {step} took {(time.perf_counter() - began) * 1000:.3f} ms", flush=True)
        step += 1


if __name__ == "__main__":
    main()
