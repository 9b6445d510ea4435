"""Train the embedded model's speculative-decoding drafters, and measure their acceptance.

    python -m appliance.embedded.train_spec mtp   [--steps N]   # -> embedded/tiny/mtp.safetensors
    python -m appliance.embedded.train_spec draft [--steps N]   # -> embedded/draft/
    python -m appliance.embedded.train_spec accept              # greedy acceptance, held-out code

Same corpus, tokenizer (the shipped tokenizer.json) and held-out split as
`appliance.embedded.train`; fixed seeds; float32 training (bf16 matmuls are slow on
the CPU backend), bf16 on disk. See docs/embedded-model.md for the recorded runs.

* mtp: a depth-1 MTP head (appliance.models.mtp.MTPHead: one qwen3 decoder layer of the
  target's width) on the frozen tiny target. Position i sees the target's post-norm hidden
  H[i] and the embedding of t[i+1]; the loss is cross-entropy against t[i+2], scored by the
  target's tied output head.
* draft: a small qwen3 (2 layers, hidden 192) trained from scratch on next-token loss.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3
from mlx_lm.models.cache import make_prompt_cache
from tokenizers import Tokenizer

from appliance.embedded import train as base
from appliance.models.mtp import (
    MTPHead,
    embed,
    hidden_states,
    load_mtp,
    logits_from_hidden,
)

HERE = Path(__file__).parent
TINY = HERE / "tiny"
DRAFT = HERE / "draft"
SEED = base.SEED
DRAFT_ARCH = dict(
    base.ARCH, hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
    num_key_value_heads=1, head_dim=64, intermediate_size=576,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def streams():
    """(train, held-out) token streams of the shipped tokenizer, as `train.py` builds them."""
    _, train_docs, held_docs = base.load_corpus()
    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    return (base.to_stream(tok, [t for _, t in train_docs]),
            base.to_stream(tok, [t for _, t in held_docs]))


def load_target(path=TINY):
    """The tiny target, upcast to float32 and frozen."""
    from mlx_lm import load

    model, _ = load(str(path))
    model.set_dtype(mx.float32)
    model.freeze()
    model.eval()
    mx.eval(model.parameters())
    return model


def train_loop(params_owner, loss_fn, batches, args, log_every=25):
    """AdamW + clip + compiled step over `params_owner`'s trainable parameters."""
    schedule = base.lr_schedule(args)
    opt = optim.AdamW(learning_rate=schedule, betas=[0.9, 0.95], weight_decay=0.1)
    state = [params_owner.state, opt.state]

    def step(*batch):
        loss, grads = nn.value_and_grad(params_owner, loss_fn)(*batch)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(params_owner, grads)
        return loss

    step = mx.compile(step, inputs=state, outputs=state)
    recent, t0 = [], time.perf_counter()
    for it in range(1, args.steps + 1):
        loss = step(*batches(it))
        mx.eval(state, loss)
        recent.append(loss.item())
        if it % log_every == 0 or it == args.steps:
            dt = time.perf_counter() - t0
            print(f"step {it:5d}  loss {np.mean(recent[-log_every:]):.4f}  "
                  f"lr {schedule(mx.array(it)).item():.2e}  {it / dt:.2f} step/s", flush=True)
    return recent, time.perf_counter() - t0


def shuffled(data, batch, rng):
    """Deterministic epoch-wise shuffled minibatches of rows of `data`."""
    order, pos = rng.permutation(len(data)), 0

    def next_batch(_it):
        nonlocal order, pos
        if pos + batch > len(order):
            order, pos = rng.permutation(len(data)), 0
        b = data[order[pos:pos + batch]]
        pos += batch
        return b

    return next_batch


# ------------------------------------------------------------------ MTP head


def mtp_loss(head, model, h, tokens):
    """CE of the head at positions i (hidden h[i], token t[i+1]) against t[i+2]."""
    out = head(h, embed(model, tokens[:, 1:-1]))
    return nn.losses.cross_entropy(logits_from_hidden(model, out), tokens[:, 2:],
                                   reduction="mean")


def mtp_eval(head, model, data, batch_size=16):
    """(loss vs t[i+2], accuracy vs t[i+2], agreement with the target's greedy t[i+2])."""
    loss = acc = agree = n = 0.0
    for i in range(0, len(data), batch_size):
        b = mx.array(data[i:i + batch_size])
        h = hidden_states(model, b[:, :-1], None)
        logits = logits_from_hidden(model, head(h[:, :-1], embed(model, b[:, 1:-1])))
        tgt = b[:, 2:]
        greedy = logits_from_hidden(model, h[:, 1:]).argmax(-1)  # target at i+1 -> t[i+2]
        pred = logits.argmax(-1)
        loss += nn.losses.cross_entropy(logits, tgt, reduction="sum").item()
        acc += (pred == tgt).sum().item()
        agree += (pred == greedy).sum().item()
        n += tgt.size
    return loss / n, acc / n, agree / n


def train_mtp(args):
    t0 = time.perf_counter()
    mx.random.seed(SEED)
    rng = np.random.default_rng(SEED)
    train_s, held_s = streams()
    # seq + 2 tokens per window: hidden at 0..seq-1, next tokens 1..seq, targets 2..seq+1
    train_w, held_w = base.windows(train_s, args.seq + 1), base.windows(held_s, args.seq + 1)
    model = load_target()
    head = MTPHead.for_model(model)
    mx.eval(head.parameters())
    n = sum(v.size for _, v in tree_flatten(head.parameters()))
    print(f"mtp head: {n:,} params; {args.steps} steps x {args.batch}x{args.seq} tokens; "
          f"data {time.perf_counter() - t0:.0f}s", flush=True)
    loss, acc, agree = mtp_eval(head, model, held_w[:32])
    print(f"before: held-out loss {loss:.4f} acc {acc:.4f} agree-with-target {agree:.4f}",
          flush=True)

    next_batch = shuffled(train_w, args.batch, rng)

    def batches(it):
        b = mx.array(next_batch(it))
        h = hidden_states(model, b[:, :-2], None)  # frozen target, outside the grad
        mx.eval(h)
        return h, b

    def loss_fn(h, b):
        return mtp_loss(head, model, h, b)

    recent, train_time = train_loop(head, loss_fn, batches, args)
    held = mtp_eval(head, model, held_w)
    print(f"train loss (last 50) {np.mean(recent[-50:]):.4f}; held-out loss {held[0]:.4f} "
          f"acc(t+2) {held[1]:.4f} agree(target greedy t+2) {held[2]:.4f}; "
          f"training {train_time:.0f}s", flush=True)
    out = Path(args.out or TINY / "mtp.safetensors")
    if out.suffix != ".safetensors":  # the name MLX gives the file it writes
        out = out.with_name(out.name + ".safetensors")
    weights = {"mtp." + k: v.astype(mx.bfloat16) for k, v in tree_flatten(head.parameters())}
    mx.save_safetensors(str(out), weights, metadata={"format": "mlx"})
    print(f"saved {out} ({out.stat().st_size:,} bytes); total {time.perf_counter() - t0:.0f}s")


# ------------------------------------------------------------------ draft model


def train_draft(args):
    t0 = time.perf_counter()
    mx.random.seed(SEED)
    rng = np.random.default_rng(SEED)
    train_s, held_s = streams()
    train_w, held_w = base.windows(train_s, args.seq), base.windows(held_s, args.seq)
    model = qwen3.Model(qwen3.ModelArgs(**DRAFT_ARCH))
    mx.eval(model.parameters())
    n = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"draft: qwen3 {n:,} params; {args.steps} steps x {args.batch}x{args.seq} tokens "
          f"= {args.steps * args.batch * args.seq / len(train_s):.2f} epochs; "
          f"data {time.perf_counter() - t0:.0f}s", flush=True)
    next_batch = shuffled(train_w, args.batch, rng)

    def loss_fn(b):
        return base.loss_fn(model, b)

    recent, train_time = train_loop(model, loss_fn, lambda it: (mx.array(next_batch(it)),), args)
    held = base.evaluate(model, held_w, 32)
    print(f"train loss (last 50) {np.mean(recent[-50:]):.4f}; held-out loss {held:.4f} "
          f"(ppl {math.exp(held):.2f}); training {train_time:.0f}s", flush=True)
    out = args.out or DRAFT
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:  # the target's tokenizer, byte for byte
        shutil.copyfile(TINY / name, out / name)
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(DRAFT_ARCH)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    print(f"saved {out}; total {time.perf_counter() - t0:.0f}s")


# ------------------------------------------------------------------ acceptance


def greedy_acceptance(target, head=None, draft=None, contexts=None, k=4):
    """Greedy drafting from `contexts` [N, C] of real text; returns per-depth match arrays.

    The target continues each context greedily for k + 1 tokens g_1..g_{k+1}. The draft
    model drafts d_1..d_k autoregressively from its own tokens; the MTP head drafts
    d_2..d_{k+1} from (target hidden at the context's end, g_1) and then from its own output
    hidden and drafted token. Returns {"draft"/"mtp": bool array [N, k]}: draft j == target j.
    """
    x = mx.array(contexts)
    cache = make_prompt_cache(target)
    h = hidden_states(target, x, cache)
    hs, gs = [h], []
    for _ in range(k + 1):
        g = logits_from_hidden(target, hs[-1][:, -1:]).argmax(-1)
        gs.append(g)
        hs.append(hidden_states(target, g, cache))
    g = mx.concatenate(gs, axis=1)  # [N, k+1]
    out = {}
    if draft is not None:
        dc = make_prompt_cache(draft)
        logits = draft(x, cache=dc)[:, -1:]
        ds = []
        for _ in range(k):
            d = logits.argmax(-1)
            ds.append(d)
            logits = draft(d, cache=dc)
        out["draft"] = np.array(mx.concatenate(ds, axis=1) == g[:, :k])
    if head is not None:
        hc = head.make_cache()
        nxt = mx.concatenate([x[:, 1:], g[:, :1]], axis=1)
        o = head(h, embed(target, nxt), hc)[:, -1:]
        ds = []
        for _ in range(k):
            d = logits_from_hidden(target, o).argmax(-1)
            ds.append(d)
            o = head(o, embed(target, d), hc)
        out["mtp"] = np.array(mx.concatenate(ds, axis=1) == g[:, 1:k + 1])
    return out


def report(matches: np.ndarray) -> dict:
    """Per depth: the match rate, the conditional rate, and the all-prefix (accepted) rate."""
    prefix = np.cumprod(matches, axis=1)
    rows = {}
    for j in range(matches.shape[1]):
        reached = prefix[:, j - 1].sum() if j else len(matches)
        rows[j + 1] = dict(match=float(matches[:, j].mean()),
                           conditional=float(prefix[:, j].sum() / max(reached, 1)),
                           accepted_prefix=float(prefix[:, j].mean()),
                           mean_accepted=float(prefix[:, :j + 1].sum(axis=1).mean()))
    return rows


def accept(args):
    from mlx_lm import load

    t0 = time.perf_counter()
    _, held_s = streams()
    target = load_target()
    head = load_mtp(TINY, target)
    draft, _ = load(str(DRAFT))
    draft.set_dtype(mx.float32)
    rng = np.random.default_rng(SEED)
    starts = np.sort(rng.choice(len(held_s) - args.context - 8, args.samples, replace=False))
    ctx = np.stack([held_s[s:s + args.context] for s in starts])
    res = {"draft": [], "mtp": []}
    for i in range(0, len(ctx), 32):
        for name, m in greedy_acceptance(target, head, draft, ctx[i:i + 32]).items():
            res[name].append(m)
    print(f"{args.samples} held-out contexts of {args.context} tokens "
          f"({time.perf_counter() - t0:.0f}s)")
    for name, ms in res.items():
        print(name)
        for j, r in report(np.concatenate(ms)).items():
            print(f"  k={j}: match {r['match']:.3f}  conditional {r['conditional']:.3f}  "
                  f"all first k {r['accepted_prefix']:.3f}  "
                  f"mean accepted of k {r['mean_accepted']:.2f}")
    print("one-row decode step, float32, after a 128-token prompt (median of 50):")
    for name, ms in decode_costs(target, head, draft, ctx[:1]).items():
        print(f"  {name}: {ms:.2f} ms")


def decode_costs(target, head, draft, prompt, n=50):
    """Median ms of one greedy decode step of one row: target, draft model, MTP head."""
    x = mx.array(prompt)

    def timed(step):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            mx.eval(step())
            times.append(time.perf_counter() - t)
        return 1e3 * float(np.median(times))

    tc, dc, hc = make_prompt_cache(target), make_prompt_cache(draft), head.make_cache()
    h = hidden_states(target, x, tc)
    mx.eval(h, draft(x, cache=dc), head(h, embed(target, x), hc))
    tok = x[:, -1:]
    o = h[:, -1:]
    return {
        "target": timed(lambda: target(tok, cache=tc).argmax(-1)),
        "draft model": timed(lambda: draft(tok, cache=dc).argmax(-1)),
        "mtp head": timed(lambda: logits_from_hidden(
            target, head(o, embed(target, tok), hc)).argmax(-1)),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["mtp", "draft", "accept"])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--samples", type=int, default=512, help="accept: contexts")
    ap.add_argument("--context", type=int, default=128, help="accept: tokens per context")
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = {"mtp": 450, "draft": 600, "accept": 0}[args.what]
    print(f"python {sys.version.split()[0]}; {' '.join(sys.argv)}", flush=True)
    {"mtp": train_mtp, "draft": train_draft, "accept": accept}[args.what](args)


if __name__ == "__main__":
    main()
