import appliance, time
import mlx.core as mx
from appliance.engine.kv import cores
def tm(name, f, n=7):
    mx.eval(f()); t = time.perf_counter()
    for _ in range(n): mx.eval(f())
    print(f"{name:28s} {(time.perf_counter()-t)/n*1e3:.1f} ms")
B,Hq,Hk,L,T,D = 1,4,2,512,2560,64
q = mx.random.normal((B,Hq,L,D)); k = mx.random.normal((B,Hk,T,D)); v = mx.random.normal((B,Hk,T,D))
mx.eval(q,k,v)
f = lambda: mx.fast.scaled_dot_product_attention(q,k,v,scale=0.125,mask="causal")
for mode in ["mlx", "mlx-split", "one", "split"]:
    cores.reset()
    real = cores.compiled_softmax
    if mode == "mlx-split": cores.compiled_softmax = lambda: False
    if mode != "mlx": cores.use(1 if mode == "one" else 2)
    cores.compiled_softmax = real
    tm(mode, f)
cores.reset()
