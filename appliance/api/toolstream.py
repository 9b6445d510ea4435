"""Tool calls parsed out of generated text as it streams: content, and each call as a start
(id, name), argument fragments and the complete call.

OpenAI streams a call as deltas: the first carries the id and the name, later ones pieces of
the arguments' JSON. Here the arguments are released as the model writes them wherever the
call is JSON with the name first (mlx-lm's json_tools format, `{"name": ..., "arguments":
{...}}`: Hermes, Qwen, the embedded model): what is released is the arguments' text up to a
possible closing brace of the call object, and the fragments joined are the call's
`arguments`. For any other format the call is parsed by mlx-lm's parser once its end markup
arrives and released whole (one start, one fragment). Markup never reaches the content.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass

from appliance.api.tools import ToolFormat, parser_name

log = logging.getLogger("appliance.api")

# `{"name": "<name>", "arguments": ` before an object: the head of a JSON call
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')
_TAIL = re.compile(r"\s*\}?\s*$")  # may close the call object: held back until more arrives


@dataclass(frozen=True)
class CallStart:
    index: int  # the call's position among this response's calls
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str  # the next piece of the arguments' JSON


@dataclass(frozen=True)
class ToolCall:
    """A call once it has ended (after its start and fragments): `arguments` is the JSON
    string the fragments make. `complete` is False for a call whose arguments were streamed
    but that mlx-lm's parser then rejects: one cut off by max_tokens (the finish reason
    says so) or malformed. A stream has shown it; a whole response leaves it out, as
    mlx-lm's server does, rather than hand an agent arguments that are not JSON."""

    id: str
    name: str
    arguments: str
    index: int = 0
    complete: bool = True


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def partial(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    return next((k for k in range(min(len(marker) - 1, len(text)), 0, -1)
                 if text.endswith(marker[:k])), 0)


class ToolCallSplitter:
    """Separates generated text into content and tool calls, as the text streams in.

    Text that may be the beginning of the start markup is held back until it is known not
    to be. A complete call the parser rejects before anything of it was released (not JSON)
    is returned as content, markup included, rather than dropped.
    """

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self.incremental = parser_name(fmt) == "json_tools"
        self.buf, self.in_call, self.calls, self.ws = "", False, 0, ""
        self.head: tuple[str, str, int] | None = None  # id, name, where arguments begin
        self.sent = 0  # characters of the current call's arguments released

    @property
    def done(self) -> bool:
        return self.fmt.max_calls is not None and self.calls >= self.fmt.max_calls

    def feed(self, text: str) -> list:
        out: list = []
        self.buf += text
        start, end = self.fmt.start, self.fmt.end
        while not self.done:
            if not self.in_call:
                i = self.buf.find(start)
                if i < 0:
                    keep = partial(self.buf, start)
                    self._content(out, self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                self._content(out, self.buf[:i])
                self.buf, self.in_call = self.buf[i + len(start):], True
                self.head, self.sent = None, 0
            else:
                j = self.buf.find(end)
                if j < 0:
                    self._stream(out, self.buf[:len(self.buf) - partial(self.buf, end)])
                    break
                body, self.buf, self.in_call = self.buf[:j], self.buf[j + len(end):], False
                self._close(out, body, start + body + end)
        return out

    def finish(self) -> list:
        """At the end of generation: what is still held back. A call still open is released
        if it parses (the end markup is optional before end-of-sequence), or if it started
        streaming (then incomplete unless it parses); one cut off before its name was known
        is dropped, as mlx-lm's server drops it: the finish reason says so. So is the start
        markup of a call after another, cut off, and of a forced call (then it is markup)."""
        out: list = []
        if self.in_call and not self.done:
            body = self.buf[:len(self.buf) - partial(self.buf, self.fmt.end)]
            if not self._close(out, body, None):  # (max_tokens: the finish reason says so)
                log.debug("dropped a tool call cut off mid-way: %r", self.buf[:200])
        elif not self.done and not self.calls and not self.fmt.forced:
            self._content(out, self.buf)  # held as a possible start; with no call, prose
        elif self.buf and not self.done:  # a forced call's start, or another's after a
            log.debug("dropped a tool call's start cut off: %r", self.buf)  # call: dropped
        self.buf, self.in_call = "", False
        return out

    def _content(self, out: list, text: str) -> None:
        if not text:
            return
        if self.calls and not text.strip():  # whitespace between calls: held, not content
            self.ws += text
            return
        out.append(self.ws + text if self.calls else text)
        self.ws = ""

    def _stream(self, out: list, body: str) -> None:
        """Release what is known of the open call: its start once the name is, then its
        arguments up to a possible closing brace of the call object."""
        if not self.incremental:
            return
        if self.head is None:
            m = _HEAD.match(body)
            if m is None:
                return
            try:
                name = json.loads(m.group(1))
            except ValueError:
                return
            self.head = (new_call_id(), name, m.end())
            out.append(CallStart(self.calls, self.head[0], name))
        args = body[self.head[2]:]
        upto = _TAIL.search(args).start()
        if upto > self.sent:
            out.append(CallArgs(self.calls, args[self.sent:upto]))
            self.sent = upto

    def _close(self, out: list, body: str, raw: str | None) -> bool:
        """The call in `body` has ended: release it. False if nothing could be made of it."""
        self._stream(out, body)
        if self.head is not None:
            cid, name, at = self.head
            args = body[at:]
            args = args[:_TAIL.search(args).start()]
            self.head = None
            try:
                self.fmt.parser(body, self.fmt.tools)
                complete = True
            except (ValueError, KeyError, TypeError, AttributeError):
                if raw is None:  # the generation ended inside it (max_tokens): said by the
                    log.debug("a tool call cut off: %r", body[:200])  # finish reason
                else:
                    log.warning("a malformed tool call (its arguments were streamed): %r",
                                body[:200])
                complete = False
            out.append(ToolCall(cid, name, args, self.calls, complete))
            self.calls += 1
            return True
        try:
            parsed = self.fmt.parser(body, self.fmt.tools)
            items = parsed if isinstance(parsed, list) else [parsed]
            calls = []
            for p in items:
                args = p["arguments"]
                calls.append((p.get("id") or new_call_id(), str(p["name"]),
                              args if isinstance(args, str)
                              else json.dumps(args, ensure_ascii=False)))
        except (ValueError, KeyError, TypeError, AttributeError):
            if raw:
                out.append(raw)
            return False
        if self.fmt.max_calls is not None:
            calls = calls[:self.fmt.max_calls - self.calls]
        for cid, name, args in calls:
            out += [CallStart(self.calls, cid, name), CallArgs(self.calls, args),
                    ToolCall(cid, name, args, self.calls)]
            self.calls += 1
        return bool(calls)
