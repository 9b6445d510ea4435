"""Train the embedded tiny code model that ships in appliance/embedded/tiny/.

    python -m appliance.embedded.train [--steps N] [--out DIR]

Everything is derived from the running Python's standard library, so the run
needs no network and is reproducible: sorted file order, hash-based held-out
split, fixed seeds for MLX and NumPy, single-threaded tokenizer training.
See docs/embedded-model.md for the recorded run.
"""

from __future__ import annotations

import os

# BPE training in `tokenizers` is parallel; pin it to one thread so merge
# ties are resolved the same way on every run.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models import qwen3  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

import appliance  # noqa: E402,F401  -- preloads OpenBLAS before mlx is imported

SEED = 0
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
VOCAB = 4096
# Tests are huge and repetitive; idlelib/lib2to3 are app-specific. Skip them.
EXCLUDE_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3"}
# encodings/cp*.py, mac_*.py, ...: 70 machine-generated hex tables (~12% of
# the bytes) that would teach the model little but cost a lot of steps.
CHARMAP_TABLE = re.compile(r"^(decoding_table = \(|decoding_map = )", re.M)
ALWAYS_TRAIN = "pydoc_data/topics.py"  # the prose docs; keep in training
# Pre-tokenizer split: identifiers, punctuation runs, whitespace runs. Unlike
# GPT-2's regex, a single space attaches to the END of the previous piece
# ("def ", "import ", "= "), so a prompt ending in a space ("def ") is a
# token boundary seen in training, and indentation stays one "\n    " piece.
SPLIT = r"[\p{L}\p{N}_]+ ?|[^\s\p{L}\p{N}_]+ ?|\s+"
HELDOUT_MOD = 50  # ~2% of files, chosen by sha256 of the relative path
# ChatML, with Hermes-style tools: the tools' JSON in the system turn, calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>, results in `tool` turns. Without
# tools the text is exactly plain ChatML (goldens depend on it). mlx-lm picks its json_tools
# parser for this template (it looks for "<tool_call>" and "tool_call.name").
_TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_FORMAT = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n"
)
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '" + _TOOLS_PREAMBLE + "' }}"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '" + _TOOLS_FORMAT + "' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% if message['content'] %}{{ message['content'] + '\\n' }}{% endif %}"
    "{% for tool_call in message['tool_calls'] %}"
    "{% if tool_call['function'] is defined %}{% set tool_call = tool_call['function'] %}"
    "{% endif %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{% if tool_call.arguments is string %}{{ tool_call.arguments }}"
    "{% else %}{{ tool_call.arguments | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ARCH = dict(
    model_type="qwen3", hidden_size=256, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    intermediate_size=768, vocab_size=VOCAB, tie_word_embeddings=True,
    rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
)


def load_corpus():
    """Return (train, heldout) lists of (relative path, text), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if EXCLUDE_DIRS.intersection(rel.split("/")[:-1]):
            continue
        text = p.read_text(encoding="utf-8")
        if not CHARMAP_TABLE.search(text):
            files.append((rel, text))
    files.sort()
    train, heldout = [], []
    for rel, text in files:
        h = int(hashlib.sha256(rel.encode()).hexdigest(), 16)
        (heldout if h % HELDOUT_MOD == 0 and rel != ALWAYS_TRAIN else train).append((rel, text))
    return root, train, heldout


def train_tokenizer(texts):
    """Byte-level BPE: lossless for any source text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()  # mlx_lm picks its BPE streaming detokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def to_stream(tok, texts):
    """Concatenate documents, each preceded by <|endoftext|>, into one id array."""
    eot = tok.token_to_id("<|endoftext|>")
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        out.append(eot)
        out.extend(enc.ids)
    out.append(eot)
    return np.array(out, dtype=np.int32)


def windows(stream, seq):
    """Non-overlapping (seq+1)-token windows: inputs and shifted targets."""
    n = (len(stream) - 1) // seq
    idx = np.arange(n)[:, None] * seq + np.arange(seq + 1)[None, :]
    return stream[idx]


def loss_fn(model, batch):
    logits = model(batch[:, :-1])
    return nn.losses.cross_entropy(logits, batch[:, 1:], reduction="mean")


def evaluate(model, data, batch_size):
    total, count = 0.0, 0
    for i in range(0, len(data), batch_size):
        b = mx.array(data[i:i + batch_size])
        loss = loss_fn(model, b)
        total += loss.item() * len(b)
        count += len(b)
    return total / count


def save(out, tok, model, args):
    out.mkdir(parents=True, exist_ok=True)
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    eos = [ids["<|endoftext|>"], ids["<|im_end|>"]]  # either ends generation
    tok.save(str(out / "tokenizer.json"))
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "additional_special_tokens": ["<|im_start|>"],
        "clean_up_tokenization_spaces": False,  # keep Python spacing verbatim
        "add_prefix_space": False, "model_max_length": ARCH["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    smap = {k: tcfg[k] for k in ("eos_token", "pad_token", "additional_special_tokens")}
    cfg = dict(ARCH, architectures=["Qwen3ForCausalLM"], torch_dtype="bfloat16",
               bos_token_id=None, eos_token_id=eos, pad_token_id=ids["<|endoftext|>"],
               attention_bias=False, hidden_act="silu")
    gcfg = {"eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"], "do_sample": False}
    for name, obj in [("tokenizer_config.json", tcfg), ("special_tokens_map.json", smap),
                      ("config.json", cfg), ("generation_config.json", gcfg)]:
        (out / name).write_text(json.dumps(obj, indent=2) + "\n")
    # Trained in fp32, shipped in bf16 to halve the size; names are mlx_lm's own.
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def lr_schedule(args):
    """Linear warm-up (at most a tenth of the steps), then cosine decay to a tenth of lr.
    Without warm-up steps (--warmup 0, or fewer than 10 steps) the decay alone: MLX's
    linear_schedule refuses 0 steps."""
    warmup = min(args.warmup, args.steps // 10)
    decay = optim.cosine_decay(args.lr, args.steps - warmup, end=args.lr * 0.1)
    if warmup == 0:
        return decay
    return optim.join_schedules([optim.linear_schedule(0.0, args.lr, warmup), decay], [warmup])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=25)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    mx.random.seed(SEED)
    rng = np.random.default_rng(SEED)

    root, train_docs, held_docs = load_corpus()
    nbytes = sum(len(t.encode()) for _, t in train_docs + held_docs)
    print(f"python {sys.version.split()[0]} stdlib {root}: {len(train_docs)} train + "
          f"{len(held_docs)} held-out files, {nbytes:,} bytes")
    print("held-out:", ", ".join(r for r, _ in held_docs))

    tok = train_tokenizer([t for _, t in train_docs])  # held-out files unseen here too
    for _, text in held_docs:  # byte-level BPE must reproduce the source exactly
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    train_stream = to_stream(tok, [t for _, t in train_docs])
    held_stream = to_stream(tok, [t for _, t in held_docs])
    print(f"tokenizer: vocab {tok.get_vocab_size()}, train {len(train_stream):,} tokens, "
          f"held-out {len(held_stream):,} tokens ({time.perf_counter() - t0:.0f}s)")

    train_w, held_w = windows(train_stream, args.seq), windows(held_stream, args.seq)
    model = qwen3.Model(qwen3.ModelArgs(**ARCH))
    mx.eval(model.parameters())
    nparams = sum(v.size for _, v in tree_flatten(model.parameters()))
    tokens_per_step = args.batch * args.seq
    print(f"model: qwen3 {nparams:,} params; {args.steps} steps x {tokens_per_step} tokens "
          f"= {args.steps * tokens_per_step / len(train_stream):.2f} epochs")

    schedule = lr_schedule(args)
    opt = optim.AdamW(learning_rate=schedule, betas=[0.9, 0.95], weight_decay=0.1)
    state = [model.state, opt.state]

    def step(batch):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, batch)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return loss

    step = mx.compile(step, inputs=state, outputs=state)  # fuses the step graph
    order, pos, recent = rng.permutation(len(train_w)), 0, []
    t_train = time.perf_counter()
    for it in range(1, args.steps + 1):
        if pos + args.batch > len(order):  # next epoch: fresh deterministic shuffle
            order, pos = rng.permutation(len(train_w)), 0
        batch = mx.array(train_w[order[pos:pos + args.batch]])
        pos += args.batch
        loss = step(batch)
        mx.eval(state, loss)
        recent.append(loss.item())
        if it % args.log_every == 0 or it == args.steps:
            dt = time.perf_counter() - t_train
            print(f"step {it:5d}  loss {np.mean(recent[-args.log_every:]):.4f}  "
                  f"lr {schedule(mx.array(it)).item():.2e}  {it / dt:.2f} step/s  "
                  f"{it * tokens_per_step / dt:,.0f} tok/s", flush=True)
    train_s = time.perf_counter() - t_train

    held = evaluate(model, held_w, 32)
    pick = np.random.default_rng(SEED + 1).choice(len(train_w), len(held_w), replace=False)
    sample = train_w[pick]
    train_eval = evaluate(model, sample, 32)
    print(f"train loss (last 50 steps) {np.mean(recent[-50:]):.4f}; train eval {train_eval:.4f}; "
          f"held-out loss {held:.4f} (ppl {math.exp(held):.2f}); training {train_s:.0f}s")

    save(args.out, tok, model, args)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"saved to {args.out} ({size / 1e6:.2f} MB); total {time.perf_counter() - t0:.0f}s")

    # Smoke test through the real loading path: greedy continuations.
    from mlx_lm import generate, load
    m, t = load(str(args.out))
    for prompt in ("def ", "import ", "class "):
        text = generate(m, t, prompt, max_tokens=48, verbose=False)
        print(f"--- {prompt!r}\n{prompt}{text}")


if __name__ == "__main__":
    main()
