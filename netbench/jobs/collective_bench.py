"""Per-node collective benchmark process (``python -m netbench.jobs.collective_bench``).

Started by `netbench collective` (netbench.experiment.collective) on each node, like the
training harness: TF_CONFIG names the cluster and this process's place in it. Like the
harness it only times and reports: one JSON event per stdout line (netbench.jobs.events'
wire format), everything else on stderr.

Per operation and message size it sends one ``collective`` event with the duration of each
timed repetition (after ``--warmup`` untimed ones), back to back as nccl-tests does:

    {"event": "collective", "op": "allreduce", "bytes": 1024, "times": [...], "framework": "tf"}

then a ``done`` event. Frameworks:

* ``tf``: TensorFlow's collective ops, the ones MultiWorkerMirroredStrategy runs (its
  strategy sets the cluster up; the ops are CollectiveReduceV2, CollectiveGatherV2 and
  CollectiveBcastSend/RecvV2 with the ring implementation), each in a tf.function as
  the training step calls them;
* ``gloo``: torch.distributed's gloo backend (all_reduce, broadcast, all_gather), the
  rendezvous on worker 0's address at the TF port + 1.

The "step" events it sends (one per operation and size, phase "collective") only keep the
controller's step timeout alive; they carry no training step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import IO, Any, Callable

from netbench.jobs.harness.emit import bench_main, emit, emit_timings, tf_config_workers, time_calls
from netbench.jobs.harness.strategy import farewell

OPS = ("allreduce", "broadcast", "allgather")
FRAMEWORKS = ("tf", "gloo")
EVENT = "collective"
GROUP_KEY = 4242  # far from MultiWorkerMirroredStrategy's own keys (they start at 1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="netbench.jobs.collective_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", required=True, help="Message sizes in bytes, comma-separated.")
    parser.add_argument("--ops", default=",".join(OPS), help="Operations, comma-separated.")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="tf")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed repetitions per size.")
    parser.add_argument("--reps", type=int, default=5, help="Timed repetitions per size.")
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds one collective may take.")
    return parser



def _tf_runner(timeout: float) -> tuple[Callable[[str, int], Callable[[], Any]], int, int, str]:
    """(make(op, bytes) -> a call that runs one collective, task index, workers, version)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.python.ops import collective_ops

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeout, implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    resolver = strategy.cluster_resolver
    index = int(resolver.task_id or 0) if resolver is not None else 0
    workers = max(1, strategy.num_replicas_in_sync)
    device = strategy.extended.worker_devices[0]
    keys = iter(range(1000, 10**9))

    def make(op: str, size: int) -> Callable[[], Any]:
        count = max(1, size // 4)  # float32 elements
        instance = next(keys)
        with tf.device(device):
            value = tf.Variable(tf.ones([count], tf.float32))

        @tf.function
        def run() -> Any:
            with tf.device(device):
                if op == "allreduce":
                    return collective_ops.all_reduce_v2(value, workers, GROUP_KEY, instance, merge_op="Add",
                                                        final_op="Id", communication_hint="ring", timeout=timeout)
                if op == "allgather":
                    return collective_ops.all_gather_v2(value, workers, GROUP_KEY, instance,
                                                        communication_hint="ring", timeout=timeout)
                if index == 0:
                    return collective_ops.broadcast_send_v2(value, workers, GROUP_KEY, instance,
                                                            communication_hint="ring", timeout=timeout)
                return collective_ops.broadcast_recv_v2([count], tf.float32, workers, GROUP_KEY, instance,
                                                        communication_hint="ring", timeout=timeout)

        def call() -> Any:
            out = run()
            return out.numpy() if hasattr(out, "numpy") else out

        return call

    return make, index, workers, tf.__version__


def interface_of(address: str) -> str | None:
    """The name of this namespace's interface holding IPv4 `address` (gloo binds by name: by
    default it resolves the host name, which in a namespace is loopback)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def _gloo_runner(timeout: float) -> tuple[Callable[[str, int], Callable[[], Any]], int, int, str]:
    import datetime

    import torch
    import torch.distributed as dist

    addresses, index = tf_config_workers(("127.0.0.1:0",))
    host, port = addresses[0].rsplit(":", 1)
    own = interface_of(addresses[index].rsplit(":", 1)[0])
    if own is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", own)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{int(port) + 1}", rank=index,
                            world_size=len(addresses), timeout=datetime.timedelta(seconds=timeout))
    workers = len(addresses)

    def make(op: str, size: int) -> Callable[[], Any]:
        value = torch.ones(max(1, size // 4), dtype=torch.float32)
        if op == "allreduce":
            return lambda: dist.all_reduce(value)
        if op == "broadcast":
            return lambda: dist.broadcast(value, src=0)
        outputs = [torch.empty_like(value) for _ in range(workers)]
        return lambda: dist.all_gather(outputs, value)

    return make, index, workers, torch.__version__


def run(args: argparse.Namespace, stream: IO[str]) -> int:
    """Time every op at every size; returns the step events sent (one per op and size)."""
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ops = [op for op in args.ops.split(",") if op]
    if any(op not in OPS for op in ops):
        raise SystemExit(f"--ops: choose from {', '.join(OPS)}")
    runner = _tf_runner if args.framework == "tf" else _gloo_runner
    make, index, workers, version = runner(args.timeout)
    emit({"event": "start", "task_index": index, "num_workers": workers, "pid": os.getpid(), "time": time.time(),
          "tf_version": version, "model": "collective", "strategy": args.framework}, stream)
    sent = 0
    for op in ops:
        for size in sizes:
            times = time_calls(make(op, size), args.warmup, args.reps)
            emit_timings({"event": EVENT, "op": op, "bytes": size, "framework": args.framework}, times, sent, stream)
            sent += 1
    if workers > 1 and args.framework == "tf":
        farewell(make("allreduce", 4))
    return sent


def main(argv: list[str] | None = None) -> int:
    return bench_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
