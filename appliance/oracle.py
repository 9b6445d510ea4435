"""The oracle: mlx-lm run directly, and the goldens made from it.

    python -m appliance.oracle            (just goldens) writes goldens/<backend>/<model>.json

Nothing here uses the appliance's engine or API: prompts are tokenized as
mlx-lm's server does, tokens come from `mlx_lm.generate.generate_step` with
`mlx_lm.sample_utils.make_sampler`, seeded with `mx.random.seed` as mlx-lm's
server seeds. Goldens are layered per backend because cpu, cuda and metal
kernels may differ in the last bits.
"""

from __future__ import annotations

import argparse
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


def load(path: str, dtype: str):
    """mlx_lm.load, then the plan's dtype cast (the only thing the appliance adds)."""
    import mlx.core as mx
    from mlx_lm import load as mlx_load

    model, tokenizer = mlx_load(path, lazy=True)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
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
    config_sha = __import__("hashlib").sha256((Path(path) / "config.json").read_bytes())
    doc = {"model": model_name, "dtype": dtype, "backend": backend(),
           "config_sha256": config_sha.hexdigest(),
           "versions": {"mlx": version("mlx"), "mlx-lm": version("mlx-lm")},
           "generator": "python -m appliance.oracle (mlx_lm.generate.generate_step)",
           "cases": results}
    out = golden_path(model_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2]
    cases = ",\n".join("  " + json.dumps(c) for c in results)  # one case per line
    out.write_text(f'{head},\n "cases": [\n{cases}\n ]\n}}\n')
    return out


def main() -> None:
    from appliance.plan.resolve import EMBEDDED_MODEL

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=str(EMBEDDED_MODEL))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--name", default="tiny")
    a = ap.parse_args()
    print(make_goldens(a.path, a.dtype, a.name))


if __name__ == "__main__":
    main()
