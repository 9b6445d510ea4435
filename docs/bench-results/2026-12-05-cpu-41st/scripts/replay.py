"""Replay the H100's measured 16-row plain step times (the 41st's model traces, 18 runs of
285 steps) through the control under CUDA's policy: a speculative step costs 4.5 plain steps
of the moment (10.4 / 2.3 ms measured) for 2.4 tokens a row, its first after plain steps
96 ms more. Counts switches into speculation and the cost against plain steps only."""
import re, sys
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from appliance.engine.speculate.control import Control

times = []
for f in ("probesplit", "probetrace"):
    for line in open(f"docs/bench-results/2026-12-05-h100-41st/{f}-model-b16-free.txt"):
        if line.startswith("   steps "):
            times += [float(t) / 1e3 for t in re.findall(r"16p([\d.]+)", line)]
print(len(times), "plain steps at 16 rows")
R = float(sys.argv[2]) if len(sys.argv) > 2 else 4.5
for reps in (1, 2):
    c = Control(3, drift=False, full_width=True, idle_max=0)
    before, switches, seconds, plain = None, 0, 0.0, 0.0
    for _ in range(reps):
        for t in times:
            spec = c.speculate(16)
            secs = (R * t + (0.096 if before is False else 0)) if spec else t
            if spec == before:
                c.timed(16, spec, secs, int(16 * 2.4) if spec else 16)
            c.spent(16, spec, secs)
            switches += spec and before is False
            seconds += secs / (2.4 if spec else 1)
            plain += t
            before = spec
    print(f"x{reps}: switches into speculation {switches}, ratio {plain / seconds:.3f}")
