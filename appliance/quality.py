"""Quality of a KV scheme against native KV, on the embedded model's held-out stdlib text.

    python -m appliance.quality [--windows N --context C --teacher T --prompts P --tokens G]

prints a markdown table for every scheme in `SCHEMES` the plan accepts, with its default
`keep_layers` and with every layer quantized (float32). Quantized KV changes decode, so the
figures come from 1-token passes over stored KV: per held-out window, C tokens prefilled in
one pass (then `maybe_quantize`, as a lone row does), the next T teacher-forced one at a
time. Over those T next-token distributions: perplexity vs native and mean KL(native ||
scheme) per token. Greedy agreement: P held-out prompts, G greedy tokens each (EOS ignored);
`prefix`: share of tokens before each row's first divergence, `overall`: share of positions
that agree. Windows are evenly spaced over the held-out tokens and run as one batch's rows
(equal lengths, no padding), native's at the same batch size.
tests/test_kv_quality.py gates the perplexity change; docs/kv-quality.md keeps a labelled run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx  # importing appliance/__init__ first preloaded the BLAS
import numpy as np
from mlx_lm.models.cache import KVCache

from appliance.engine.kv import Scheme
from appliance.plan import PlanError

# label -> kv overrides. A scheme the plan refuses as not built yet is left out.
SCHEMES = {"affine8": ["kv=affine8"], "k8v4": ["kv=k8v4"], "affine4": ["kv=affine4"],
           "turboquant": ["kv=turboquant"],
           "turboquant-3.5": ["kv=turboquant", "kv.key_bits=3.5", "kv.value_bits=3.5"]}
KEEP = {"default": [], "none": ["kv.keep_layers=[]"]}  # boundary layers native / all quantized
UNAVAILABLE = ("not served yet", "is not an option")  # refusals of a scheme still being built


def plan_for(overrides: list[str]):
    """The embedded model's float32 plan with these overrides (PlanError if refused)."""
    from hydra import compose, initialize_config_dir

    from appliance.cli import _override_problems
    from appliance.config.hydra_setup import conf_dir, setup
    from appliance.plan import resolve

    # kv.start=0: quantized from the first token, so short windows measure the codes
    overrides = ["model=tiny", "model.dtype=float32", "kv.start=0", *overrides]
    problems = _override_problems(overrides)
    if problems:
        raise PlanError(problems)
    setup()
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        return resolve(compose("config", overrides=overrides))


def unavailable(err: PlanError) -> bool:
    """A refusal that means 'not built yet', not 'misconfigured'."""
    return any(u in p for p in err.problems for u in UNAVAILABLE)


def heldout_texts() -> list[tuple[str, str]]:
    """The embedded model's held-out files, by train.py's rule and constants: corpus files
    with int(sha256(relative path)) % HELDOUT_MOD == 0. Only those files are read."""
    from appliance.embedded.train import ALWAYS_TRAIN, CHARMAP_TABLE, EXCLUDE_DIRS, HELDOUT_MOD

    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in EXCLUDE_DIRS]
        for f in files:
            rel = (Path(d) / f).relative_to(root).as_posix()
            h = int(hashlib.sha256(rel.encode()).hexdigest(), 16)
            if f.endswith(".py") and h % HELDOUT_MOD == 0 and rel != ALWAYS_TRAIN:
                text = (root / rel).read_text(encoding="utf-8")
                if not CHARMAP_TABLE.search(text):
                    out.append((rel, text))
    return sorted(out)


def heldout_windows(tokenizer, n: int, length: int) -> np.ndarray:
    """(n, length) windows evenly spaced over the held-out files, joined as in training."""
    ids: list[int] = []
    for _, text in heldout_texts():
        ids += [0, *tokenizer.encode(text)]
    starts = np.linspace(0, len(ids) - length, n).astype(int)
    return np.stack([np.array(ids[s:s + length], dtype=np.int32) for s in starts])


@dataclass
class Reference:
    """Native's run over the windows: what every scheme is compared with."""

    rows: mx.array  # (n, C + T + 1) tokens
    context: int  # C
    prefilled: list  # native caches after the one-pass prefill of the C context tokens
    logprobs: mx.array | None = None  # (n, T, vocab): native's teacher-forced log-softmax


def teacher_forced(model, scheme: Scheme, ref: Reference) -> mx.array:
    """(n, T, vocab) log-softmax of the T decode steps after the context. A scheme whose new
    caches are native (quantized after the pass) has exactly native's prefill pass, so it
    starts from a copy of native's prefilled caches; any other prefills on its own."""
    cache = scheme.make_cache(model)
    if all(type(c) is KVCache for c in cache):  # slices are new arrays: writes stay here
        for d, c in zip(cache, ref.prefilled, strict=True):
            d.state = (c.keys[..., :c.offset, :], c.values[..., :c.offset, :], c.offset)
    else:
        model(ref.rows[:, :ref.context], cache=cache)
    scheme.maybe_quantize(cache)
    out = []
    for t in range(ref.context, ref.rows.shape[1] - 1):
        logits = model(ref.rows[:, t:t + 1], cache=cache)[:, 0].astype(mx.float32)
        scheme.maybe_quantize(cache)
        out.append(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        mx.eval(out[-1])
    return mx.stack(out, axis=1)


def reference(model, rows: np.ndarray, context: int) -> Reference:
    """Native's prefill and teacher-forced run over the windows `rows`."""
    x, cache = mx.array(rows), Scheme().make_cache(model)
    model(x[:, :context], cache=cache)
    ref = Reference(x, context, cache)
    ref.logprobs = teacher_forced(model, Scheme(), ref)
    return ref


def compare(model, ref: Reference, scheme: Scheme) -> tuple[float, float, float]:
    """(native perplexity, scheme perplexity, mean KL(native || scheme) in nats)."""
    got, targets = teacher_forced(model, scheme, ref), ref.rows[:, ref.context + 1:, None]
    ppl = [float(mx.exp(-mx.take_along_axis(lp, targets, axis=-1).mean()))
           for lp in (ref.logprobs, got)]
    kl = (mx.exp(ref.logprobs) * (ref.logprobs - got)).sum(axis=-1).mean()
    return ppl[0], ppl[1], float(kl)


def greedy(model, scheme: Scheme, prompts: np.ndarray, tokens: int) -> np.ndarray:
    """(rows, tokens) greedy continuations, each prompt prefilled in one pass."""
    cache = scheme.make_cache(model)
    logits = model(mx.array(prompts), cache=cache)[:, -1]
    scheme.maybe_quantize(cache)
    out = [mx.argmax(logits, axis=-1)]
    while len(out) < tokens:
        out.append(mx.argmax(model(out[-1][:, None], cache=cache)[:, -1], axis=-1))
        scheme.maybe_quantize(cache)
        mx.eval(out[-1])
    return np.array(mx.stack(out, axis=1))


def agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(share of tokens before each row's first divergence, share of positions agreeing)."""
    same = ref == got
    first = np.where(same.all(axis=1), same.shape[1], np.argmin(same, axis=1))
    return float(first.sum() / same.size), float(same.mean())


def main(argv: list[str] | None = None) -> None:
    from importlib.metadata import version

    from appliance import oracle

    ap = argparse.ArgumentParser(prog="python -m appliance.quality", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("windows", 16), ("context", 256), ("teacher", 128), ("prompts", 16),
                          ("prompt-len", 64), ("tokens", 128)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args(argv)
    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    ref = reference(model, heldout_windows(tok, a.windows, a.context + a.teacher + 1), a.context)
    prompts = heldout_windows(tok, a.prompts, a.prompt_len)
    native_greedy = greedy(model, Scheme(), prompts, a.tokens)
    print(f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, embedded tiny model, float32; "
          f"{a.windows} windows x (context {a.context} + {a.teacher} teacher-forced); "
          f"greedy: {a.prompts} prompts x {a.prompt_len} tokens + {a.tokens} generated\n")
    print("| scheme | keep_layers | ppl native | ppl scheme | Δppl % | mean KL (nats) "
          "| greedy agreement prefix / overall |")
    print("|---|---|---:|---:|---:|---:|---:|")
    skipped = []
    for label, overrides in SCHEMES.items():
        for extra in KEEP.values():
            try:
                scheme = Scheme.from_plan((plan := plan_for([*overrides, *extra])).kv)
            except PlanError as e:
                if not unavailable(e):
                    raise
                skipped.append(f"{label} ({' '.join(extra) or 'default'}): {e.problems[0]}")
                continue
            ppl_native, ppl, kl = compare(model, ref, scheme)
            prefix, overall = agreement(native_greedy, greedy(model, scheme, prompts, a.tokens))
            print(f"| {label} | {list(plan.kv.keep_layers)} | {ppl_native:.3f} | {ppl:.3f} | "
                  f"{100 * (ppl / ppl_native - 1):+.2f} | {kl:.5f} | "
                  f"{prefix:.3f} / {overall:.3f} |", flush=True)
    print("".join(f"\nnot measured, {s}" for s in skipped))


if __name__ == "__main__":
    main()
