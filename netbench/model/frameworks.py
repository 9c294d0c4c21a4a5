"""The training frameworks a built-in job runs on, and what each offers (pure).

``tensorflow`` (the default) runs ``python -m netbench.jobs.worker`` (tf.distribute);
``torch`` runs ``python -m netbench.jobs.torch_worker`` (PyTorch DistributedDataParallel over
gloo), with fewer strategies and models: those below. Both take the same options and write
the same step events; only the worker module differs.
"""

from __future__ import annotations

TENSORFLOW, TORCH = "tensorflow", "torch"
FRAMEWORKS = (TENSORFLOW, TORCH)
DEFAULT_FRAMEWORK = TENSORFLOW

# what --framework torch trains: DDP every step, DDP with k micro-batches under no_sync, one process
TORCH_STRATEGIES = ("allreduce", "allreduce-accum", "single")
TORCH_MODELS = ("mlp", "cnn", "resnet18")

WORKER_MODULES = {TENSORFLOW: "netbench.jobs.worker", TORCH: "netbench.jobs.torch_worker"}


def check_framework(framework: str, strategy: str, model: str) -> None:
    """Raise ValueError naming the setting ("framework", "strategy" or "model") when
    `framework` cannot train `strategy` or `model`."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: unknown {framework!r}; choose from {', '.join(FRAMEWORKS)}")
    if framework != TORCH:
        return
    if strategy not in TORCH_STRATEGIES:
        raise ValueError(f"strategy: {strategy} is not available with framework torch "
                         f"(torch runs {', '.join(TORCH_STRATEGIES)})")
    if model not in TORCH_MODELS:
        raise ValueError(f"model: {model} is not available with framework torch "
                         f"(torch builds {', '.join(TORCH_MODELS)})")


def worker_module(framework: str) -> str:
    """The module a job's processes run (``python -m MODULE``)."""
    return WORKER_MODULES[framework]


# DistributedDataParallel's buckets (torch/nn/parallel/distributed.py): the first one closes at
# 1 MiB, the others at 25 MiB (bucket_cap_mb), each one all-reduce per step
DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES = 2**20, 25 * 2**20


def allreduce_buckets(framework: str, model_bytes: int) -> int:
    """All-reduces per step of a model's gradients: TensorFlow packs them into one; torch's DDP
    into buckets, about 1 + ceil((bytes - 1 MiB) / 25 MiB) (a bucket closes after the tensor that
    fills it, so this counts whole tensors only approximately)."""
    if framework != TORCH or model_bytes <= DDP_FIRST_BUCKET_BYTES:
        return 1
    return 1 + -(-(model_bytes - DDP_FIRST_BUCKET_BYTES) // DDP_BUCKET_BYTES)
