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
        memory = int(info.get("memory_size", memory))
    return Detected(backend=backend, chip=chip, memory_bytes=memory)
