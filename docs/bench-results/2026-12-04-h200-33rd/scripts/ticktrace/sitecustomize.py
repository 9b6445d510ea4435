"""devrun only: with TRACE_OUT=<prefix>, the engine's batched work, event by event: decode
steps (rows, seconds), prefill passes (rows, tokens, seconds) and the last-prompt-token
steps of rows joining (rows, seconds), written as JSON lines to <prefix>.<pid>. Why: the
8B agents run's steps that carry prefill take 8-16 s a run for the same work (30th-33rd
sessions); which of the three parts that time is in, and how it scales with tokens, is
not measured. Before a join or a prefill pass the device is drained ("drain": the decode
step queued before it), so each part's wall time is its own; the trace so costs the
pipelining of those ticks. (Fixed in the 36th: the prefill pass is synced after it too,
as the engine no longer waits for it.)"""
import os

if os.environ.get("TRACE_OUT"):
    import atexit
    import json
    import time

    import appliance  # noqa: F401  (before mlx)
    import mlx.core as mx
    from appliance.engine import prefill as pf
    from appliance.engine import step as stepmod

    out = open(f"{os.environ['TRACE_OUT']}.{os.getpid()}", "w")
    t0 = time.perf_counter()
    ds, sd, rr = stepmod.BatchStep._decode_step, stepmod.BatchStep._start_decoding, pf.Prefill.run

    def log(kind, t, **kw):
        kw.update(kind=kind, at=round(t - t0, 4), s=round(time.perf_counter() - t, 5),
                  active=mx.get_active_memory() >> 20)
        out.write(json.dumps(kw) + "\n")

    def decode_step(self):
        t = time.perf_counter()
        rows = len(self._decode)
        ev = ds(self)
        log("decode", t, rows=rows)
        return ev

    def start_decoding(self, ready):
        t = time.perf_counter()
        mx.synchronize()  # (the decode step queued before it: its own time, "drain")
        log("drain", t)
        t = time.perf_counter()
        joined = sd(self, ready)
        mx.synchronize()
        log("join", t, rows=len(ready))
        return joined

    def run(self, chunks, rest=False):
        if not chunks:
            return rr(self, chunks, rest)
        t = time.perf_counter()
        mx.synchronize()
        log("drain", t)
        t = time.perf_counter()
        rr(self, chunks, rest)
        mx.synchronize()  # (since the 36th the pass is queued, not waited for: its own time)
        log("prefill", t, rows=len(chunks), tokens=sum(map(len, chunks)),
            longest=max(map(len, chunks)), context=[len(x) for x in self.batch.tokens],
            grid=bool(pf.WHOLE_BUFFER and self._grid_fits()))

    from appliance.engine import continuous, solo

    def timed(cls, name, kind, sync=False):
        inner = getattr(cls, name)

        def wrapper(self, *a, **k):
            t = time.perf_counter()
            r = inner(self, *a, **k)
            if sync:
                mx.synchronize()
            log(kind, t)
            return r

        setattr(cls, name, wrapper)

    # admission (a hit's copy into the batch), checkpoint and turn stores (extract + insert),
    # the whole engine step (so what none of the parts above holds shows as the rest), the
    # solo row's steps and start
    timed(continuous.ContinuousScheduler, "_admit", "admit", sync=True)
    timed(continuous.ContinuousScheduler, "_store", "store")
    timed(continuous.ContinuousScheduler, "step", "step")
    timed(solo.SoloRow, "_start_solo", "solo_start")
    timed(solo.SoloRow, "_solo_step", "solo_step")
    stepmod.BatchStep._decode_step = decode_step
    stepmod.BatchStep._start_decoding = start_decoding
    pf.Prefill.run = run
    atexit.register(out.close)
