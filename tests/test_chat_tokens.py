"""Chat prompts: the ids are exactly the chat template's own tokenization, also when a
cached conversation head is reused and only the new tail is encoded."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from appliance.api import requests as rq
from appliance.plan.source import EMBEDDED_MODEL

WORDS = ["def", " f(x):", "\n", "  ", " return", "é", "日本", " ", "\t", "<|im_start|>",
         "<|im_end|>", "x", "  \n", "🙂", "\n\n"]


def _tokenizer(path):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(path)


def _conversations(n: int, seed: int = 0):
    r = random.Random(seed)

    def text(k: int) -> str:
        return "".join(r.choice(WORDS) for _ in range(k))

    for _ in range(n):
        msgs = [{"role": "system", "content": text(r.randrange(0, 30))}]
        for t in range(r.randrange(1, 12)):  # > MAX_CHECKPOINT_RENDERS messages at times
            msgs.append({"role": "user" if t % 2 == 0 else "assistant",
                         "content": text(r.randrange(0, 20))})
        yield msgs


class Encodes:
    """The tokenizer, recording the length of every text it encodes."""

    def __init__(self, tok):
        self._tok, self.lengths = tok, []

    def encode(self, text, **kw):
        self.lengths.append(len(text))
        return self._tok.encode(text, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _reference(tok, msgs, tools=None) -> list[int]:
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, tools=tools)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def test_reused_heads_give_the_templates_own_ids():
    tok = Encodes(_tokenizer(EMBEDDED_MODEL))
    tails = 0
    for msgs in _conversations(300):
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        rq._head.cache_clear()
        rq._chat_ids(tok, msgs, None, text)  # heads now cached, as for an agent's next turn
        tok.lengths.clear()
        ids, ends = rq._chat_ids(tok, msgs, None, text)
        assert ids == _reference(tok, msgs)
        assert all(ids[:e] == _reference(tok, msgs)[:e] for e in ends) and len(ends) >= 1
        tails += max(tok.lengths) < len(text)  # only a tail was encoded
    assert tails == 300


def test_no_reuse_where_a_special_token_takes_the_whitespace_before_it(tmp_path):
    """With lstrip on <|im_start|>, the "\\n" ending a head belongs to the next token in
    the full text: splicing the head's ids would be wrong, so the whole text is encoded."""
    model = tmp_path / "m"
    shutil.copytree(EMBEDDED_MODEL, model)
    spec = json.loads((model / "tokenizer.json").read_text())
    for t in spec["added_tokens"]:
        t["lstrip"] = t["lstrip"] or t["content"] == "<|im_start|>"
    (model / "tokenizer.json").write_text(json.dumps(spec))
    tok = _tokenizer(model)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    head_text, head_ids = rq._head(tok, json.dumps(msgs[:1]), "null")
    spliced = list(head_ids) + list(tok.encode(text[len(head_text):], add_special_tokens=False))
    assert spliced != _reference(tok, msgs)  # the case this guards against is real
    assert rq._chat_ids(tok, msgs, None, text)[0] == _reference(tok, msgs)


@pytest.mark.parametrize("tools", [None, [{"type": "function", "function": {"name": "f"}}]])
def test_checkpoints_are_the_message_ends(tools):
    tok = _tokenizer(EMBEDDED_MODEL)
    msgs = [{"role": "system", "content": "S " * 40}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, tools=tools)
    ids, ends = rq._chat_ids(tok, msgs, tools, text)
    expected = [len(tok.apply_chat_template(msgs[:k], tools=tools, tokenize=True,
                                            add_generation_prompt=False)) for k in range(1, 4)]
    assert list(ends) == expected and ids == _reference(tok, msgs, tools)
