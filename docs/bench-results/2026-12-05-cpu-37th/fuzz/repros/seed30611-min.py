"""Repro: tiny-gemma3 draft=scripted/fixed k=1 max_rows=1 rows=[('r0', 2, 1, 0)] scheme={'codec': 'turbo', 'layers': [5], 'start': 0, 'kb': 3, 'vb': 3} prefix=False flags={}
Run: cd /tmp/fuzz2/src && . /work/main/.venv/bin/activate && \
  PYTHONPATH=/tmp/fuzz2/src:/tmp/fuzz2/src/tests OPENBLAS_NUM_THREADS=1 python /tmp/fuzz2/repros/seed30611-min.py"""
import json, sys
sys.path.insert(0, "/tmp/fuzz2")
from fuzzcore import check
CASE = json.loads('{"seed": 30611, "model": "tiny-gemma3", "max_rows": 1, "draft": {"kind": "scripted", "k": 1, "control": "fixed", "every": 4, "salt": 4, "seed": 627916, "p_spec": 0.8, "p_rest": 0.3, "chunk": 32}, "rounds": [[{"name": "r0", "prompt": [1912, 2576], "max_tokens": 1, "tick": 0}]], "prefix": false, "scheme": {"codec": "turbo", "layers": [5], "start": 0, "kb": 3, "vb": 3}, "flags": {"cuda": false, "grid": false, "hold": false, "ahead": null, "compact": false, "lag": null, "prefill_rows": 1, "compile_step": false, "compile_verify": false}}')
status, info = check(CASE)
print(status)
print(json.dumps(info, indent=1, default=str) if not isinstance(info, str) else info)
sys.exit(0 if status == "ok" else 1)
