"""Facts about the machine: detected (machine=auto) or stated by a profile."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class Detected:
    backend: str  # metal | cuda | cpu
    chip: str
    memory_bytes: int
    cpu_cores: int = 1


# Facts a detected accelerator does not report: (backend, memory bandwidth GB/s, dense 16-bit
# TFLOPs), from the vendors' data sheets. Matched as a substring of the device name.
KNOWN = {"H200": ("cuda", 4800, 989), "H100": ("cuda", 3350, 989),
         "A100": ("cuda", 2039, 312), "L40S": ("cuda", 864, 362),
         "RTX 4090": ("cuda", 1008, 165), "M1 Max": ("metal", 400, 10.4),
         "M4 Pro": ("metal", 273, 9.2), "M3 Max": ("metal", 400, 14.2),
         "M2 Ultra": ("metal", 800, 27.2)}
# When neither a profile nor KNOWN says: conservative per-backend guesses (GB/s; TFLOPs per
# core for cpu and metal, whole device for cuda). A CPU core sustains ~32 fp32 GFLOPs
# through OpenBLAS (AVX2 FMA); an Apple GPU core ~0.3 TFLOPs.
DEFAULT_BANDWIDTH = {"cpu": 20.0, "metal": 100.0, "cuda": 1000.0}
TFLOPS_PER_CORE = {"cpu": 0.032, "metal": 0.3}
DEFAULT_CUDA_TFLOPS = 100.0


def known_facts(chip: str) -> tuple[str, float, float] | None:
    """(backend, bandwidth GB/s, TFLOPs) for a device name KNOWN lists, else None."""
    for name, facts in KNOWN.items():
        if name.lower() in (chip or "").lower():
            return facts
    return None


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _chip() -> str:
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=2)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def accelerator_memory(info: dict, fallback: int) -> int:
    """The device's own memory from `mx.device_info()`: Metal names it `memory_size`, CUDA
    `total_memory` (missing it read the host's RAM: 135 GB for an 80 GB H100)."""
    for key in ("memory_size", "total_memory"):
        if info.get(key):
            return int(info[key])
    return fallback


def detect() -> Detected:
    """What MLX will run on here. Imports mlx (cheap; loads no model)."""
    import mlx.core as mx

    if mx.metal.is_available():
        backend = "metal"
    elif hasattr(mx, "cuda") and mx.cuda.is_available():
        backend = "cuda"
    else:
        backend = "cpu"
    chip, memory = _chip(), _memory_bytes()
    if backend != "cpu":  # the accelerator's own name and memory
        info = mx.device_info()
        chip = str(info.get("device_name", chip))
        memory = accelerator_memory(info, memory)
    return Detected(backend=backend, chip=chip, memory_bytes=memory,
                    cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else os.cpu_count() or 1)
