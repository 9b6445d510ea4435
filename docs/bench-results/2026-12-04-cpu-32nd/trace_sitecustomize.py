"""devrun only: TRACE_OUT=prefix: per decode step (rows, kind, seconds) and prefill passes."""
import os
if os.environ.get("TRACE_OUT"):
    import appliance  # noqa (before mlx)
    import atexit, json, time, collections
    from appliance.engine import step as stepmod, prefill as pf
    from appliance.engine.speculate import drafters
    st = collections.defaultdict(lambda: [0, 0.0]); tl = []
    ds, rr, mp = stepmod.BatchStep._decode_step, pf.Prefill.run, drafters.MTPDrafter.propose
    def dstep(self):
        t = time.perf_counter(); n0 = self.spec_ticks
        rows = len(self._decode)
        rest = self._bare is not None and self.control.resting(rows, drafters.LAG_MAX + 1)
        out = ds(self)
        kind = "spec" if self.spec_ticks > n0 else ("asked" if self._asked else ("rest" if rest else "plain"))
        e = st[f"{kind}{rows}"]; e[0] += 1; e[1] += time.perf_counter() - t
        if self.control is not None:
            m = self.control._modes.get(rows)
            tl.append((rows, kind, self.control._winner(rows), None if m is None else (m.winner, m.probe_at - self.control._ticks.get(rows, 0))))
        return out
    def run(self, chunks, untapped=False):
        t = time.perf_counter(); out = rr(self, chunks, untapped)
        if chunks:
            e = st[f"prefill{'U' if untapped else 'T'}"]; e[0] += 1; e[1] += time.perf_counter() - t
        return out
    def propose(self, *a, **k):
        t = time.perf_counter(); out = mp(self, *a, **k)
        e = st["propose"]; e[0] += 1; e[1] += time.perf_counter() - t
        return out
    stepmod.BatchStep._decode_step, pf.Prefill.run, drafters.MTPDrafter.propose = dstep, run, propose
    atexit.register(lambda: st and open(f"{os.environ['TRACE_OUT']}.{os.getpid()}", "w").write(json.dumps({"st": st, "tl": tl})))
