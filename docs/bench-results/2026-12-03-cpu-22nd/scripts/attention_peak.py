import appliance
import mlx.core as mx
from appliance.engine.kv import cores
B,Hq,Hk,L,T,D = 1,4,2,512,2560,64
q = mx.random.normal((B,Hq,L,D)); k = mx.random.normal((B,Hk,T,D)); v = mx.random.normal((B,Hk,T,D))
mx.eval(q,k,v)
S = B*Hq*L*T*4
for name, f in [("mlx", lambda: mx.fast.scaled_dot_product_attention(q,k,v,scale=0.125,mask="causal")),
                ("attend", lambda: cores.attend(q,k,v,scale=0.125,mask="causal"))]:
    mx.eval(f()); mx.clear_cache()
    mx.reset_peak_memory(); before = mx.get_active_memory()
    o = f(); mx.eval(o)
    print(name, "peak over before in score matrices: %.2f" % ((mx.get_peak_memory() - before) / S))
