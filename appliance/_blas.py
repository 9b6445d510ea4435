"""Use an optimized BLAS for MLX's Linux CPU backend when one is installed.

MLX's Linux CPU wheel links the reference BLAS (~5 GFLOP/s fp32). Loading
OpenBLAS with RTLD_GLOBAL *before* `mlx.core` is imported makes MLX's
`cblas_*` symbols bind to it (~180 GFLOP/s on a 2-core VM). This must run
before anything imports mlx, which is why `appliance/__init__.py` calls it.
Never fails: with no OpenBLAS present the reference BLAS stays in use.
"""

from __future__ import annotations

import ctypes
import os
import sys

# Debian/Ubuntu (libopenblas0-pthread), then generic locations.
CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

#: Path of the BLAS library in use, or "reference" (recorded in the plan).
ACTIVE = "reference"

# OpenBLAS's worker threads spin (sched_yield) for 2^28 cycles after each call before they
# sleep. On a 2-core VM under `bench=agents` the spinning thread took as much CPU as MLX's
# compute thread: 25-28 s of system time in a ~21 s run against 6 s at 2^4 cycles, which
# read 7% more tokens/s (2 pairs). A value the user set wins; mlx_lm.server, which the
# bench starts through `import appliance` for this same BLAS, gets the same setting.
THREAD_TIMEOUT = "4"  # log2 of the cycles a worker spins; OpenBLAS's minimum


def preload() -> str:
    """Load OpenBLAS globally if possible; return what is in use."""
    global ACTIVE
    if not sys.platform.startswith("linux") or ACTIVE != "reference":
        return ACTIVE
    if "mlx.core" in sys.modules:
        return ACTIVE  # too late: MLX already bound its BLAS symbols
    for path in CANDIDATES:
        if os.path.exists(path):
            if not {"OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT"} & set(os.environ):
                os.environ["OPENBLAS_THREAD_TIMEOUT"] = THREAD_TIMEOUT  # read as it loads
            try:
                ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            except OSError:
                continue
            ACTIVE = path
            break
    return ACTIVE
