import appliance, time
import mlx.core as mx
S2 = mx.new_stream(mx.cpu)
def sdpa(q,k,v,mask=None):
    return mx.fast.scaled_dot_product_attention(q,k,v,scale=0.125,mask=mask)
def split(q,k,v,mask=None):
    a = sdpa(q[:, :2], k[:, :1], v[:, :1], mask)
    with mx.stream(S2):
        b = sdpa(q[:, 2:], k[:, 1:], v[:, 1:], mask)
    return mx.concatenate([a, b], axis=1)
def bench(f, *args, n=100):
    mx.eval(f(*args))
    t=time.perf_counter()
    for _ in range(n): mx.eval(f(*args))
    return (time.perf_counter()-t)/n*1e6
for (B,L,T) in [(16,1,256),(32,1,256),(8,1,512),(1,1,4096),(2,1,2048),(32,1,512)]:
    q=mx.random.normal((B,4,L,64)); k=mx.random.normal((B,2,T,64)); v=mx.random.normal((B,2,T,64))
    mask = "causal" if L>1 else None
    mx.eval(q,k,v)
    r = [bench(sdpa,q,k,v,mask), bench(split,q,k,v,mask), bench(sdpa,q,k,v,mask), bench(split,q,k,v,mask)]
    print(B,L,T, "scores", B*4*L*T, "one %.0f/%.0f us  split %.0f/%.0f us" % (r[0], r[2], r[1], r[3]))
