import time, appliance, mlx.core as mx
from appliance.engine.kv import cores
mx.random.seed(0)
B,H,KV,L,T,D = 1,4,2,512,2560,64
q = mx.random.normal((B,KV,2,L,D)); k = mx.random.normal((B,KV,1,T,D)); v = mx.random.normal((B,KV,1,T,D))
mask = mx.arange(T-L, T)[:, None] >= mx.arange(T)[None]
mx.eval(q,k,v,mask)
def tm(name, fn, n=7):
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); r=fn(); mx.eval(r); ts.append(time.perf_counter()-t)
    print(f"{name:12s} {1000*min(ts):7.2f} ms"); return r
s = tm("scores", lambda: q @ mx.swapaxes(k,-1,-2))
sm = tm("mask", lambda: mx.where(mask, s, mx.array(mx.finfo(s.dtype).min)))
m = tm("max", lambda: mx.max(sm, axis=-1, keepdims=True))
d = tm("sub", lambda: sm - m)
e = tm("exp", lambda: cores._exp(d, cores._ZERO))
ssum = tm("sum", lambda: mx.sum(e, axis=-1, keepdims=True))
p = tm("mul", lambda: e * (1/ssum))
o = tm("values", lambda: p @ v)
qq = q.reshape(B,H,L,D); kk=k.reshape(B,KV,T,D); vv=v.reshape(B,KV,T,D); mx.eval(qq,kk,vv)
tm("attend", lambda: cores.attend(qq,kk,vv,scale=0.125,mask="causal"))
tm("fused(mlx)", lambda: cores._fused(qq,kk,vv,scale=0.125,mask="causal"))
