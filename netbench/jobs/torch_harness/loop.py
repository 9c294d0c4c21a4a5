"""The synchronous training loop of a torch job (allreduce, allreduce-accum, single), emitting
the same step events as the TensorFlow loop (netbench.jobs.harness.loop).

One step is one optimizer update, run as a user's PyTorch loop runs it (``--step fused``,
the default): forward, backward (DistributedDataParallel all-reduces the gradients in
buckets over gloo while backward still runs: communication overlaps computation), optimizer
step. allreduce-accum: the first k - 1 micro-batches' backward passes run under
``no_sync`` (local accumulation, no network), the k-th one all-reduces, then one update.

The computation/communication split is measured as the TensorFlow loop measures it: after
the measured window, ``--calibration-steps`` split steps (phase ``calibration``; the first
one untimed and unsent): every micro-batch's backward under ``no_sync`` (compute), then one
all-reduce of all gradients flattened into one buffer and the update (comm, including any
wait for a slower peer). ``--step split`` splits every step and runs no calibration.

--seconds: every rank sizes the window from the all-reduced mean warm-up step time, so all
run the same number of collectives. --until-stopped: measured steps until SIGTERM.
The startup watchdog (--startup-timeout) covers imports, rendezvous and model building;
gloo's timeout (--collective-timeout) every collective after. BatchNorm buffers are not
synchronised each step (``forward_sync_buffers=False``), as MWMS does not synchronise Keras's.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from contextlib import nullcontext
from dataclasses import replace
from datetime import timedelta
from typing import IO, Any

from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets
from netbench.jobs.harness import idx
from netbench.jobs.harness.emit import arm_startup_watchdog, disarm_startup_watchdog, emit
from netbench.jobs.harness.loop import calibration_steps, timed_update, check_data_fits, measured_steps_from_mean, resolve_shape, \
    warmup_mean
from netbench.jobs.harness.models import DEFAULT_CLASSES
from netbench.jobs.harness.step_delay import StepDelay
from netbench.jobs.torch_harness import collectives, rendezvous

NO_TIMEOUT_S = 365 * 24 * 3600.0  # --collective-timeout 0: gloo needs some timeout
# OpenMP threads that wait by spinning hold the cores that the other ranks of the job need: on an
# embedded testbed every rank shares this machine's cores (measured on 2 cores, 2 ranks over
# loopback: ~27 ms per MLP step spinning, ~8 ms passive). Applied unless the environment sets it.
OMP_WAIT_POLICY = "PASSIVE"


def load_data(args: argparse.Namespace, rank: int, world: int) -> datasets.Dataset:
    """This rank's examples: one synthetic batch, or its shard of an .npz or IDX dataset."""
    if args.data == datasets.SYNTHETIC:
        return datasets.synthetic(resolve_shape(args), args.classes or DEFAULT_CLASSES, args.batch_size,
                                  seed=args.seed * 1_000_003 + rank)
    if idx.is_idx_folder(args.data):
        loaded = idx.load_idx_folder(args.data, rank, world)
        check_data_fits(loaded, args)
        return loaded
    if os.path.isdir(args.data):
        raise datasets.DataError(f"{args.data}: a torch job reads synthetic data, an .npz, or a folder of IDX "
                                 f"files ({idx.TRAIN_IMAGES}[.gz]); not a folder of class folders")
    loaded = datasets.load_npz(args.data)
    check_data_fits(loaded, args)
    return datasets.shard(loaded, rank, world)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _place(strategy: str) -> rendezvous.Rendezvous | None:
    """Where this process meets its peers: TF_CONFIG's cluster, else RANK/WORLD_SIZE/MASTER_ADDR
    as given, else a job of one on loopback; None for ``single`` (no process group)."""
    if strategy == "single":
        return None
    where = rendezvous.from_environment(os.environ) or rendezvous.from_tf_config(os.environ.get("TF_CONFIG", ""))
    return where or rendezvous.Rendezvous(rank=0, world=1, master_addr="127.0.0.1", master_port=_free_port(),
                                          address="127.0.0.1")


def _own_interface(where: rendezvous.Rendezvous) -> str | None:
    address = where.address
    if address and not address.replace(".", "").isdigit():
        try:
            address = socket.gethostbyname(address)
        except OSError:
            return None
    return rendezvous.interface_of(address)


def _device(torch: Any, kind: str, local_rank: int) -> Any:
    """This rank's device: the CPU, or GPU LOCAL_RANK of those its node's ranks see
    (CUDA_VISIBLE_DEVICES, model/ranks.py); a cuda run where torch sees no GPU is refused."""
    if kind != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch.cuda is not available on this node "
                           "(no GPU, or a CPU build of torch); run --device cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Train under args.strategy, emitting events on ``events``; returns the steps run."""
    arm_startup_watchdog(args.startup_timeout)
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)  # read once, when torch loads OpenMP
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from netbench.jobs.torch_harness.models import build_model, model_size

    if args.threads:
        torch.set_num_threads(args.threads)
    where = _place(args.strategy)
    rank, world = (0, 1) if where is None else (where.rank, where.world)
    device_kind = getattr(args, "device", "cpu")
    collective = getattr(args, "collective", collectives.RING)
    device = _device(torch, device_kind, 0 if where is None else where.local_rank)
    groups = None
    if where is not None:
        env = rendezvous.torch_env(where, os.environ.get("GLOO_SOCKET_IFNAME") or _own_interface(where))
        os.environ.update(env)
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo", init_method="env://", rank=rank,
                                world_size=world, timeout=timedelta(seconds=args.collective_timeout or NO_TIMEOUT_S))
        if collective == collectives.HIERARCHICAL:
            groups = collectives.build_groups(dist, rank, world, where.local_world)
    sum_all = collectives.all_reduce_fn(dist, collective, groups)
    accum_steps = args.accum_steps if args.strategy == "allreduce-accum" else 1
    data = load_data(args, rank, world)
    classes = args.classes or max(data.classes, 2)
    batches = [(torch.from_numpy(x).to(device), torch.from_numpy(y).long().to(device))
               for x, y in datasets.batches(data, args.batch_size)]

    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = build_model(args.model, data.input_shape, classes)
    params, model_bytes = model_size(model)
    model = model.to(device)
    net = model
    if where is not None:
        net = DistributedDataParallel(model, forward_sync_buffers=False,
                                      device_ids=[device.index] if device.type == "cuda" else None)
        if groups is not None:
            net.register_comm_hook(None, collectives.hierarchical_hook(torch, dist, groups, world))
    optimizer = torch.optim.SGD(net.parameters(), lr=args.learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    kind = getattr(args, "step", ev.STEP_FUSED)
    calibration = calibration_steps(args)

    event = ev.start_event(rank, world, os.getpid(), time.monotonic(), "", args.model, params, args.batch_size,
                           strategy=args.strategy, role="worker", accum_steps=accum_steps, model_bytes=model_bytes,
                           input_shape=data.input_shape, classes=classes, data=args.data, step=kind)
    event = replace(event, extra=(("framework", "torch"), ("framework_version", torch.__version__),
                                  ("collective", collective), ("device", str(device)),
                                  ("backend", "single" if where is None else dist.get_backend()),
                                  ("local_world", 1 if where is None else where.local_world))
                  + _buckets(net, where))
    disarm_startup_watchdog()
    emit(event, events)
    images = args.batch_size * world * accum_steps
    micro = 0

    def backward(x: Any, y: Any, sync: bool) -> float:
        with nullcontext() if sync or where is None else net.no_sync():
            loss = loss_fn(net(x), y) / accum_steps
            loss.backward()
        return float(loss.detach()) * accum_steps

    delay = StepDelay()

    def accumulate(sync_last: bool) -> float:
        """The update's accum_steps backward passes into fresh gradients; the last one
        all-reduces when `sync_last` (DDP's own hook). Returns the mean loss."""
        nonlocal micro
        optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        for j in range(accum_steps):
            x, y = batches[micro % len(batches)]
            micro += 1
            loss += backward(x, y, sync=sync_last and j == accum_steps - 1)
        return loss / accum_steps

    def fused_update() -> tuple[float, float, float]:
        """One update as users run it: (start, end, mean loss)."""
        t0 = time.monotonic()
        delay.pause()  # the node's step delay: compute time
        loss = accumulate(sync_last=True)
        optimizer.step()
        return t0, time.monotonic(), loss

    def split_update() -> tuple[float, float, float, float]:
        """One update timed apart: (start, end of compute, end, mean loss)."""
        t0 = time.monotonic()
        loss = accumulate(sync_last=False)
        delay.pause()
        t1 = time.monotonic()
        if where is not None:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            sum_all(flat)  # one buffer: DDP's buckets, without the overlap with backward
            flat /= world
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        optimizer.step()
        return t0, t1, time.monotonic(), loss

    def timed_step(step: int, phase: str) -> float:
        return timed_update(step, phase, kind, split_update, fused_update, images, events)

    warmup_durations = [timed_step(k, ev.PHASE_WARMUP) for k in range(args.warmup)]
    if getattr(args, "until_stopped", False):
        k = args.warmup  # a launch: measured steps until the controller stops this process
        while True:
            timed_step(k, ev.PHASE_MEASURED)
            k += 1
    if args.seconds is not None:
        mean = torch.tensor([warmup_mean(warmup_durations)], dtype=torch.float64, device=device)
        if where is not None:
            dist.all_reduce(mean)  # every rank must run the same number of steps
        measured = measured_steps_from_mean(args.seconds, float(mean[0]) / world)
    else:
        measured = args.steps
    for k in range(args.warmup, args.warmup + measured):
        timed_step(k, ev.PHASE_MEASURED)
    total = args.warmup + measured
    if calibration:
        split_update()  # the first split step warms its path: not timed, not sent
        for k in range(total, total + calibration):
            timed_step(k, ev.PHASE_CALIBRATION)
        total += calibration
    emit(ev.Done(time=time.monotonic(), steps=total), events)
    if where is not None:
        dist.destroy_process_group()
    return total


def _buckets(net: Any, where: Any) -> tuple[tuple[str, str], ...]:
    """DDP's gradient buckets of the measured steps ("ddp_bucket_bytes": their sizes, comma-
    separated): each is an all-reduce per step, which the step model counts. DDP rebuilds its
    buckets after the first step, in the order the gradients became ready (the reverse of the
    parameters), with a first bucket of at most 1 MiB and then bucket_cap_mb; its logging data
    still names the first assignment then (the mlp: one bucket of 2,678,824 bytes, where the
    steps all-reduce 1,071,144 and 1,607,680), so the rebuild is worked out here by DDP's own
    rule. () without DDP, or where this torch does not have the rule."""
    if where is None:
        return ()
    try:
        import torch.distributed as dist

        params = [p for p in net.module.parameters() if p.requires_grad][::-1]
        buckets, _ = dist._compute_bucket_assignment_by_size(
            params, [dist._DEFAULT_FIRST_BUCKET_BYTES, net.bucket_bytes_cap], [False] * len(params))
        sizes = ",".join(str(sum(params[i].numel() * params[i].element_size() for i in b)) for b in buckets)
    except Exception:  # noqa: BLE001 - private API: a torch without it leaves the model its estimate
        return ()
    return (("ddp_bucket_bytes", sizes),) if sizes else ()
