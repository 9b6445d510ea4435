# Per-step trace of an appliance server (decode steps, prefill passes, joins), written at exit to
# $APPL_TRACE. Use: copy to a directory as sitecustomize.py and run the bench with
# PYTHONPATH=<that directory> APPL_TRACE=/tmp/x.jsonl (only the `serve` process traces).
import os, time, json, atexit
if os.environ.get("APPL_TRACE") and "serve" in " ".join(__import__("sys").argv):
    import appliance  # noqa
    from appliance.engine import step as S, prefill as P
    import mlx.core as mx
    _log = []
    _f = os.environ["APPL_TRACE"]
    atexit.register(lambda: open(_f, "w").write("\n".join(json.dumps(x) for x in _log)))
    _ds = S.BatchStep._decode_step
    def dstep(self):
        d = self._decode
        L = d.layers[0] if d.layers else None
        T = L.keys.shape[2] if L is not None and L.keys is not None else 0
        idx = getattr(L, "_idx", 0)
        t = time.perf_counter(); out = _ds(self); dt = time.perf_counter() - t
        _log.append({"k": "d", "t": t, "dt": dt, "B": len(d), "T": T, "idx": idx})
        return out
    S.BatchStep._decode_step = dstep
    _pr = P.Prefill.run
    def prun(self, chunks):
        t = time.perf_counter(); out = _pr(self, chunks); dt = time.perf_counter() - t
        L = self.batch.layers[0] if self.batch.layers else None
        _log.append({"k": "p", "t": t, "dt": dt, "n": [len(c) for c in chunks],
                     "idx": getattr(L, "_idx", 0)})
        return out
    P.Prefill.run = prun
    _sd = S.BatchStep._start_decoding
    def sdec(self, ready):
        t = time.perf_counter(); out = _sd(self, ready); dt = time.perf_counter() - t
        _log.append({"k": "j", "t": t, "dt": dt, "n": len(ready)})
        return out
    S.BatchStep._start_decoding = sdec
