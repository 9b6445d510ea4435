import time, numpy as np, appliance, mlx.core as mx
f = mx.compile(lambda d, z: mx.exp(d - z), shapeless=True)
z = mx.array(0.0)
rng = np.random.default_rng(0)
x = np.concatenate([rng.uniform(-100, 100, 4_000_000), rng.uniform(-20, 0, 4_000_000),
                    [np.nan, np.inf, -np.inf, 88.0, -88.0, 88.1, -88.1, 0.0, -0.0]]).astype(np.float32)
# every float32 bit pattern in a slice too
bits = np.arange(0, 2**32, 97, dtype=np.uint64).astype(np.uint32).view(np.float32)
for arr in (x, bits):
    a = mx.array(arr)
    r1, r2 = mx.exp(a), f(a, z)
    mx.eval(r1, r2)
    n1, n2 = np.array(r1), np.array(r2)
    print("bit-equal:", np.array_equal(n1.view(np.uint32), n2.view(np.uint32)), arr.size)
a = mx.array(rng.uniform(-30, 0, 4_300_000).astype(np.float32)); mx.eval(a)
for name, fn in (("mx.exp", lambda: mx.exp(a)), ("compiled", lambda: f(a, z))):
    ts = []
    for _ in range(7):
        t = time.perf_counter(); mx.eval(fn()); ts.append(time.perf_counter() - t)
    print(name, "%.1f ms" % (1000 * min(ts)))
