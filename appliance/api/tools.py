"""Tool calling: checking `tools` / `tool_choice`, the grammar a forced call decodes under,
and the tool calls parsed out of the generated text.

The markup and the parser are mlx-lm's own, chosen from the chat template as
`mlx_lm.server` does (`TokenizerWrapper.tool_call_start/_end/tool_parser`). A forced call
(`tool_choice` required or a named function) is decoded under a grammar, which needs the
JSON call format (mlx-lm's `json_tools` parser, the Hermes style of the embedded model).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field

from appliance.api.errors import invalid
from appliance.api.grammar import json_rule, lark_string

log = logging.getLogger("appliance.api")
NL = "\n"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON string, as OpenAI sends it


@dataclass(frozen=True)
class ToolFormat:
    """How this model writes tool calls, and what may be parsed out of one request's text."""

    start: str
    end: str
    parser: object  # mlx-lm's parse_tool_call(text, tools) -> dict | list[dict]
    tools: list = field(default_factory=list)
    max_calls: int | None = None  # 1 with parallel_tool_calls=false


def check_tools(tools, param: str = "tools") -> list[dict]:
    """OpenAI `tools`: function tools with a name; returns them unchanged."""
    if not isinstance(tools, list):
        raise invalid(param, "must be a list of tools")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise invalid(f"{param}[{i}].type", "only 'function' tools are supported")
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid(f"{param}[{i}].function.name", "every function needs a name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid(f"{param}[{i}].function.parameters", "must be a JSON schema object")
    return tools


def tool_format(tokenizer, param: str = "tools") -> ToolFormat:
    """The model's tool-call markup and parser, or a 400: a model whose chat template has no
    tool-call format cannot be asked for tool calls."""
    if not getattr(tokenizer, "has_tool_calling", False):
        raise invalid(param, "this model's chat template has no tool-call format (mlx-lm "
                             "finds no tool parser for it)")
    return ToolFormat(tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser)


def chosen(tools: list[dict], tool_choice, param: str = "tool_choice") -> tuple[str, list[dict]]:
    """('none' | 'auto' | 'required', the tools a call may use)."""
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return tool_choice or "auto", tools
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        named = [t for t in tools if t["function"]["name"] == name]
        if not named:
            raise invalid(param, f"names function {name!r}, which is not in tools")
        return "required", named
    raise invalid(param, "must be 'none', 'auto', 'required' or "
                         "{'type': 'function', 'function': {'name': ...}}")


def call_schema(tool: dict) -> dict:
    fn = tool["function"]
    return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                             "arguments": fn.get("parameters") or
                                             {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def calls_lark(fmt: ToolFormat, tools: list[dict], max_calls: int | None) -> str:
    """Lark rules for `calls`: one call (or several, newline-separated) of these tools, each
    `start {"name": ..., "arguments": {...}} end` with the arguments valid for its function."""
    if fmt.parser.__module__.rsplit(".", 1)[-1] != "json_tools":
        raise invalid("tool_choice", "forcing a tool call needs the JSON tool-call format "
                                     f"(mlx-lm's json_tools parser); this model's is "
                                     f"{fmt.parser.__module__.rsplit('.', 1)[-1]}")
    alts = " | ".join(f"call_{i}" for i in range(len(tools)))
    more = "" if max_calls == 1 else f" ({lark_string(NL)} call)*"
    rules = [f"calls: call{more}",
             f"call: {lark_string(fmt.start + NL)} ({alts}) {lark_string(NL + fmt.end)}"]
    rules += [f"call_{i}: {json_rule(call_schema(t))}" for i, t in enumerate(tools)]
    return "\n".join(rules)


def message_tool_calls(calls, param: str) -> list[dict]:
    """An assistant message's tool_calls for the chat template: arguments as objects (as
    mlx-lm's server passes them; templates render them with tojson)."""
    if not isinstance(calls, list):
        raise invalid(param, "must be a list")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"{param}[{j}].function", "needs a name and arguments")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise invalid(f"{param}[{j}].function.arguments", f"is not JSON: {e}") from e
        out.append({**c, "function": {**fn, "arguments": args if args is not None else {}}})
    return out


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallSplitter:
    """Separates generated text into content and tool calls, as the text streams in.

    Text that may be the beginning of the start markup is held back until it is known not
    to be; a call is released once its end markup arrives (or at the end of generation).
    Markup never reaches the content. A complete call the parser rejects (not JSON) is
    returned as content, markup included, rather than dropped.
    """

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self.buf, self.in_call, self.calls, self.ws = "", False, 0, ""

    @property
    def done(self) -> bool:
        return self.fmt.max_calls is not None and self.calls >= self.fmt.max_calls

    def feed(self, text: str) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        self.buf += text
        start, end = self.fmt.start, self.fmt.end
        while not self.done:
            if not self.in_call:
                i = self.buf.find(start)
                if i < 0:
                    keep = next((k for k in range(min(len(start) - 1, len(self.buf)), 0, -1)
                                 if self.buf.endswith(start[:k])), 0)
                    self._content(out, self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                self._content(out, self.buf[:i])
                self.buf, self.in_call = self.buf[i + len(start):], True
            else:
                j = self.buf.find(end)
                if j < 0:
                    break
                body, self.buf, self.in_call = self.buf[:j], self.buf[j + len(end):], False
                out.extend(self._parse(body, start + body + end))
        return out

    def finish(self) -> list[str | ToolCall]:
        """At the end of generation: what is still held back. A call still open parses if
        it can (the end markup is optional before end-of-sequence); one cut off mid-way
        (max_tokens) is dropped, as mlx-lm's server drops it: the finish reason says so."""
        out: list[str | ToolCall] = []
        if self.in_call and not self.done:
            parsed = self._parse(self.buf, "")
            out.extend(p for p in parsed if p)
            if not any(parsed):
                log.warning("dropped a tool call cut off mid-way: %r", self.buf[:200])
        elif not self.done:
            self._content(out, self.buf)
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

    def _parse(self, body: str, raw: str) -> list[str | ToolCall]:
        try:
            parsed = self.fmt.parser(body, self.fmt.tools)
            items = parsed if isinstance(parsed, list) else [parsed]
            calls = []
            for p in items:
                args = p["arguments"]
                calls.append(ToolCall(p.get("id") or new_call_id(), str(p["name"]),
                                      args if isinstance(args, str)
                                      else json.dumps(args, ensure_ascii=False)))
        except (ValueError, KeyError, TypeError, AttributeError):
            return [raw]
        if self.fmt.max_calls is not None:
            calls = calls[:self.fmt.max_calls - self.calls]
        self.calls += len(calls)
        return calls
