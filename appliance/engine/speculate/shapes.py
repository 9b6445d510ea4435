"""The CUDA shape policy every multi-token pass follows: the verify pass
(`appliance/engine/verify.py`), the step that sizes it, the drafters' feeds and prefill.
"""

from __future__ import annotations

from appliance.engine.kv.native import on_cuda

# Multi-token passes attend over whole KV buffers where MLX compiles per key length (CUDA).
WHOLE_BUFFER = on_cuda()


def pass_width(n: int) -> int:
    """The tokens per row a multi-token pass of n feeds where shapes compile (CUDA), right-
    padded: a power of two up to 256, then a multiple of 256. Every new (query length, key
    length) pair builds new graphs on MLX's CUDA backend, 50-150 ms each on an H200, so a
    pass whose width follows its content (a prefix hit's tail, a drafter catching up on the
    tokens of its plain steps) paid that at nearly every call; these widths recur."""
    if n <= 256:
        return 1 << max(0, n - 1).bit_length()
    return -(-n // 256) * 256
