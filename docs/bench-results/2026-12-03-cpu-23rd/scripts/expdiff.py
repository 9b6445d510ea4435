import sys, numpy as np, appliance, mlx.core as mx
f = mx.compile(lambda d, z: mx.exp(d - z), shapeless=True)
bits = np.arange(0, 2**32, 7, dtype=np.uint64).astype(np.uint32).view(np.float32)
a = mx.array(bits)
r1, r2 = mx.exp(a), f(a, mx.array(0.0)); mx.eval(r1, r2)
n1, n2 = np.array(r1), np.array(r2)
d = n1.view(np.uint32) != n2.view(np.uint32)
print("diffs vs mx.exp", d.sum(), "nan-in:", np.isnan(bits[d]).all())
np.save(sys.argv[1], n2)
