"""Issue 12 item 9: each method's verify cost on a synthetic shape (random weights).

usage: verify_cost.py SHAPE DTYPE OUTDIR [batches, e.g. 1,4,16]
lookup: fixed proposals; mtp: a random head file shaped for the target; model: a random
2-layer x 512 draft of the same vocabulary (the 8th session's draft).
"""
import json
import subprocess
import sys
from pathlib import Path

import appliance  # noqa: F401  (BLAS settings before mlx loads)
import mlx.core as mx
from mlx.utils import tree_flatten

from appliance.models import synthetic as s
from appliance.models.mtp import MTPHead

shape, dtype, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
batches = sys.argv[4] if len(sys.argv) > 4 else "1,4,16"
target = s.ensure(shape, dtype, None, 0)
s.SHAPES[shape + "-draft"] = {**s.config_for(shape, dtype, None), "hidden_size": 512,
                              "num_hidden_layers": 2, "intermediate_size": 1536,
                              "num_attention_heads": 8, "num_key_value_heads": 2}
head_file = Path("/tmp") / f"{shape}-{dtype}-mtp.safetensors"
if not head_file.exists():
    from mlx_lm.utils import load_model
    model, _ = load_model(target, lazy=True)
    mx.random.seed(1)
    head = MTPHead.for_model(model)
    head.set_dtype(getattr(mx, dtype))
    mx.save_safetensors(str(head_file),
                        {"mtp." + k: v for k, v in tree_flatten(head.parameters())})
print("target", target, "head", head_file, flush=True)
A = "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
common = [f"model=synthetic", f"model.shape={shape}", f"model.dtype={dtype}",
          "bench=spec", "mode=bench", "bench.spec_workloads=[free]",
          "bench.spec_verify_cost=true", "bench.decode_tokens=16", "bench.repeats=1",
          f"bench.spec_batches=[{batches}]"]
for method, extra in [("lookup", []), ("mtp", [f"draft.head={head_file}"]), ("model", None)]:
    if extra is None:
        code = ("import appliance; from appliance.models import synthetic as s; "
                f"s.SHAPES['{shape}-draft'] = {s.SHAPES[shape + '-draft']!r}; "
                f"print(s.ensure('{shape}-draft', '{dtype}', None, 0))")
        d = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip().splitlines()[-1]
        extra = ["draft.source=local", f"draft.path={d}"]
    run = Path(f"/tmp/vc-{method}")
    r = subprocess.run([sys.executable, "-c", A, *common, f"draft={method}", *extra,
                        f"hydra.run.dir={run}"], capture_output=True, text=True)
    print(method, "rc", r.returncode, r.stdout[-1500:], r.stderr[-1500:] if r.returncode else "",
          flush=True)
    if (run / "bench.json").exists():
        res = json.loads((run / "bench.json").read_text())
        out.mkdir(parents=True, exist_ok=True)
        (out / f"verify-{shape}-{method}.json").write_text(json.dumps(res, indent=1))
