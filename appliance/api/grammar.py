"""Constrained decoding with llguidance: JSON schemas and tool calls as per-row token masks.

A request's grammar compiles here, on the API side (in the request's worker thread), so a
schema llguidance cannot compile is a 400 before anything reaches the engine. The compiled
matcher travels on `SamplingParams.constraint`; the engine asks it for one stateful logits
processor per row (`make_processor`) and calls that with the row's token history, as it
calls mlx-lm's processors. The engine never imports llguidance.

Why llguidance (docs/structured-output.md): it computes a mask in tens of microseconds
for any position with no per-schema precomputation over the vocabulary, it takes JSON
schemas and Lark grammars (a tool call is a Lark rule around a JSON schema), it rolls back
(speculative decoding) and its masks are plain bitmasks any backend can apply.
"""

from __future__ import annotations

import functools
import json

import mlx.core as mx
import numpy as np

from appliance.api.errors import invalid

# The tool-call and response JSON the model writes: one line, separators as json.dumps
# writes them (and as the chat template renders earlier calls).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@functools.lru_cache(maxsize=4)
def ll_tokenizer(tokenizer, n_vocab: int):
    """llguidance's view of the vocabulary (~20 ms for the embedded model, once)."""
    import llguidance.hf

    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    return llguidance.hf.from_tokenizer(tokenizer._tokenizer, n_vocab=n_vocab, eos_token=eos)


def _styled(schema: dict) -> dict:
    """The schema with our whitespace settings, unless the schema sets its own."""
    return {**schema, "x-guidance": {**JSON_STYLE, **schema.get("x-guidance", {})}}


def json_rule(schema: dict) -> str:
    """A Lark rule body matching JSON valid against `schema`."""
    return "%json " + json.dumps(_styled(schema))


def lark_string(s: str) -> str:
    return json.dumps(s)  # a Lark string literal: JSON's escapes are Lark's


class Grammar:
    """A compiled grammar: `make_processor()` gives a fresh matcher for one row."""

    def __init__(self, matcher, eos: tuple[int, ...], description: str):
        self._pristine, self.eos, self.description = matcher, eos, description

    def make_processor(self) -> GrammarProcessor:
        return GrammarProcessor(self._pristine.deep_copy(), self.eos)

    def __repr__(self) -> str:
        return f"Grammar({self.description})"


def compile_grammar(tokenizer, n_vocab: int, lark: str, param: str, description: str) -> Grammar:
    """Compile `lark` (llguidance's Lark dialect) or refuse it with a 400 naming `param`."""
    import llguidance

    ll_tok = ll_tokenizer(tokenizer, n_vocab)
    matcher = llguidance.LLMatcher(ll_tok,
                                   llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
    if matcher.is_error():
        raise invalid(param, f"the grammar library (llguidance) cannot compile it: "
                             f"{matcher.get_error()}")
    matcher.compute_bitmask()  # builds the first lexer states here, not on the engine thread
    if matcher.is_error():
        raise invalid(param, f"llguidance cannot use it: {matcher.get_error()}")
    return Grammar(matcher, tuple(ll_tok.eos_tokens), description)


class GrammarProcessor:
    """A logits processor `(history, logits) -> logits` that masks what the grammar forbids.

    The history is the row's whole token sequence (prompt, then generated tokens). The
    first call fixes where generation starts; each later call brings the matcher in line with
    the history it is given: tokens it has not seen are consumed, and where the history no
    longer holds tokens the matcher consumed (a rollback, a rejected draft) it rolls back
    first. So calls at several positions of one row, in any order, each see the right mask.
    A token the grammar forbids (a draft the verifier will reject) is not consumed; the
    mask after it allows only end-of-sequence.
    """

    def __init__(self, matcher, eos: tuple[int, ...]):
        self.m, self.eos = matcher, eos
        self.start: int | None = None
        self.fed: list[int] = []  # generated tokens the matcher has consumed, in order

    def _sync(self, history: mx.array) -> bool:
        n = history.size
        if self.start is None:
            self.start = n
        gen = history[self.start:].tolist() if n > self.start else []
        if gen[:len(self.fed)] != self.fed:  # rolled back, or replaced: find where
            same = 0
            while same < min(len(gen), len(self.fed)) and gen[same] == self.fed[same]:
                same += 1
            self.m.rollback(len(self.fed) - same)
            del self.fed[same:]
        new = gen[len(self.fed):]
        if new:
            took = self.m.try_consume_tokens(new)
            self.fed.extend(new[:took])
            return took == len(new) and not self.m.is_error()
        return not self.m.is_error()

    def __call__(self, history: mx.array, logits: mx.array) -> mx.array:
        vocab = logits.shape[-1]
        if self._sync(history):
            bits = np.frombuffer(self.m.compute_bitmask(), dtype=np.uint8)
            allowed = np.unpackbits(bits, bitorder="little")[:vocab].astype(bool)
        else:
            allowed = np.zeros(vocab, dtype=bool)
        if not allowed.any():  # off the grammar (or an error): end the row
            allowed[[t for t in self.eos if t < vocab]] = True
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))
