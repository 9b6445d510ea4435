"""Repro: tiny draft=scripted/fixed k=1 max_rows=1 rows=[('r1', 18, 3, 0), ('s1', 'ext', 1, 0)] scheme={'codec': 'turbo', 'layers': [0, 5], 'start': 0} prefix=True flags={}
Run: cd /tmp/fuzz2/src && . /work/main/.venv/bin/activate && \
  PYTHONPATH=/tmp/fuzz2/src:/tmp/fuzz2/src/tests OPENBLAS_NUM_THREADS=1 python /tmp/fuzz2/repros/seed30850-min.py"""
import json, sys
sys.path.insert(0, "/tmp/fuzz2")
from fuzzcore import check
CASE = json.loads('{"seed": 30850, "model": "tiny", "max_rows": 1, "draft": {"kind": "scripted", "k": 1, "control": "fixed", "every": 4, "salt": 2, "seed": 21103, "p_spec": 0.5, "p_rest": 0.7, "chunk": 16}, "rounds": [[{"name": "r1", "prompt": [345, 2965, 266, 334, 1947, 605, 1865, 579, 311, 327, 724, 10, 279, 301, 262, 279, 16, 3548], "max_tokens": 3, "tick": 0}], [{"name": "s1", "prompt": [], "ext": ["r1", 10, [1727, 3861]], "max_tokens": 1, "tick": 0}]], "prefix": true, "scheme": {"codec": "turbo", "layers": [0, 5], "start": 0}, "flags": {"cuda": false, "grid": false, "hold": false, "ahead": null, "compact": false, "lag": null, "prefill_rows": 1, "compile_step": false, "compile_verify": false}}')
status, info = check(CASE)
print(status)
print(json.dumps(info, indent=1, default=str) if not isinstance(info, str) else info)
sys.exit(0 if status == "ok" else 1)
