"""Repro: tiny-qwen3-next draft=scripted/fixed k=1 max_rows=1 rows=[('r3', 1, 1, 0)] scheme={'codec': 'turbo', 'layers': [5], 'start': 0} prefix=False flags={}
Run: cd /tmp/fuzz2/src && . /work/main/.venv/bin/activate && \
  PYTHONPATH=/tmp/fuzz2/src:/tmp/fuzz2/src/tests OPENBLAS_NUM_THREADS=1 python /tmp/fuzz/repros/seed5600-min.py"""
import json, sys
sys.path.insert(0, "/tmp/fuzz2")
from fuzzcore import check
CASE = json.loads('{"seed": 5600, "model": "tiny-qwen3-next", "max_rows": 1, "draft": {"kind": "scripted", "k": 1, "control": "fixed", "every": 6, "salt": 4, "seed": 87250, "p_spec": 0.5, "p_rest": 0, "chunk": 16}, "rounds": [[{"name": "r3", "prompt": [88], "max_tokens": 1, "tick": 0}]], "prefix": false, "scheme": {"codec": "turbo", "layers": [5], "start": 0}, "flags": {"cuda": false, "grid": false, "hold": false, "ahead": null, "compact": false, "lag": null, "prefill_rows": 1, "compile_step": false, "compile_verify": false}}')
status, info = check(CASE)
print(status)
print(json.dumps(info, indent=1, default=str) if not isinstance(info, str) else info)
sys.exit(0 if status == "ok" else 1)
