"""devrun only: FORCE_MTP=plain-tapped | plain-untapped: the control never speculates, and
rests (untapped) or not. STEP_OUT=prefix: counts and times of decode steps (by rows) and
prefill passes, written at exit."""
import os
mode = os.environ.get("FORCE_MTP")
if mode or os.environ.get("STEP_OUT"):
    import appliance  # noqa (before mlx)
if mode:
    from appliance.engine.speculate import control
    control.Control.speculate = lambda self, rows, settled=True, left=None: False
    control.Control.resting = lambda self, rows, ahead: mode == "plain-untapped"
if os.environ.get("STEP_OUT"):
    import atexit, json, time, collections
    from appliance.engine import rows as rowsmod, prefill as pf
    st = collections.defaultdict(lambda: [0, 0.0])
    rs, rr = rowsmod._Decoding.step, pf.Prefill.run
    def step(self, model, compiled=None):
        t = time.perf_counter(); out = rs(self, model, compiled)
        e = st[f"decode{len(self.uids)}"]; e[0] += 1; e[1] += time.perf_counter() - t
        return out
    def run(self, chunks, untapped=False):
        t = time.perf_counter(); out = rr(self, chunks, untapped)
        if chunks:
            e = st[f"prefill{len(chunks)}x{max(len(c) for c in chunks)//64*64}"]; e[0] += 1; e[1] += time.perf_counter() - t
        return out
    rowsmod._Decoding.step, pf.Prefill.run = step, run
    atexit.register(lambda: st and open(f"{os.environ['STEP_OUT']}.{os.getpid()}", "w").write(json.dumps(st)))
