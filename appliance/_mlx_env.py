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

PATH, for `g++` (`JIT`): MLX's Linux CPU backend compiles the kernels of `mx.compile`d
functions by running `g++ -O3` found on PATH, with no -mfma: its `exp`'s `fma`s are then libm
calls, and the loop calls `exp` rather than inlining it, one value at a time. On an x86-64
CPU with AVX2 and FMA, a `g++` front adds `FLAGS`: `-mavx2 -mfma` (what MLX adds itself when
built with AVX2), `-ffp-contract=off` (no other multiply-add fused), and what lets g++ inline
`exp` and vectorize the loop (a larger inlining limit; `-fno-trapping-math`, which lets it
compute both sides of exp's range checks and select: no value changes, MLX reads no FP
flags). Each value's arithmetic is unchanged, so a kernel's bits equal `mx.exp`'s (an `fma`
rounds once, in libm or in hardware). 2-core EPYC, `exp` over 4.3M floats: 68 ms `mx.exp`,
19 ms with FMA alone, 4 ms vectorized. Attention on CPU uses it for its softmax
(engine/kv/cores.py).

TMPDIR, with the front: MLX keeps its compiled kernels in `<TMPDIR>/mlx/<version>/cpu` by
kernel name, not by compiler flags, and reuses one it finds. With the front the process gets
a temporary directory of its own per front (`<TMPDIR>/appliance-jit-<hash>`; its children,
whose TMPDIR it already is, share it), so a kernel built by a peer without it, or by an
older front, is never reused. `APPLIANCE_JIT_FRONT=0`
leaves MLX's JIT and TMPDIR as they are.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULTS = {"MLX_CUDA_GRAPH_CACHE_SIZE": "4096"}
if sys.platform.startswith("linux"):
    DEFAULTS["MLX_MAX_OPS_PER_BUFFER"] = "80"

#: The variables this module set (not the user): a peer server we start runs without them.
SET_HERE = tuple(k for k in DEFAULTS if k not in os.environ)


#: What the `g++` front adds to MLX's JIT command (see above).
FLAGS = "-mavx2 -mfma -ffp-contract=off -fno-trapping-math --param max-inline-insns-auto=300"
#: The directory of the `g++` front on PATH, or None where MLX's JIT runs as it is.
JIT: str | None = None
PROBLEM: str | None = None  # a bad APPLIANCE_JIT_FRONT: every plan names it (resolve.py)
_TMPDIR: str | None = None  # the user's TMPDIR, set aside while the front is on


def _jit_front() -> str | None:
    """Write the `g++` front where the CPU has AVX2 and FMA and a g++ is installed; return
    its directory (None otherwise, or where it cannot be written)."""
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        return None
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo")
                      if line.startswith("flags")), [])
    except OSError:
        return None
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "appliance" / "jit"
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p) != home)  # (never the front itself)
    gxx = shutil.which("g++", path=path)
    if not {"avx2", "fma"} <= set(flags) or gxx is None:
        return None
    text = f'#!/bin/sh\nexec "{gxx}" {FLAGS} "$@"\n'
    front = home / "g++"
    try:
        if not front.is_file() or front.read_text() != text:
            home.mkdir(parents=True, exist_ok=True)
            tmp = home / f".g++.{os.getpid()}"
            tmp.write_text(text)
            tmp.chmod(0o755)
            os.replace(tmp, front)  # (another process may write the same at once)
    except OSError:
        return None
    return str(home) if _own_tmpdir(text) else None


def _own_tmpdir(front: str) -> bool:
    """TMPDIR set to a directory of this front's own (MLX's kernel cache lives under it)."""
    global _TMPDIR
    key = hashlib.sha1(front.encode()).hexdigest()[:12]
    tmp = Path(tempfile.gettempdir())
    inherited = tmp.name == f"appliance-jit-{key}"  # (a child of a process with the front)
    own = tmp if inherited else tmp / f"appliance-jit-{key}"
    try:
        own.mkdir(exist_ok=True)
    except OSError:
        return False
    _TMPDIR = str(tmp.parent) if inherited else os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(own)
    tempfile.tempdir = None  # (Python's own temporary files follow)
    return True


def apply() -> None:
    global JIT, PROBLEM
    for key in SET_HERE:
        os.environ[key] = DEFAULTS[key]
    front = os.environ.get("APPLIANCE_JIT_FRONT", "1")
    if front not in ("0", "1"):  # (a plan error, not a traceback at import)
        PROBLEM = (f"APPLIANCE_JIT_FRONT={front!r}: valid choices: 0 (MLX's JIT as it is), 1 "
                   "(the default: the g++ front where the CPU has FMA)")
        return
    if JIT is None and front == "1":
        JIT = _jit_front()
        if JIT is not None:
            os.environ["PATH"] = JIT + os.pathsep + os.environ.get("PATH", "")


def _path_without_front() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p != JIT)


def undo() -> None:
    """Drop what `apply` set, before MLX reads it: for a peer server started through
    `import appliance` (bench/targets.py), which runs at MLX's own defaults."""
    global JIT
    for key in SET_HERE:
        os.environ.pop(key, None)
    if JIT is not None:
        os.environ["PATH"], JIT = _path_without_front(), None
        _restore_tmpdir(os.environ)
        tempfile.tempdir = None


def _restore_tmpdir(env: dict) -> None:
    if _TMPDIR is None:
        env.pop("TMPDIR", None)
    else:
        env["TMPDIR"] = _TMPDIR


def without_ours() -> dict[str, str]:
    """This process's environment minus what `apply` set (for a peer's own defaults)."""
    env = {k: v for k, v in os.environ.items() if k not in SET_HERE}
    if JIT is not None:
        env["PATH"] = _path_without_front()
        _restore_tmpdir(env)
    return env
