#!/bin/sh
# torchrun with no flags: netbench gives every node torchrun's options as PET_* variables
# (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE=1, ...):
#
#     netbench sweep --latency 1,20ms --workers 2 -- sh examples/torchrun.sh
#
# With --ranks-per-node R netbench starts it once per node with PET_NPROC_PER_NODE=R, and
# torchrun starts the node's R processes itself:
#
#     netbench sweep --latency 1,20ms --workers 4 --ranks-per-node 2 -- sh examples/torchrun.sh
#
# torchrun's workers are its children, in its process group: netbench stops them with it.
exec "${PYTHON:-python}" -m torch.distributed.run "$(dirname "$0")/torch_ddp.py" "$@"
