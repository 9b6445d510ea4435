"""KV schemes: how rows' KV is held, per layer. See base.py for the layout contract.

A `Scheme` is built from the plan's `kv` section. New rows start from the model's own
(native) caches; `maybe_quantize` encodes a lone row's quantized layers once they hold
`start` tokens (mlx-lm's `quantized_kv_start`), and `merge` builds the batched layouts. In
a batch each row keeps that rule (split.py: rows below `start` native, the rest encoded);
with `start` 0 every row is encoded as it joins.
"""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from appliance.engine.kv.affine import AffineCodec
from appliance.engine.kv.native import FullLayout, RecurrentLayout, SlidingLayout
from appliance.engine.kv.quantized import QuantLayout, QuantRowCache, install
from appliance.engine.kv.split import SplitLayout
from appliance.engine.kv.turboquant import TurboCodec

# A native row cache's type -> the layout that holds many such rows.
NATIVE = {KVCache: FullLayout, RotatingKVCache: SlidingLayout, ArraysCache: RecurrentLayout}
# Row-cache classes a blob may name (the SSD tier loads by class name).
ROW_CACHES = {c.__name__: c for c in (KVCache, RotatingKVCache, ArraysCache, QuantRowCache)}


class Scheme:
    """`codec`: None for native; an AffineCodec or TurboCodec for `quantized_layers`."""

    def __init__(self, codec=None, quantized_layers: tuple[int, ...] = (), start: int = 0,
                 reference: bool = False):
        self.codec, self.quantized = codec, frozenset(quantized_layers if codec else ())
        self.start, self.reference = start, reference
        # per quantized layer; a codec with an outlier split waits for `calibrate`
        self.codecs = {} if getattr(codec, "needs_channels", False) else \
            dict.fromkeys(self.quantized, codec)
        if self.quantized:
            install()

    @classmethod
    def from_plan(cls, kv, reference: bool = False) -> Scheme:
        if kv.scheme == "native":
            return cls()
        if kv.scheme == "affine":
            codec = AffineCodec(kv.group_size, int(kv.key_bits), int(kv.value_bits))
        elif kv.scheme == "turboquant":
            codec = TurboCodec(kv.head_dim, kv.key_bits, kv.value_bits, kv.rotation,
                               kv.rotation_seed)
        else:
            raise ValueError(f"kv scheme {kv.scheme!r} has no layout; valid choices: native, "
                             "affine, turboquant")
        return cls(codec, kv.quantized_layers, kv.start, reference)

    def calibrate(self, model) -> None:
        """Per-layer codecs where the codec splits outlier channels (TurboQuant 3.5 bits):
        found once, from the model (turboquant.calibrate); a no-op otherwise."""
        if self.codecs or not self.quantized:
            return
        from appliance.engine.kv.turboquant import calibrate

        found = calibrate(model, sorted(self.quantized), self.codec.seed)
        self.codecs = {i: self.codec.with_channels(found[i]) for i in self.quantized}

    def layer_codec(self, i: int):
        if i not in self.codecs:
            raise RuntimeError("this scheme splits outlier channels per layer: calibrate it "
                               "on the model first (make_cache does)")
        return self.codecs[i]

    def make_cache(self, model) -> list:
        """A new row's per-layer caches (native until `maybe_quantize` or `merge`)."""
        self.calibrate(model)
        return make_prompt_cache(model)

    def maybe_quantize(self, cache: list) -> None:
        """A lone row: encode its quantized layers once they hold `start` tokens."""
        for i in self.quantized:
            c = cache[i]
            if type(c) is KVCache and c.offset >= self.start:
                cache[i] = QuantRowCache.from_native(c, self.layer_codec(i), self.reference)

    def merge(self, rows: list[list]) -> list:
        """Per layer, one layout holding `rows` (each a list of per-layer row caches)."""
        if not rows:
            return []
        out = []
        for i, layer in enumerate(zip(*rows, strict=True)):
            if i in self.quantized and self.start:  # rows below start stay native
                out.append(SplitLayout.merge(list(layer), self.layer_codec(i), self.start,
                                             self.reference))
                continue
            if i in self.quantized:
                out.append(QuantLayout.merge(list(layer), self.layer_codec(i), self.reference))
                continue
            kind = NATIVE.get(type(layer[0]))
            if kind is None:
                raise ValueError(f"{type(layer[0]).__name__} layers cannot be batched")
            out.append(kind.merge(list(layer)))
            if self.quantized and kind is FullLayout:  # beside encoded layers, whose masks
                out[-1].exact_trim = True  # every full-attention layer shares (its filter)
        return out


def load_blob(path: str) -> tuple[list, dict]:
    """A row cache written by mlx-lm's `save_prompt_cache` (the SSD tier's format), and its
    metadata. Classes are looked up here, so encoded rows load as what they were."""
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
