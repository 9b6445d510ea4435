"""MTP heads and draft models for speculative decoding (appliance/models/mtp.py, embedded/)."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.models.cache import BatchKVCache, KVCache

from appliance.embedded import train as base_train
from appliance.models import ensure, mtp
from appliance.models.mtp import MTPError, embed, hidden_states, load_mtp, logits_from_hidden

EMBEDDED = Path(base_train.__file__).parent
TINY, DRAFT = EMBEDDED / "tiny", EMBEDDED / "draft"
# Measured on the committed head (docs/embedded-model.md): 0.488 on the first 512 held-out
# tokens of functools.py; chance ~1/4096, its most common token 0.088, its t+1 guess 0.104.
MIN_AGREEMENT = 0.4


@pytest.fixture(scope="module")
def target():
    model, tok = load(str(TINY))
    model.set_dtype(mx.float32)
    return model, tok


@pytest.fixture(scope="module")
def head(target):
    h = load_mtp(TINY, target[0])
    assert h is not None
    return h


def test_embedded_head_shapes(target, head):
    model, _ = target
    from mlx_lm.models.qwen3 import TransformerBlock

    assert isinstance(head.layers[0], TransformerBlock)
    assert head.fc.weight.shape == (256, 512)
    assert head.fc.weight.dtype == mx.float32  # cast to the target's dtype
    x = mx.array([[5, 6, 7, 8]])
    out = head(hidden_states(model, x, None), embed(model, x))
    assert out.shape == (1, 4, 256)
    assert logits_from_hidden(model, out).shape == (1, 4, 4096)
    n = sum(v.size for _, v in tree_flatten(head.parameters()))
    assert mtp.mtp_bytes(TINY) == 2 * n  # stored in bf16
    assert mtp.mtp_bytes(TINY, dtype="float32") == 4 * n


def test_has_mtp():
    assert mtp.has_mtp(TINY)
    assert not mtp.has_mtp(DRAFT)
    llama = ensure("tiny-llama", "float32", None, 0)
    assert not mtp.has_mtp(llama) and mtp.mtp_bytes(llama) == 0
    model, _ = load(str(llama))
    assert load_mtp(llama, model) is None
    assert mtp.has_mtp(llama, head_file=TINY / "mtp.safetensors")


def test_synthetic_qwen3_next_checkpoint(tmp_path):
    d = ensure("tiny-qwen3-next-mtp", "float32", None, 0)
    model, _ = load(str(d))  # mlx-lm's sanitize converts the HF layout and drops mtp.*
    assert mtp.has_mtp(d)
    head = load_mtp(d, model)
    from mlx_lm.models.qwen3_next import Qwen3NextDecoderLayer, Qwen3NextSparseMoeBlock

    layer = head.layers[0]
    assert isinstance(layer, Qwen3NextDecoderLayer) and not layer.is_linear
    assert isinstance(layer.mlp, Qwen3NextSparseMoeBlock)
    assert layer.mlp.switch_mlp.up_proj.weight.shape == (4, 64, 64)
    n = sum(v.size for _, v in tree_flatten(head.parameters()))
    assert mtp.mtp_bytes(d) == 4 * n
    # (1 + w) gains were applied: the stored w are centred on 0, the loaded gains on 1
    assert abs(head.pre_fc_norm_hidden.weight.mean().item() - 1) < 0.05
    x = mx.array([[3, 4, 5, 6, 7]])
    out = head(hidden_states(model, x, None), embed(model, x))
    assert out.shape == (1, 5, 64) and logits_from_hidden(model, out).shape == (1, 5, 4096)
    # a head file already in gain-w form (offset applied twice) is refused, not misused
    w = {k: (v + 1.0 if v.ndim == 1 and "norm" in k.split(".")[-2] else v)
         for k, v in mx.load(str(d / "model.safetensors")).items() if k.startswith("mtp.")}
    mx.save_safetensors(str(tmp_path / "head.safetensors"), w)
    with pytest.raises(MTPError, match="convention"):
        load_mtp(d, model, head_file=tmp_path / "head.safetensors")


def test_batch_cache_matches_lone_cache(target, head):
    model, _ = target
    rng = np.random.default_rng(0)
    lens, steps, H = [7, 4], 2, 256
    rows = [(mx.array(rng.standard_normal((1, n + steps, H)).astype(np.float32)),
             mx.array(rng.standard_normal((1, n + steps, H)).astype(np.float32))) for n in lens]
    lone = []
    for (h, e), n in zip(rows, lens, strict=True):
        c = KVCache()
        outs = [head(h[:, :n], e[:, :n], c)]
        outs += [head(h[:, n + s:n + s + 1], e[:, n + s:n + s + 1], c) for s in range(steps)]
        lone.append(mx.concatenate(outs, axis=1))
    top = max(lens)
    pad = [top - n for n in lens]
    cache = BatchKVCache(left_padding=pad)

    def prompt(i):  # every row's prompt, left-padded to the longest
        return mx.concatenate([mx.pad(rows[r][i][:, :n], ((0, 0), (pad[r], 0), (0, 0)))
                               for r, n in enumerate(lens)])

    def step(i, s):  # every row's s-th token after its prompt
        return mx.concatenate([rows[r][i][:, n + s:n + s + 1] for r, n in enumerate(lens)])

    outs = [head(prompt(0), prompt(1), cache)]
    outs += [head(step(0, s), step(1, s), cache) for s in range(steps)]
    batch = mx.concatenate(outs, axis=1)
    for r in range(len(lens)):
        got = batch[r:r + 1, pad[r]:]
        assert got.shape == lone[r].shape
        assert mx.allclose(got, lone[r], atol=1e-5, rtol=1e-5).item()


def _heldout_tokens(tok, n=512):
    rel = "functools.py"
    assert int(hashlib.sha256(rel.encode()).hexdigest(), 16) % base_train.HELDOUT_MOD == 0
    text = (Path(sysconfig.get_paths()["stdlib"]) / rel).read_text()
    return mx.array([tok.encode(text[:8 * n])[:n]])


def test_head_predicts_two_ahead(target, head):
    model, tok = target
    x = _heldout_tokens(tok)
    h = hidden_states(model, x, None)
    # position i: hidden h[i] and token t[i+1] -> t[i+2]; the target predicts it at i + 1
    pred = logits_from_hidden(model, head(h[:, :-2], embed(model, x[:, 1:-1]))).argmax(-1)
    greedy = logits_from_hidden(model, h[:, 1:-1]).argmax(-1)
    agree = (pred == greedy).astype(mx.float32).mean().item()
    assert agree > MIN_AGREEMENT, agree


def test_chained_acceptance_runs(target, head):
    from appliance.embedded.train_spec import greedy_acceptance, report

    model, tok = target
    draft, _ = load(str(DRAFT))
    x = np.array(_heldout_tokens(tok, 256)).reshape(8, 32)
    res = greedy_acceptance(model, head, draft, x, k=3)
    assert res["mtp"].shape == res["draft"].shape == (8, 3)
    r = report(res["mtp"])
    assert 0 <= r[3]["accepted_prefix"] <= r[1]["accepted_prefix"] <= 1


def test_draft_model_shares_tokenizer(target):
    model, tok = target
    draft, dtok = load(str(DRAFT))
    assert dtok._tokenizer.get_vocab() == tok._tokenizer.get_vocab()
    assert set(dtok.eos_token_ids) == set(tok.eos_token_ids)
    text = "def f(x):\n    return x + 1\n"
    assert dtok.encode(text) == tok.encode(text)
    assert draft.args.vocab_size == model.args.vocab_size
    size = sum(v.size for _, v in tree_flatten(draft.parameters()))
    assert size < 0.4 * sum(v.size for _, v in tree_flatten(model.parameters()))
    assert len(draft.layers) < len(model.layers)


def test_the_lr_schedule_warms_up_where_there_are_steps_to_and_short_runs_train():
    """`train --steps 5` (or --warmup 0) died: MLX's linear_schedule refuses 0 warm-up steps.
    The shipped runs' schedule is unchanged: warm-up to lr, cosine to a tenth of it."""
    from types import SimpleNamespace

    full = base_train.lr_schedule(SimpleNamespace(steps=800, warmup=50, lr=2e-3))
    assert float(full(mx.array(0))) == 0.0 and float(full(mx.array(50))) == pytest.approx(2e-3)
    assert float(full(mx.array(800))) == pytest.approx(2e-4)
    for steps, warmup in ((5, 50), (100, 0)):
        short = base_train.lr_schedule(SimpleNamespace(steps=steps, warmup=warmup, lr=2e-3))
        assert float(short(mx.array(0))) == pytest.approx(2e-3)
        assert float(short(mx.array(steps))) == pytest.approx(2e-4)


def test_train_spec_mtp_reports_the_file_it_saved(tmp_path):
    """`train_spec mtp --out X` (no suffix): MLX writes X.safetensors, and the script then
    died on X after the whole training run (23 minutes at the default steps)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "appliance.embedded.train_spec", "mtp",
                        "--steps", "1", "--batch", "1", "--seq", "64", "--out",
                        str(tmp_path / "head")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"saved {tmp_path / 'head.safetensors'} (" in r.stdout
    assert (tmp_path / "head.safetensors").stat().st_size > 0
