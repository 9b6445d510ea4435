"""Repro: tiny-gemma3 draft=scripted/fixed k=1 max_rows=1 rows=[('r0', 81, 2, 0), ('s0', 'ext', 2, 0)] scheme={'codec': 'turbo', 'layers': [1], 'start': 50, 'kb': 2.5, 'vb': 2.5} prefix=True flags={}
Run: cd /tmp/fuzz2/src && . /work/main/.venv/bin/activate && \
  PYTHONPATH=/tmp/fuzz2/src:/tmp/fuzz2/src/tests OPENBLAS_NUM_THREADS=1 python /tmp/fuzz2/repros/seed30748-min50.py"""
import json, sys
sys.path.insert(0, "/tmp/fuzz2")
from fuzzcore import check
CASE = json.loads('{"seed": 30748, "model": "tiny-gemma3", "max_rows": 1, "draft": {"kind": "scripted", "k": 1, "control": "fixed", "every": 4, "salt": 2, "seed": 659556, "p_spec": 0.5, "p_rest": 0, "chunk": 5}, "rounds": [[{"name": "r0", "prompt": [77, 67, 75, 68, 81, 198, 198, 220, 220, 220, 220, 67, 68, 69, 220, 67, 72, 82, 79, 64, 83, 66, 71, 7, 82, 68, 75, 69, 11, 220, 77, 64, 76, 68, 11, 220, 9, 64, 81, 70, 82, 11, 220, 1120, 74, 86, 64, 81, 70, 82, 1041, 198, 220, 220, 220, 220, 220, 220, 220, 220, 81, 68, 82, 84, 75, 83, 82, 220, 28, 220, 58, 60, 198, 220, 220, 220, 220, 220, 220, 220, 220], "max_tokens": 2, "tick": 0, "remove": 3}], [{"name": "s0", "prompt": [], "ext": ["r0", 3, [1121, 4042]], "max_tokens": 2, "tick": 0}]], "prefix": true, "scheme": {"codec": "turbo", "layers": [1], "start": 50, "kb": 2.5, "vb": 2.5}, "flags": {"cuda": false, "grid": false, "hold": false, "ahead": null, "compact": false, "lag": null, "prefill_rows": 1, "compile_step": false, "compile_verify": false}}')
status, info = check(CASE)
print(status)
print(json.dumps(info, indent=1, default=str) if not isinstance(info, str) else info)
sys.exit(0 if status == "ok" else 1)
