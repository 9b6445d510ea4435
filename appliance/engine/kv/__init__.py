"""KV schemes: how rows' KV is held, per layer. See base.py for the layout contract.

A `Scheme` is built from the plan's `kv` section. New rows start from the model's own
(native) caches; `maybe_quantize` converts a lone row's quantized layers once it holds
`start` tokens (mlx-lm's `quantized_kv_start`), and `merge` builds the batched layouts,
quantizing native rows of quantized layers as they join (a batch holds one format).
"""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from appliance.engine.kv.affine import AffineLayout, AffineRowCache, install
from appliance.engine.kv.native import FullLayout, RecurrentLayout, SlidingLayout

# A native row cache's type -> the layout that holds many such rows.
NATIVE = {KVCache: FullLayout, RotatingKVCache: SlidingLayout, ArraysCache: RecurrentLayout}
# Row-cache classes a blob may name (the SSD tier loads by class name).
ROW_CACHES = {c.__name__: c for c in (KVCache, RotatingKVCache, ArraysCache, AffineRowCache)}


class Scheme:
    def __init__(self, name: str = "native", quantized_layers: tuple[int, ...] = (),
                 key_bits: int | None = None, value_bits: int | None = None,
                 group_size: int | None = None, start: int = 0, reference: bool = False):
        if name not in ("native", "affine"):
            raise ValueError(f"kv scheme {name!r} has no layout; valid choices: native, affine")
        self.name, self.quantized = name, frozenset(quantized_layers)
        self.start = start
        self.settings = {"group_size": group_size, "key_bits": int(key_bits or 0),
                         "value_bits": int(value_bits or 0), "reference": reference}
        if self.quantized:
            install()

    @classmethod
    def from_plan(cls, kv, reference: bool = False) -> Scheme:
        return cls(kv.scheme, kv.quantized_layers, kv.key_bits, kv.value_bits, kv.group_size,
                   kv.start, reference)

    def make_cache(self, model) -> list:
        """A new row's per-layer caches (native until `maybe_quantize` or `merge`)."""
        return make_prompt_cache(model)

    def maybe_quantize(self, cache: list) -> None:
        """A lone row: quantize its quantized layers once they hold `start` tokens."""
        for i in self.quantized:
            c = cache[i]
            if type(c) is KVCache and c.offset >= self.start:
                cache[i] = AffineRowCache.from_native(c, **self.settings)

    def merge(self, rows: list[list]) -> list:
        """Per layer, one layout holding `rows` (each a list of per-layer row caches)."""
        if not rows:
            return []
        out = []
        for i, layer in enumerate(zip(*rows, strict=True)):
            if i in self.quantized:
                out.append(AffineLayout.merge(list(layer), **self.settings))
                continue
            kind = NATIVE.get(type(layer[0]))
            if kind is None:
                raise ValueError(f"{type(layer[0]).__name__} layers cannot be batched")
            out.append(kind.merge(list(layer)))
        return out


def load_blob(path: str) -> tuple[list, dict]:
    """A row cache written by mlx-lm's `save_prompt_cache` (the SSD tier's format), and its
    metadata. Classes are looked up here, so quantized rows load as what they were."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    arrays, meta = mx.load(path, return_metadata=True)
    info, classes, scalars = tree_unflatten(list(meta.items()))
    for pos, kind in scalars[1:]:  # non-array state fields were stored as arrays
        a = arrays[pos]
        arrays[pos] = (a.item() if kind == "scalar" else None if kind == "none"
                       else "".join(map(chr, a.tolist())))
    states = tree_unflatten(list(arrays.items()))
    unknown = [c for c in classes if c not in ROW_CACHES]
    if unknown:
        raise ValueError(f"unknown cache classes {unknown}")
    return [ROW_CACHES[c].from_state(st) for c, st in zip(classes, states, strict=True)], info
