"""`netbench doctor`'s GPU lines (experiment/gpus.py; parsing and wording, pure) and the GPU
check's refusal to measure without GPUs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from netbench.experiment import gpus
from tests.conftest import ROOT

SMI = "0, NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n1, NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n"


def test_nvidia_smi_and_torch_cuda_are_read():
    devices, driver = gpus.parse_smi(SMI)
    assert devices == ("0: NVIDIA H100 80GB HBM3, 81559 MiB", "1: NVIDIA H100 80GB HBM3, 81559 MiB")
    assert driver == "550.54.15"
    assert gpus.parse_smi("No devices were found\n") == ((), "")
    found = gpus.parse_torch('noise\n{"torch": "2.13.0", "cuda": "12.4", "devices": ["H100"], "nccl": "2.21.5"}\n')
    assert found["nccl"] == "2.21.5" and gpus.parse_torch("Traceback ...") == {}


def test_the_doctor_lists_gpus_cuda_nccl_and_says_rdma_is_not_shaped():
    lines = gpus.gpu_lines(gpus.Gpus(smi_devices=("0: H100",), driver="550", torch_devices=("H100",),
                                     torch_version="2.13.0", cuda="12.4", nccl="2.21.5"))
    assert lines[0] == "GPUs: 1" and "  0: H100" in lines
    assert any("CUDA 12.4, NCCL 2.21.5" in line for line in lines)
    assert "RDMA (RoCE, InfiniBand) bypasses the kernel: netbench cannot shape it" in lines[-1]
    none = gpus.gpu_lines(gpus.Gpus(torch_version="2.13.0", notes=("nvidia-smi: not found",)))
    assert none[0].startswith("GPUs: 0") and any("a CPU build" in line for line in none)


def test_gpu_check_says_it_did_not_measure_without_two_gpus():
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
            pytest.skip("a machine with GPUs: bench/gpu_check.py measures there (a bench, not a test)")
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "Not measured" in result.stdout, result.stdout + result.stderr
