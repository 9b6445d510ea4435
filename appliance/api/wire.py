"""OpenAI wire shapes: response envelopes, chunks, usage and log-probabilities."""

from __future__ import annotations

import functools
import math

import msgspec

from appliance.api.textgen import Done, Piece
from appliance.api.toolstream import CallArgs, CallStart, ToolCall


def envelope(plan, kind: str, rid: str, created: int) -> dict:
    return {"id": rid, "object": kind, "created": created, "model": plan.model.id,
            "system_fingerprint": plan.fingerprint}


def usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
            "completion_tokens_details": {
                "accepted_prediction_tokens": done.accepted_prediction_tokens,
                "rejected_prediction_tokens": done.rejected_prediction_tokens}}


def sse(obj) -> bytes:
    """One server-sent event (msgspec: json.dumps wrote bare NaN / -Infinity, which no JSON
    parser accepts; log-probabilities are finite by then: `_lp`)."""
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


FLOOR = -9999.0  # OpenAI's log-probability for a token it deems impossible


def _lp(v: float) -> float:
    """A log-probability as OpenAI's schema has it, a number: -inf (a token an extreme
    repetition_penalty ruled out) or NaN becomes FLOOR, not JSON's null."""
    return v if math.isfinite(v) else FLOOR


def _top(top) -> list:
    """The alternatives a grammar or bias left possible (a masked token is not one of the
    most likely: OpenAI allows fewer than asked)."""
    return [(i, v) for i, v in top if v > -math.inf]


@functools.lru_cache(maxsize=4)
def _token_bytes(tokenizer) -> list[bytes] | None:
    """Each token's own bytes, from the vocabulary as mlx-lm's detokenizer reads it: a
    token that holds part of a character decodes to U+FFFD, whose bytes are not its own
    (OpenAI's `bytes` are there to rebuild such characters). None: a vocabulary read
    whole-text only (mlx-lm's naive detokenizer)."""
    names = getattr(tokenizer.detokenizer, "tokenmap", None)
    if not names:
        return None
    if isinstance(names[0], bytes):  # SentencePiece: byte tokens already hold their byte
        return [b.replace("\u2581".encode(), b" ") for b in names]
    # byte-level BPE (GPT-2's table: printable stand-ins for the 256 byte values)
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    stand_in = {chr(b): b for b in printable}
    stand_in.update({chr(256 + n): b for n, b in
                     enumerate(b for b in range(256) if b not in printable)})
    return [b"".join(bytes([stand_in[c]]) if c in stand_in else c.encode() for c in name)
            for name in names]


def tool_call(c: ToolCall) -> dict:
    return {"id": c.id, "type": "function",
            "function": {"name": c.name, "arguments": c.arguments}}


class Chat:
    """chat.completion / chat.completion.chunk."""

    kind, chunk_kind, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def __init__(self, tokenizer, want_logprobs: bool):
        self.tok, self.want = tokenizer, want_logprobs

    def _entry(self, tid: int, lp: float) -> dict:
        text, table = self.tok.decode([tid]), _token_bytes(self.tok)
        raw = table[tid] if table is not None and tid < len(table) else text.encode()
        return {"token": text, "logprob": _lp(lp), "bytes": list(raw)}

    def logprobs(self, pieces: list[Piece]) -> dict | None:
        if not self.want:
            return None
        return {"content": [{**self._entry(t.id, t.logprob),
                             "top_logprobs": [self._entry(i, v) for i, v in _top(t.top)]}
                            for p in pieces for t in p.tokens]}

    def first_chunk(self) -> dict | None:
        return {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    def chunk(self, piece, finish: str | None) -> dict | None:
        """The chunk for a text piece, a tool call's start or argument fragment (as OpenAI
        streams calls), or the finish; None for what adds nothing (a call's end)."""
        if isinstance(piece, CallStart):
            call = {"index": piece.index, "id": piece.id, "type": "function",
                    "function": {"name": piece.name, "arguments": ""}}
        elif isinstance(piece, CallArgs):
            call = {"index": piece.index, "function": {"arguments": piece.text}}
        elif isinstance(piece, ToolCall):
            return None
        if isinstance(piece, CallStart | CallArgs):
            return {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None,
                    "finish_reason": finish}
        return {"index": 0, "delta": {"content": piece.text} if piece else {},
                "logprobs": self.logprobs([piece]) if piece else None, "finish_reason": finish}

    def choice(self, text: str, pieces: list[Piece | ToolCall], finish: str) -> dict:
        calls = [tool_call(p) for p in pieces if isinstance(p, ToolCall) and p.complete]
        message = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        return {"index": 0, "message": message, "finish_reason": finish,
                "logprobs": self.logprobs([p for p in pieces if isinstance(p, Piece)])}


class Completion(Chat):
    """text_completion (same object name for chunks, as OpenAI does)."""

    kind, chunk_kind, id_prefix = "text_completion", "text_completion", "cmpl-"
    at = 0  # characters of text whose tokens' offsets were sent

    def logprobs(self, pieces: list[Piece]) -> dict | None:
        if not self.want:
            return None
        toks = [t for p in pieces for t in p.tokens]
        texts = [self.tok.decode([t.id]) for t in toks]
        offsets = []
        for text in texts:  # each token's start in the completion's text, across chunks
            offsets.append(self.at)
            self.at += len(text)
        return {"tokens": texts, "token_logprobs": [_lp(t.logprob) for t in toks],
                "top_logprobs": [{self.tok.decode([i]): v for i, v in _top(t.top)}
                                 for t in toks],
                "text_offset": offsets}

    def first_chunk(self) -> dict | None:
        return None

    def chunk(self, piece: Piece | None, finish: str | None) -> dict | None:
        return {"index": 0, "text": piece.text if piece else "",
                "logprobs": self.logprobs([piece]) if piece else None, "finish_reason": finish}

    def choice(self, text: str, pieces: list[Piece], finish: str) -> dict:
        return {"index": 0, "text": text, "logprobs": self.logprobs(pieces),
                "finish_reason": finish}
