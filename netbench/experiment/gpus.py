"""`netbench doctor`'s GPUs: what devices this host has, its CUDA and NCCL, and what cannot be shaped.

Two sources, each optional: ``nvidia-smi`` (the driver's view: every GPU, the driver and
its CUDA version) and ``torch.cuda`` (what a torch rank would use: its devices, the CUDA it
was built with, its NCCL). Parsing is pure; `probe_gpus` runs the two commands with a timeout.

RDMA (RoCE, InfiniBand) moves data from one host's memory to another's through the NIC,
bypassing the kernel's network stack: neither tc's qdiscs nor the userspace delay engine
ever see it, so netbench cannot shape it. Every rank gets ``NCCL_IB_DISABLE=1`` so NCCL
uses its socket transport over the node's shaped interface (``NCCL_SOCKET_IFNAME``).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from typing import Callable

from netbench import proc
from netbench.errors import NetbenchError

SMI_QUERY = ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"]
TORCH_PROBE = ("import json, torch\n"
               "ok = torch.cuda.is_available()\n"
               "devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if ok else []\n"
               "try:\n    v = torch.cuda.nccl.version() if ok else ()\n"
               "except Exception:\n    v = ()\n"
               "nccl = '.'.join(map(str, v)) if isinstance(v, tuple) else str(v)\n"
               "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda or '', "
               "'devices': devices, 'nccl': nccl}))\n")
RDMA_NOTE = ("RDMA (RoCE, InfiniBand) bypasses the kernel: netbench cannot shape it; every rank gets "
             "NCCL_IB_DISABLE=1 and NCCL_SOCKET_IFNAME (its node's shaped interface), so NCCL uses sockets there")


@dataclass(frozen=True)
class Gpus:
    """This host's GPUs as the driver and torch see them ("" or () where unknown)."""

    smi_devices: tuple[str, ...] = ()  # "0: NVIDIA H100 80GB HBM3, 81559 MiB"
    driver: str = ""
    torch_devices: tuple[str, ...] = ()
    torch_version: str = ""
    cuda: str = ""  # the CUDA torch was built with
    nccl: str = ""
    notes: tuple[str, ...] = ()  # why a source said nothing

    @property
    def count(self) -> int:
        return max(len(self.smi_devices), len(self.torch_devices))


def parse_smi(text: str) -> tuple[tuple[str, ...], str]:
    """(devices, driver version) from `SMI_QUERY`'s output (pure)."""
    devices, driver = [], ""
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 3 and fields[0].isdigit():
            devices.append(f"{fields[0]}: {fields[1]}" + (f", {fields[3]}" if len(fields) > 3 else ""))
            driver = fields[2]
    return tuple(devices), driver


def smi_identity(which: Callable[[str], str | None] = shutil.which, timeout: float = 10.0) -> tuple[str, ...]:
    """This host's GPUs as nvidia-smi names them, and its driver ("driver 550.54"); () without
    nvidia-smi or when it fails (a calibration cache key's GPU identity: experiment/calibration_cache.py)."""
    if not which("nvidia-smi"):
        return ()
    try:
        result = proc.run(SMI_QUERY, check=False, timeout=timeout)
    except NetbenchError:
        return ("nvidia-smi: failed",)
    if result.returncode:
        return ("nvidia-smi: failed",)
    devices, driver = parse_smi(result.stdout)
    return devices + ((f"driver {driver}",) if driver else ())


def parse_torch(text: str) -> dict:
    """TORCH_PROBE's JSON line (pure); {} when it is not one."""
    lines = text.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def probe_gpus(which: Callable[[str], str | None] = shutil.which, timeout: float = 60.0) -> Gpus:
    """Ask nvidia-smi (if present) and torch.cuda (if importable)."""
    notes = []
    smi, driver = (), ""
    if which("nvidia-smi"):
        try:
            result = proc.run(SMI_QUERY, check=False, timeout=timeout)
            smi, driver = parse_smi(result.stdout) if result.returncode == 0 else ((), "")
            if result.returncode:
                notes.append(f"nvidia-smi: {(result.stderr or result.stdout).strip()[:200]}")
        except NetbenchError as exc:
            notes.append(f"nvidia-smi: {exc.message}")
    else:
        notes.append("nvidia-smi: not found")
    found: dict = {}
    try:
        result = proc.run([sys.executable, "-c", TORCH_PROBE], check=False, timeout=timeout)
        found = parse_torch(result.stdout) if result.returncode == 0 else {}
        if not found:
            notes.append("torch.cuda: torch is not importable")
    except NetbenchError as exc:
        notes.append(f"torch.cuda: {exc.message}")
    return Gpus(smi_devices=smi, driver=driver, torch_devices=tuple(found.get("devices") or ()),
                torch_version=str(found.get("torch") or ""), cuda=str(found.get("cuda") or ""),
                nccl=str(found.get("nccl") or ""), notes=tuple(notes))


def gpu_lines(gpus: Gpus) -> list[str]:
    """The doctor's lines on GPUs, CUDA, NCCL and RDMA (pure)."""
    lines = [f"GPUs: {gpus.count}" + ("" if gpus.count else " (--device cuda needs at least one per rank)")]
    lines += [f"  {d}" for d in gpus.smi_devices or gpus.torch_devices]
    if gpus.driver:
        lines.append(f"  NVIDIA driver {gpus.driver}")
    if gpus.torch_version:
        lines.append(f"  torch {gpus.torch_version}: CUDA {gpus.cuda or 'none (a CPU build)'}, "
                     f"NCCL {gpus.nccl or 'none'}, {len(gpus.torch_devices)} device(s) visible")
    lines += [f"  {note}" for note in gpus.notes]
    lines.append(RDMA_NOTE)
    return lines


def to_json(gpus: Gpus) -> dict:
    return {"count": gpus.count, "nvidia_smi": list(gpus.smi_devices), "driver": gpus.driver,
            "torch_devices": list(gpus.torch_devices), "torch": gpus.torch_version, "cuda": gpus.cuda,
            "nccl": gpus.nccl, "notes": list(gpus.notes), "rdma": RDMA_NOTE}
