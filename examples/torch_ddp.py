"""A plain PyTorch DistributedDataParallel loop over gloo, timed with netbench.track:

    netbench sweep --latency 1,20ms --workers 2 -- python examples/torch_ddp.py

init_process_group reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://), which
netbench gives every rank; torchrun gives the same (examples/torchrun.sh). The loop asks
track.stop_requested() after each step, so one start serves many network points; without
netbench it runs --steps steps.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from netbench import track


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200, help="steps when not under netbench")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    images = torch.randn(args.batch_size, 1, 28, 28)
    labels = torch.randint(0, 10, (args.batch_size,))
    step = 0
    while track.active() or step < args.steps:
        with track.step(images=args.batch_size):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(images), labels)
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
        step += 1
        if track.stop_requested():
            break
    dist.destroy_process_group()
    # gloo's worker threads let go of the last step's all-reduce after the step returned, and
    # that needs the GIL: a Python before 3.14 that is finalizing by then aborts (SIGABRT, in
    # about 1 exit in 20 here; pytorch/pytorch#117762). Leave without finalizing, once the output
    # is out (track writes each step as it ends).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
