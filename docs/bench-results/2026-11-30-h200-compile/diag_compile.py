"""Device: why the compiled step is slower at B=8/32: plain, plain over whole buffers,
compiled, and the compiled function run uncompiled (mx.disable_compile)."""
import sys

import mlx.core as mx

import appliance  # noqa: F401
from appliance.bench.kv import batched_decode, compose_plan
from appliance.bench.prompts import model_dir
from appliance.engine import rows as rows_mod
from appliance.engine import runner

shape = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-1b"
B, CTX = int(sys.argv[2]), int(sys.argv[3])
base = ["model=synthetic", f"model.shape={shape}"]
plain, comp = (compose_plan(base + [f"batch.compile_step={c}"]) for c in ("false", "true"))
orig = rows_mod._Decoding.step


def whole_step(self, model, compiled=None):
    for c in self.layers:
        c.reserve(1)
        c.whole_buffer = True
    try:
        return orig(self, model, compiled)
    finally:
        for c in self.layers:
            c.whole_buffer = False


with mx.stream(mx.new_stream(mx.default_device())):
    model, _ = runner.load(str(model_dir(plain)), plain.model.dtype, None)
    for name in ("plain", "whole", "compiled", "traced-uncompiled", "plain"):
        p = comp if name in ("compiled", "traced-uncompiled") else plain
        rows_mod._Decoding.step = whole_step if name == "whole" else orig
        if name == "traced-uncompiled":
            mx.disable_compile()
        r = batched_decode(model, p, B, CTX, 64, 3, 0)
        mx.enable_compile()
        print(f"{shape} B={B} ctx={CTX} {name}: {[round(x, 1) for x in r['runs']]}", flush=True)
