import time, appliance, mlx.core as mx
from appliance.engine.kv import cores
mx.random.seed(0)
B,H,KV,L,T,D = 1,4,2,512,2560,64
qq = mx.random.normal((B,H,L,D)); kk = mx.random.normal((B,KV,T,D)); vv = mx.random.normal((B,KV,T,D))
mx.eval(qq,kk,vv)
MIN = mx.array(mx.finfo(mx.float32).min, mx.float32)
_where = mx.compile(lambda m, s, lo: mx.where(m, s, lo), shapeless=True)
_expb = mx.compile(lambda s, m: mx.exp(s - m), shapeless=True)
_mul = mx.compile(lambda e, r: e * r, shapeless=True)
def v1(queries, keys, values, scale, variant):
    q = mx.array(scale, queries.dtype) * queries
    q = q.reshape(B, KV, 2, L, D); keys, values = mx.expand_dims(keys, 2), mx.expand_dims(values, 2)
    s = q @ mx.swapaxes(keys, -1, -2)
    mask = mx.arange(T - L, T)[:, None] >= mx.arange(T)[None]
    s = _where(mask, s, MIN) if "w" in variant else mx.where(mask, s, MIN)
    m = mx.max(s, axis=-1, keepdims=True)
    e = _expb(s, m) if "e" in variant else cores._exp(s - m, cores._ZERO)
    r = 1 / mx.sum(e, axis=-1, keepdims=True)
    p = _mul(e, r) if "m" in variant else e * r
    return (p @ values).reshape(B, H, L, D)
ref = cores.attend(qq, kk, vv, scale=0.125, mask="causal"); mx.eval(ref)
for variant in ["", "w", "e", "m", "wem"]:
    out = v1(qq, kk, vv, 0.125, variant); mx.eval(out)
    assert mx.array_equal(out, ref).item(), variant
res = {}
for rnd in range(3):
    for variant in ["cur", "", "w", "e", "m", "wem"]:
        fn = (lambda: cores.attend(qq, kk, vv, scale=0.125, mask="causal")) if variant == "cur" else (lambda: v1(qq, kk, vv, 0.125, variant))
        ts = []
        for _ in range(7):
            t = time.perf_counter(); mx.eval(fn()); ts.append(time.perf_counter() - t)
        res.setdefault(variant, []).append(1000 * sorted(ts)[3])
for k, v in res.items(): print(f"{k or 'plain':6s}", " ".join(f"{x:6.1f}" for x in v))
