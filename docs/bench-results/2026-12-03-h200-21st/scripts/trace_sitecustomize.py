"""Per-step trace of the engine (devrun only): set APPLIANCE_TRACE=/path/prefix; each
process that builds a ContinuousScheduler appends one JSON line per step to
<prefix>.<pid>.jsonl with the step's wall time and where it went."""
import os

if os.environ.get("APPLIANCE_TRACE"):
    import atexit
    import functools
    import json
    import time

    import appliance  # noqa: F401  (before mlx)
    from appliance.engine import continuous, prefill, prefix_cache, ssd_tier, step

    _acc: dict = {}
    _lines: list = []
    _path = f"{os.environ['APPLIANCE_TRACE']}.{os.getpid()}.jsonl"

    def wrap(cls, name, key, extra=None):
        f = getattr(cls, name)

        @functools.wraps(f)
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                _acc[key] = _acc.get(key, 0.0) + time.perf_counter() - t
                _acc[key + "_n"] = _acc.get(key + "_n", 0) + 1
                if extra:
                    extra(a, k)
        setattr(cls, name, g)

    def chunks(a, k):
        _acc["chunk_tok"] = _acc.get("chunk_tok", 0) + sum(len(c) for c in a[1])
        _acc["chunk_rows"] = len(a[1])

    wrap(step.BatchStep, "tick", "tick")
    wrap(step.BatchStep, "_decode_step", "decode")
    wrap(prefill.Prefill, "run", "prefill", chunks)
    wrap(continuous.ContinuousScheduler, "_store", "store")
    wrap(continuous.ContinuousScheduler, "_admit", "admit")
    wrap(continuous.ContinuousScheduler, "_solo_step", "solo")
    wrap(continuous.ContinuousScheduler, "_trim", "trim")
    wrap(prefix_cache.PrefixCache, "lookup", "lookup")
    wrap(prefix_cache.PrefixCache, "flush", "flush")
    wrap(ssd_tier.SsdTier, "put", "ssd_put")
    wrap(ssd_tier.SsdTier, "step_started", "ssd_started")

    f0 = continuous.ContinuousScheduler.step

    def traced(self, *a, **k):
        _acc.clear()
        t = time.perf_counter()
        f0(self, *a, **k)
        rec = {"t": round(t, 6), "dt": round(time.perf_counter() - t, 6),
               "rows": len(self._rows), "is_solo": self._solo is not None,
               "wait": len(self._waiting)}
        rec.update({k: (round(v, 6) if isinstance(v, float) else v) for k, v in _acc.items()})
        _lines.append(rec)
        if len(_lines) >= 50:
            flush()

    def flush():
        with open(_path, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in _lines)
        _lines.clear()

    continuous.ContinuousScheduler.step = traced
    atexit.register(flush)

if os.environ.get("APPLIANCE_EXP") == "async":  # 21st session: prefill and stores not waiting
    import appliance  # noqa: F401
    import mlx.core as _mx
    from appliance.engine import prefill as _pf, prefix_cache as _pc

    class _Proxy:
        def __getattr__(self, k):
            return _mx.async_eval if k == "eval" else getattr(_mx, k)

    _pf.mx = _Proxy()

    def _materialize(cache):
        from mlx.utils import tree_flatten
        _mx.async_eval([x for c in cache for _, x in tree_flatten(c.state)
                        if isinstance(x, _mx.array)])

    _pc.materialize = _materialize

if os.environ.get("APPLIANCE_TRACE") and os.environ.get("APPLIANCE_FINE"):
    # 21st session: inside the decode step: graph build, async_eval, waits; thread CPU time
    import mlx.core as _mx2
    from appliance.engine import rows as _rows, prefix_cache as _pc2, step as _st

    class _Timed:
        def __getattr__(self, k):
            f = getattr(_mx2, k)
            if k not in ("eval", "async_eval"):
                return f

            def g(*a, **kw):
                t = time.perf_counter()
                try:
                    return f(*a, **kw)
                finally:
                    key = "r_" + k
                    _acc[key] = _acc.get(key, 0.0) + time.perf_counter() - t
                    if k == "async_eval" and "r_first_async" not in _acc:
                        _acc["r_first_async"] = t - _acc.get("_t0", t)
            return g

    _rows.mx = _Timed()
    wrap(_rows._Decoding, "filter", "filter")
    wrap(_rows._Decoding, "extend", "extend")
    wrap(_rows._Batch, "extract", "extract")
    wrap(_st.BatchStep, "_start_decoding", "start")
    _m0 = _pc2.materialize

    def _mat(cache):
        t = time.perf_counter()
        _m0(cache)
        _acc["mat"] = _acc.get("mat", 0.0) + time.perf_counter() - t
    _pc2.materialize = _mat
    _s0 = _rows._Decoding.step

    def _step(self, *a, **k):
        _acc["_t0"] = time.perf_counter()
        c0 = time.thread_time()
        try:
            return _s0(self, *a, **k)
        finally:
            _acc["r_cpu"] = _acc.get("r_cpu", 0.0) + time.thread_time() - c0
            _acc["r_step"] = _acc.get("r_step", 0.0) + time.perf_counter() - _acc["_t0"]
    _rows._Decoding.step = _step
