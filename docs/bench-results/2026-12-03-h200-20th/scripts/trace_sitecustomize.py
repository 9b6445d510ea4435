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
