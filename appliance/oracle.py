"""The oracle: mlx-lm run directly, and the goldens made from it.

    python -m appliance.oracle     (just goldens) writes goldens/<backend>/*.json

Serial goldens: `generate_step` on a fixed prompt set. Batch goldens:
`BatchGenerator` driven through fixed schedules (static B=2/4, and rows
joining mid-decode and leaving early) on the embedded model and on tiny
random-weight sliding-window and hybrid models.

Nothing here uses the appliance's engine or API: prompts are tokenized as
mlx-lm's server does, tokens come from `mlx_lm.generate.generate_step` with
`mlx_lm.sample_utils.make_sampler`, seeded with `mx.random.seed` as mlx-lm's
server seeds. Goldens are layered per backend because cpu, cuda and metal
kernels may differ in the last bits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import appliance  # noqa: F401  (BLAS preload before mlx)

GOLDENS = Path(__file__).resolve().parent.parent / "goldens"

# The fixed prompt set: greedy and seeded sampling, completions and chat.
CASES = [
    {"name": "def-greedy", "kind": "completion", "prompt": "def ", "max_tokens": 24},
    {"name": "import-greedy", "kind": "completion", "prompt": "import os\nimport ",
     "max_tokens": 24},
    {"name": "class-greedy", "kind": "completion",
     "prompt": "class Parser:\n    def __init__(self, text):\n        ", "max_tokens": 32},
    {"name": "docstring-temp", "kind": "completion", "prompt": '"""Return the ',
     "max_tokens": 24, "sampling": {"temperature": 0.8, "seed": 7}},
    {"name": "topk-topp-minp", "kind": "completion", "prompt": "for i in range(",
     "max_tokens": 24,
     "sampling": {"temperature": 1.0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 11}},
    {"name": "chat-greedy", "kind": "chat", "max_tokens": 24,
     "messages": [{"role": "system", "content": "You write Python."},
                  {"role": "user", "content": "Write a function that reverses a list."}]},
    {"name": "chat-seeded", "kind": "chat", "max_tokens": 24,
     "sampling": {"temperature": 0.7, "seed": 3},
     "messages": [{"role": "user", "content": "import json"}]},
]


def _config_sha256(path: str) -> str:
    return hashlib.sha256((Path(path) / "config.json").read_bytes()).hexdigest()


def load(path: str, dtype: str, dequantize: bool = False):
    """mlx_lm.load, then the plan's dtype cast and, with `dequantize`, its quantized layers
    held dense (the only things the appliance adds)."""
    import mlx.core as mx
    from mlx_lm import load as mlx_load

    model, tokenizer = mlx_load(path, lazy=True)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    if dequantize:
        from appliance.models.dense import dequantize as dense

        dense(model, getattr(mx, dtype))
    return model, tokenizer


def prompt_ids(tokenizer, case: dict) -> list[int]:
    """As mlx-lm's server tokenizes: encode(prompt) / chat template + generation prompt."""
    if case["kind"] == "chat":
        return list(tokenizer.apply_chat_template(case["messages"], add_generation_prompt=True,
                                                  tokenize=True))
    return list(tokenizer.encode(case["prompt"]))


def generate(model, tokenizer, ids: list[int], max_tokens: int, sampling: dict,
             prefill_step_size: int = 2048) -> list[int]:
    """Tokens from mlx-lm's generate_step until EOS (excluded) or max_tokens."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    s = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, **sampling}
    if s.get("seed") is not None:
        mx.random.seed(s["seed"])
    sampler = make_sampler(temp=s["temperature"], top_p=s["top_p"], min_p=s["min_p"],
                           top_k=s["top_k"])
    out = []
    steps = generate_step(mx.array(ids), model, max_tokens=max_tokens, sampler=sampler,
                          prefill_step_size=prefill_step_size)
    for tok, _ in steps:
        if tok in tokenizer.eos_token_ids:
            break
        out.append(tok)
    return out


# Batch schedules for BatchGenerator parity. Events at a tick happen before that
# tick's `next()`: removals first, then insertions in order. Row -> (prompt
# length in tokens, max_tokens).
BATCH_ROWS = {"a": (40, 24), "b": (90, 8), "c": (25, 16), "d": (60, 12)}
BATCH_SCHEDULES = {
    "static-2": {"max_rows": 2, "events": [(0, "insert", "a"), (0, "insert", "b")]},
    "static-4": {"max_rows": 4, "events": [(0, "insert", r) for r in "abcd"]},
    # c joins mid-decode, b leaves early (length), d joins late, a is cancelled
    "dynamic": {"max_rows": 4, "events": [(0, "insert", "a"), (0, "insert", "b"),
                                          (4, "insert", "c"), (9, "insert", "d"),
                                          (14, "remove", "a")]},
}
BATCH_PREFILL_CHUNK = 32  # small, so prefill chunks interleave with decode steps
BATCH_PREFILL_ROWS = 1  # prompts prefilled together, as the appliance's scheduler does


BATCH_TEXT = '''import os
import sys
from collections import defaultdict


class Registry:
    """Map names to handlers, in insertion order."""

    def __init__(self):
        self._handlers = defaultdict(list)

    def register(self, name, handler):
        self._handlers[name].append(handler)
        return handler

    def dispatch(self, name, *args, **kwargs):
        results = []
        for handler in self._handlers.get(name, ()):
            results.append(handler(*args, **kwargs))
        return results


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    registry = Registry()
    registry.register("env", lambda key: os.environ.get(key, ""))
    for key in argv:
        print(key, registry.dispatch("env", key))
    return 0
'''


def batch_prompts(tokenizer) -> dict[str, list[int]]:
    """Deterministic prompts of the BATCH_ROWS lengths, cut from BATCH_TEXT."""
    ids = list(tokenizer.encode(BATCH_TEXT))
    assert len(ids) >= 7 * len(BATCH_ROWS) + max(n for n, _ in BATCH_ROWS.values())
    return {r: ids[7 * i: 7 * i + n] for i, (r, (n, _)) in enumerate(BATCH_ROWS.items())}


def run_batch_schedule(model, tokenizer, schedule: dict,
                       prefill_rows: int = BATCH_PREFILL_ROWS) -> dict[str, list[int]]:
    """Tokens per row from mlx-lm's BatchGenerator driven through `schedule`."""
    from mlx_lm.generate import BatchGenerator

    max_rows = schedule["max_rows"]
    gen = BatchGenerator(model, stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
                         completion_batch_size=max_rows, prefill_batch_size=prefill_rows,
                         prefill_step_size=BATCH_PREFILL_CHUNK)
    prompts = batch_prompts(tokenizer)
    out = {r: [] for _, _, r in schedule["events"]}
    uid_of, row_of, live = {}, {}, set()
    events = sorted(schedule["events"], key=lambda e: (e[0], e[1] != "remove"))
    tick = 0
    while events or live:
        while events and events[0][0] == tick:
            _, what, r = events.pop(0)
            if what == "remove":
                if r in live:
                    gen.remove([uid_of[r]])
                    live.discard(r)
                continue
            (uid,) = gen.insert([prompts[r]], max_tokens=[BATCH_ROWS[r][1]])
            uid_of[r], row_of[uid] = uid, r
            live.add(r)
        if live:
            _, responses = gen.next()
            for resp in responses:
                r = row_of[resp.uid]
                if resp.finish_reason != "stop":  # EOS is not part of the text
                    out[r].append(resp.token)
                if resp.finish_reason is not None:
                    live.discard(r)
        tick += 1
    gen.close()
    return out


def make_batch_goldens(path: str, dtype: str, model_name: str) -> Path:
    model, tokenizer = load(path, dtype)
    doc = {"model": model_name, "dtype": dtype, "backend": backend(),
           "config_sha256": _config_sha256(path),
           "versions": {"mlx": version("mlx"), "mlx-lm": version("mlx-lm")},
           "generator": "python -m appliance.oracle (mlx_lm.generate.BatchGenerator)",
           "prefill_chunk": BATCH_PREFILL_CHUNK, "prefill_rows": BATCH_PREFILL_ROWS,
           "rows": BATCH_ROWS,
           "prompts": batch_prompts(tokenizer),
           "schedules": {name: {**sch, "tokens": run_batch_schedule(model, tokenizer, sch)}
                         for name, sch in BATCH_SCHEDULES.items()}}
    out = golden_path(f"batch-{model_name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc) + "\n")
    return out


def backend() -> str:
    import mlx.core as mx

    if mx.metal.is_available():
        return "metal"
    return "cuda" if hasattr(mx, "cuda") and mx.cuda.is_available() else "cpu"


def golden_path(model_name: str, backend_name: str | None = None) -> Path:
    return GOLDENS / (backend_name or backend()) / f"{model_name}.json"


def make_goldens(path: str, dtype: str, model_name: str) -> Path:
    model, tokenizer = load(path, dtype)
    results = []
    for case in CASES:
        ids = prompt_ids(tokenizer, case)
        toks = generate(model, tokenizer, ids, case["max_tokens"], case.get("sampling", {}))
        results.append({**case, "prompt_ids": ids, "tokens": toks,
                        "text": tokenizer.decode(toks)})
    config_sha = _config_sha256(path)
    doc = {"model": model_name, "dtype": dtype, "backend": backend(),
           "config_sha256": config_sha,
           "versions": {"mlx": version("mlx"), "mlx-lm": version("mlx-lm")},
           "generator": "python -m appliance.oracle (mlx_lm.generate.generate_step)",
           "cases": results}
    out = golden_path(model_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2]
    cases = ",\n".join("  " + json.dumps(c) for c in results)  # one case per line
    out.write_text(f'{head},\n "cases": [\n{cases}\n ]\n}}\n')
    return out


# Models with goldens: the embedded one, and random-weight tiny variants of a
# sliding-window and a hybrid architecture (appliance.models.synthetic.TINY).
BATCH_MODELS = ("tiny", "tiny-gemma3", "tiny-qwen3-next")


def model_path(name: str) -> str:
    from appliance.models.synthetic import ensure
    from appliance.plan.source import EMBEDDED_MODEL

    return str(EMBEDDED_MODEL if name == "tiny" else ensure(name, "float32", None, 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    print(make_goldens(model_path("tiny"), "bfloat16", "tiny"))  # as served by default
    for name in BATCH_MODELS:
        print(make_batch_goldens(model_path(name), "float32", name))


if __name__ == "__main__":
    main()
