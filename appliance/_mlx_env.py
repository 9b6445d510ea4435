"""MLX settings read from the environment once, when MLX first needs them: set here,
before anything imports mlx (`appliance/__init__.py`). A value the user set wins.

MLX_CUDA_GRAPH_CACHE_SIZE: MLX's CUDA backend replays each run of ~20 kernels as a CUDA
graph, kept in an LRU cache by topology, 100 graphs by default. One decode step of a
16-layer model is ~20 graphs, and each (batch size, buffer length) is a topology of its
own. Under an agent load the batch changes every few steps and the cache thrashed: a sixth
of a loaded decode step's host time went to instantiating graphs again (py-spy, H200, 1B
shape; docs/benchmarks.md, 13th session).

MLX_MAX_OPS_PER_BUFFER: the kernels in one such graph (MLX's default 20 on CUDA). At 80 a
lone row's decode step took 3.2 ms against 5.2-6.0 ms (H200, 1B shape), and 8-16 rows' steps
and the agents load were unchanged. Linux only: on macOS the same variable sizes Metal's
command buffers, which was not measured.
"""

from __future__ import annotations

import os
import sys

DEFAULTS = {"MLX_CUDA_GRAPH_CACHE_SIZE": "4096"}
if sys.platform.startswith("linux"):
    DEFAULTS["MLX_MAX_OPS_PER_BUFFER"] = "80"

#: The variables this module set (not the user): a peer server we start runs without them.
SET_HERE = tuple(k for k in DEFAULTS if k not in os.environ)


def apply() -> None:
    for key in SET_HERE:
        os.environ[key] = DEFAULTS[key]


def undo() -> None:
    """Drop what `apply` set, before MLX reads it: for a peer server started through
    `import appliance` (bench/targets.py), which runs at MLX's own defaults."""
    for key in SET_HERE:
        os.environ.pop(key, None)


def without_ours() -> dict[str, str]:
    """This process's environment minus what `apply` set (for a peer's own defaults)."""
    return {k: v for k, v in os.environ.items() if k not in SET_HERE}
