"""The SSD tier's blobs: the private copy an entry is written from, its safetensors
bytes, and the crc32 of each chunk (a chain of delta blobs is joined by
`prefix_cache.joined`).

The engine thread makes the copy (`_frozen`) and the tensors (`_tensors`: mlx-lm's
`save_prompt_cache` names and encoding, so `kv.load_blob` reads a blob back); the writer
thread only writes bytes (`write_safetensors`) and checksums them (`checksums`), with no MLX
work of its own.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 16 << 20  # bytes per checksummed chunk
_POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                           thread_name_prefix="ssd-verify")  # zlib releases the GIL


def _chunk_crc(path: Path, offset: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return zlib.crc32(os.pread(fd, CHUNK, offset))
    finally:
        os.close(fd)


def checksums(path: Path, size: int, parallel: bool = True) -> list[int]:
    """crc32 of each CHUNK-byte slice of the file: in parallel when a restore waits on it,
    serially on the (niced) writer thread."""
    mapper = _POOL.map if parallel else map
    return list(mapper(lambda off: _chunk_crc(path, off), range(0, max(size, 1), CHUNK)))


ROW = 16  # bytes per row of the copy buffer (any dtype views a 16-byte aligned offset)


def _frozen(cache: list, start: int = 0) -> list:
    """What the writer thread serializes: a copy of each layer's state, made on the engine
    thread as views into one new, evaluated byte buffer (so writing runs no MLX work there
    and never races the live cache). A KVCache's buffer grows 256 slots at a time: only its
    `offset` filled slots are kept, from slot `start` on (a delta over a stored prefix:
    only KVCache layers, whose slots are the tokens).

    One buffer of its own because of MLX's CUDA backend, where reading a GPU buffer on the
    host first moves it to managed memory with a synchronous copy: once per blob, not once
    per array; and never a RAM-tier entry's buffer, which would then be paged back to the
    GPU on its next hit. The buffer is 2-D, ROW bytes wide: MLX shape dimensions are 32-bit,
    and a long prefix of a large model is more than 2 GiB (a 70B model's 8k prefix: 2.7 GB)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.models.cache import KVCache

    assert not start or all(type(c) is KVCache for c in cache)
    states = [(c.keys[..., start:c.offset, :], c.values[..., start:c.offset, :],
               c.offset - start)
              if type(c) is KVCache and c.keys is not None else c.state for c in cache]
    arrays = [x for _, x in tree_flatten(states) if isinstance(x, mx.array)]
    if not arrays:
        return [type(c).from_state(s) for c, s in zip(cache, states, strict=True)]
    parts, spans, row = [], [], 0
    for x in arrays:  # each array from a row of its own
        flat = x.reshape(-1).view(mx.uint8)
        if pad := -x.nbytes % ROW:
            flat = mx.concatenate([flat, mx.zeros((pad,), mx.uint8)])
        parts.append(flat.reshape(-1, ROW))
        spans.append((row, x))
        row += parts[-1].shape[0]
    buffer = mx.concatenate(parts)
    mx.eval(buffer)
    del parts, flat  # the flattened copies: only `buffer` stays
    views = iter([buffer[r:r + -(-x.nbytes // ROW)].reshape(-1)[:x.nbytes].view(x.dtype)
                  .reshape(x.shape) for r, x in spans])
    states = tree_map(lambda x: next(views) if isinstance(x, mx.array) else x, states)
    mx.eval([x for _, x in tree_flatten(states) if isinstance(x, mx.array)])
    return [type(c).from_state(s) for c, s in zip(cache, states, strict=True)]


_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint8": "U8",
           "uint16": "U16", "uint32": "U32", "int8": "I8", "int16": "I16", "int32": "I32",
           "int64": "I64", "uint64": "U64", "bool": "BOOL"}


def _tensors(cache: list, metadata: dict[str, str]) -> tuple[list, dict]:
    """On the engine thread: what mlx-lm's `save_prompt_cache` would write for `cache`
    (the same names, classes and scalar encoding, so `load_blob` reads it as before), as
    evaluated arrays, each with its safetensors dtype; bfloat16 viewed as uint16 (the
    buffer protocol has no bfloat16)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    scalars: list = [""]  # non-empty, else tree_flatten drops it
    tensors = []
    for name, x in tree_flatten([c.state for c in cache]):
        if not isinstance(x, mx.array):
            kind = ("none" if x is None else "string" if isinstance(x, str) else "scalar")
            scalars.append((name, kind))
            x = (mx.array([]) if x is None else mx.array([ord(ch) for ch in x])
                 if isinstance(x, str) else mx.array(x))
        code = _DTYPES[str(x.dtype).split(".")[-1]]
        tensors.append((name, x.view(mx.uint16) if code == "BF16" else x, code))
    mx.eval([x for _, x, _ in tensors])
    meta = dict(tree_flatten([metadata, [type(c).__name__ for c in cache], scalars]))
    return tensors, meta


def write_safetensors(path: Path, tensors: list, metadata: dict[str, str]) -> None:
    """The writer: a safetensors file from evaluated arrays, read through the buffer
    protocol (no MLX work on this thread)."""
    import json
    import struct

    import numpy as np

    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, x, code in tensors:
        header[name] = {"dtype": code, "shape": list(x.shape),
                        "data_offsets": [offset, offset + x.nbytes]}
        offset += x.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, x, _ in tensors:
            if x.nbytes:
                f.write(memoryview(np.asarray(x)).cast("B"))
