"""Phase timing inside the appliance server (env PHASE_LOG=path): one JSON line per call of
the engine step's phases. Loaded by any python with devrun/prof_site on PYTHONPATH."""
import os

if os.environ.get("SWITCH"):
    import sys
    sys.setswitchinterval(float(os.environ["SWITCH"]))

if os.environ.get("PHASE_LOG"):
    import atexit
    import json
    import threading
    import time

    _out = open(os.environ["PHASE_LOG"] + f".{os.getpid()}", "w", buffering=1 << 16)
    atexit.register(_out.close)
    _lock = threading.Lock()

    _acc = {}  # thread id -> [eval s, async_eval s]

    def _patch():
        try:
            import appliance  # noqa: F401
            import mlx.core as mx
            from appliance.engine import continuous, step
        except Exception:
            return
        for k, name in enumerate(("eval", "async_eval")):
            f0 = getattr(mx, name)

            def timed(*a, _f=f0, _k=k, **kw):
                t = time.perf_counter()
                try:
                    return _f(*a, **kw)
                finally:
                    acc = _acc.setdefault(threading.get_ident(), [0.0, 0.0])
                    acc[_k] += time.perf_counter() - t
            setattr(mx, name, timed)
        S = step.BatchStep

        def wrap(cls, name, info):
            f = getattr(cls, name)

            def g(self, *a, **k):
                pre = info(self, *a) if info else None
                acc = _acc.setdefault(threading.get_ident(), [0.0, 0.0])
                e0, a0 = acc
                t, c = time.perf_counter(), time.thread_time()
                r = f(self, *a, **k)
                dt, dc = time.perf_counter() - t, time.thread_time() - c
                e1, a1 = _acc[threading.get_ident()]
                with _lock:
                    _out.write(json.dumps({"p": cls.__name__[:4] + "." + name, "t": round(t, 4), "s": round(dt, 5), "c": round(dc, 5), "e": round(e1 - e0, 5), "a": round(a1 - a0, 5),
                                           "i": pre}) + "\n")
                return r
            setattr(cls, name, g)

        def pre_chunk(self, chunks):
            lay = self._prefill.layers
            return [[len(c) for c in chunks], int(getattr(lay[0], "_idx", -1)) if lay else None]

        wrap(S, "_prefill_chunk", pre_chunk)
        wrap(S, "_decode_step", lambda self: [len(self._decode), max(map(len, self._decode.tokens))])
        wrap(S, "_start_decoding", lambda self, ready: len(ready))
        wrap(S, "_admit", lambda self, n: n)
        C = continuous.ContinuousScheduler
        wrap(C, "_store", lambda self, tokens, *a, **k: len(tokens))
        wrap(C, "_step", None)
        wrap(C, "_admit", None)
        wrap(C, "_on_token", None)
        wrap(C, "_reap_cancelled", None)
        wrap(S, "tick", None)

    import builtins
    _orig_import = builtins.__import__
    _done = [False]

    def _hook(name, *a, **k):  # patch once appliance.engine.continuous is importable
        m = _orig_import(name, *a, **k)
        if not _done[0] and name.startswith("appliance.serve"):
            _done[0] = True
            _patch()
        return m
    builtins.__import__ = _hook
